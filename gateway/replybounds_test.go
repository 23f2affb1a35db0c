package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// TestRouterBoundsBufferedFrames: while a call's waiter is busy (its
// client reads slowly), the frames buffered for it stay bounded however
// many keepalive, progress and output frames its agent sends; the result
// that follows still arrives.
func TestRouterBoundsBufferedFrames(t *testing.T) {
	ns := startNATS(t, 0)
	r, _ := newTestRouter(t, ns, "web-1", 5*time.Second)
	fa := newFakeAgent(t, ns, "web-1")
	release := make(chan struct{})
	seen := 0
	done := make(chan callOutcome, 1)
	go func() {
		res, err := r.call(context.Background(), bashCall("web-1", "flood"), func(protocol.Frame) {
			if seen++; seen == 1 {
				<-release // the first frame blocks the waiter
			}
		})
		done <- callOutcome{res: res, err: err}
	}()
	rc := recv(t, fa.calls, "call")
	id := rc.call.ID
	const n = 3 * maxPendingFrames
	for i := range n {
		kind := []protocol.FrameKind{protocol.KindKeepalive, protocol.KindProgress, protocol.KindOutput}[i%3]
		fa.send(t, rc.reply, protocol.Frame{Kind: kind, CallID: id, Seq: uint64(i + 1), Data: []byte("x")})
	}
	big := protocol.Frame{Kind: protocol.KindOutput, CallID: id, Seq: n + 1, Data: make([]byte, 512<<10)}
	bigs := 2 * maxPendingOutput / len(big.Data)
	for range bigs {
		fa.send(t, rc.reply, big)
	}
	// A frame of another call marks the end: once it is delivered, the
	// router has handled every frame before it.
	fa.send(t, rc.reply, protocol.Frame{Kind: protocol.KindKeepalive, CallID: "marker", Seq: 1})
	waitUntil(t, "the router to take in the flood", func() bool {
		d, _ := r.sub.Delivered()
		return d >= int64(n+bigs+1)
	})
	r.mu.Lock()
	fl := r.calls[id]
	r.mu.Unlock()
	fl.mu.Lock()
	buffered, bytes := len(fl.frames), fl.pendingBytes
	fl.mu.Unlock()
	if buffered > maxPendingFrames || bytes > maxPendingOutput {
		t.Errorf("%d frames, %d bytes buffered for one call; want at most %d and %d", buffered, bytes, maxPendingFrames, maxPendingOutput)
	}
	fa.sendResult(t, rc.reply, &protocol.Result{CallID: id, Content: []protocol.Content{protocol.Text("done")}})
	close(release)
	out := recv(t, done, "call result")
	if out.err != nil {
		t.Fatal(out.err)
	}
	wantText(t, out.res, "done")
}

func TestCapResult(t *testing.T) {
	text := func(n int) protocol.Content { return protocol.Text(strings.Repeat("t", n)) }
	img := protocol.Content{Type: "image", Data: make([]byte, 1<<20), MIMEType: "image/png"}
	tests := []struct {
		name      string
		res       protocol.Result
		limit     int
		cut       bool
		wantText  int    // bytes of text before any note
		wantNote  string // in the note
		structure bool   // structured content kept
	}{
		{name: "within", res: protocol.Result{Content: []protocol.Content{text(100)}, Structured: json.RawMessage(`{}`)}, limit: 100, wantText: 100, structure: true},
		{name: "text over", res: protocol.Result{Content: []protocol.Content{text(150)}}, limit: 100, cut: true, wantText: 100, wantNote: "150 bytes of text, more than the 100 a bash result"},
		{name: "several items over", res: protocol.Result{Content: []protocol.Content{text(60), img, text(60), text(60)}}, limit: 100, cut: true, wantText: 100, wantNote: "180 bytes of text"},
		{name: "structured over", res: protocol.Result{Content: []protocol.Content{text(10)}, Structured: json.RawMessage(`{"x":"` + strings.Repeat("s", 200) + `"}`)}, limit: 100, cut: true, wantText: 10, wantNote: "structured content"},
		{name: "images alone are not text", res: protocol.Result{Content: []protocol.Content{img}}, limit: 100},
		{name: "error message", res: protocol.Result{Error: &protocol.Error{Code: protocol.CodeInternal, Message: strings.Repeat("e", 1<<20)}}, limit: 100, cut: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res := tc.res
			res.Content = append([]protocol.Content(nil), tc.res.Content...)
			if got := capResult("web-1", "bash", &res, tc.limit); got != tc.cut {
				t.Errorf("capResult = %v, want %v", got, tc.cut)
			}
			if res.Error != nil {
				if len(res.Error.Message) > protocol.MaxErrorMessage+100 {
					t.Errorf("error message of %d bytes", len(res.Error.Message))
				}
				return
			}
			var shown, images int
			note := ""
			for _, c := range res.Content {
				switch {
				case c.Type == "image":
					images++
				case strings.Contains(c.Text, "[The fleet gateway received"):
					note = c.Text
				default:
					shown += len(c.Text)
				}
			}
			if shown != tc.wantText {
				t.Errorf("%d bytes of text shown, want %d", shown, tc.wantText)
			}
			if tc.wantNote == "" && note != "" || !strings.Contains(note, tc.wantNote) || tc.wantNote != "" && !strings.Contains(note, "web-1") {
				t.Errorf("note = %q, want one with %q", note, tc.wantNote)
			}
			if (res.Structured != nil) != tc.structure {
				t.Errorf("structured content kept = %v, want %v", res.Structured != nil, tc.structure)
			}
			for _, c := range tc.res.Content {
				if c.Type == "image" {
					images--
				}
			}
			if images != 0 {
				t.Error("image content was lost")
			}
		})
	}
	for tool, want := range map[string]int{"bash": protocol.MaxShortResultText, "read": protocol.MaxShortResultText, "list": protocol.MaxResultText, "skill": protocol.MaxResultText} {
		if got := protocol.ResultTextLimit(tool, false); got != want {
			t.Errorf("ResultTextLimit(%s) = %d, want %d", tool, got, want)
		}
	}
	if protocol.ResultTextLimit("read", true) != protocol.MaxResultBytes {
		t.Error("binary_base64 reads are bounded by the result limit alone")
	}
}

// TestRouterLargeResultWaitsForRoom: a large result that finds the
// transfer budget full is dropped, waited for, and fetched again from the
// agent once there is room; with no room within the wait, the call fails
// as busy, naming the flag. Either way the call gives its room back.
func TestRouterLargeResultWaitsForRoom(t *testing.T) {
	for _, room := range []bool{true, false} {
		t.Run(fmt.Sprintf("room=%v", room), func(t *testing.T) {
			ns := startNATS(t, 0)
			// Silence never ends the call, however slow the machine.
			r, _ := newTestRouter(t, ns, "web-1", time.Minute)
			// With room, the wait outlasts a loaded machine: the room is
			// given back as soon as the result was dropped.
			r.transfers = newTransfers(16<<20, time.Minute)
			if !room {
				r.transfers.wait = 200 * time.Millisecond
			}
			if err := r.transfers.acquire(context.Background(), 12<<20); err != nil {
				t.Fatal(err)
			}
			fa := newFakeAgent(t, ns, "web-1")
			done := startCall(context.Background(), r, bashCall("web-1", "cat big"), nil)
			rc := recv(t, fa.calls, "call")
			text := bigText(8 << 20)
			frames := resultFrames(t, "web-1", &protocol.Result{CallID: rc.call.ID, Content: []protocol.Content{protocol.Text(text)}}, protocol.ChunkSize, 0)
			for _, f := range frames {
				fa.send(t, rc.reply, f)
			}
			if room {
				waitUntil(t, "the waiter to drop the result", func() bool {
					r.mu.Lock()
					fl := r.calls[rc.call.ID]
					r.mu.Unlock()
					if fl == nil {
						out := recv(t, done, "call result")
						t.Fatalf("the call ended before its result waited for room: %v", out.err)
					}
					fl.mu.Lock()
					defer fl.mu.Unlock()
					return fl.discard
				})
				r.transfers.release(12 << 20)
				fetch := recv(t, fa.fetches, "fetch once there is room")
				for _, f := range frames {
					fa.send(t, fetch.reply, f)
				}
				out := recv(t, done, "call result")
				if out.err != nil {
					t.Fatal(out.err)
				}
				wantText(t, out.res, text)
			} else {
				out := recv(t, done, "call result")
				wantHostError(t, out.err, HostBusy, "--max_transfer_mib", "the result of bash on web-1")
				r.transfers.release(12 << 20)
			}
			if n := r.transfers.inUse.Load(); n != 0 {
				t.Errorf("%d bytes of the budget still held after the call", n)
			}
		})
	}
}
