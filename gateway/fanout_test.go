package gateway

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/fleetmcp/fleetmcp/protocol"
)

func TestSplitStatus(t *testing.T) {
	tests := []struct{ text, body, status string }{
		{"hello\n", "hello\n", ""},
		{"(no output)\n\nCommand exited with code 3", "(no output)", "Command exited with code 3"},
		{"x\n\nCommand timed out after 5 seconds", "x", "Command timed out after 5 seconds"},
		{"a\n\nb\n\nCommand was killed by signal SIGKILL", "a\n\nb", "Command was killed by signal SIGKILL"},
		{"Command exited with code 1", "", "Command exited with code 1"},
		// Output that merely mentions a status is output.
		{"log:\n\nCommand exited with code 1\nmore", "log:\n\nCommand exited with code 1\nmore", ""},
		{"", "", ""},
	}
	for _, tc := range tests {
		body, status := splitStatus(tc.text)
		if body != tc.body || status != tc.status {
			t.Errorf("splitStatus(%q) = %q, %q; want %q, %q", tc.text, body, status, tc.body, tc.status)
		}
	}
}

func TestSplitSpillNote(t *testing.T) {
	tests := []struct{ in, body, path string }{
		{"tail\n\n[Showing lines 3-2002 of 2002. Full output: /s/output/c1.log]", "tail", "/s/output/c1.log"},
		{"tail\n\n[Showing last 50KB of line 1 (line is 2.0MB). Full output: /a b/c.log]", "tail", "/a b/c.log"},
		{"tail\n\n[Showing lines 1-9 of 9. Full output could not be saved: disk full]", "tail\n\n[Showing lines 1-9 of 9. Full output could not be saved: disk full]", ""},
		{"plain output]", "plain output]", ""},
	}
	for _, tc := range tests {
		body, path := splitSpillNote(tc.in)
		if body != tc.body || path != tc.path {
			t.Errorf("splitSpillNote(%q) = %q, %q; want %q, %q", tc.in, body, path, tc.body, tc.path)
		}
	}
}

func TestClassify(t *testing.T) {
	text := func(s string, isErr bool) *protocol.Result {
		return &protocol.Result{Content: []protocol.Content{protocol.Text(s)}, IsError: isErr}
	}
	sum := sha256.Sum256([]byte("x"))
	hash := hex.EncodeToString(sum[:])
	tests := []struct {
		name     string
		classify classifyFunc
		res      *protocol.Result
		err      error
		status   string
		exit     int // -1: none
		sha      string
		full     string
	}{
		{"ok", classifyBash, text("hi\n", false), nil, bucketSucceeded, 0, "", ""},
		{"exit", classifyBash, text("boom\n\nCommand exited with code 2", true), nil, bucketFailed, 2, "", ""},
		{"timeout", classifyBash, text("(no output)\n\nCommand timed out after 1 second", true), nil, bucketTimedOut, -1, "", ""},
		{"signal", classifyBash, text("(no output)\n\nCommand was killed by signal SIGKILL", true), nil, bucketFailed, -1, "", ""},
		{"spilled", classifyBash, text("end\n\n[Showing lines 5-2004 of 2004. Full output: /st/output/c9.log]\n\nCommand exited with code 1", true), nil,
			bucketFailed, 1, "", "/st/output/c9.log"},
		{"policy", classifyBash, protocol.ErrorResult("c", protocol.CodeDenied, "command rm refused"), nil, bucketDenied, -1, "", ""},
		{"busy", classifyBash, protocol.ErrorResult("c", protocol.CodeBusy, "busy"), nil, bucketFailed, -1, "", ""},
		{"offline", classifyBash, nil, &HostError{Kind: HostOffline, Msg: "offline"}, bucketOffline, -1, "", ""},
		{"gone", classifyBash, nil, &HostError{Kind: HostGone, Msg: "gone"}, bucketOffline, -1, "", ""},
		{"silent", classifyBash, nil, &HostError{Kind: HostSilent, Msg: "went silent"}, bucketFailed, -1, "", ""},
		{"deadline", classifyBash, nil, &HostError{Kind: HostTimeout, Msg: "late"}, bucketTimedOut, -1, "", ""},
		{"cancelled", classifyBash, nil, context.Canceled, bucketFailed, -1, "", ""},
		{"read sha", classifyRead, &protocol.Result{Content: []protocol.Content{protocol.Text("x")}, Structured: json.RawMessage(`{"sha256":"` + strings.ToUpper(hash) + `"}`)}, nil,
			bucketSucceeded, -1, hash, ""},
		{"read no sha", classifyRead, text("x", false), nil, bucketSucceeded, -1, "", ""},
		{"read bad sha", classifyRead, &protocol.Result{Content: []protocol.Content{protocol.Text("x")}, Structured: json.RawMessage(`{"sha256":"abc"}`)}, nil,
			bucketSucceeded, -1, "", ""},
		{"read missing", classifyRead, text("/x: no such file", true), nil, bucketFailed, -1, "", ""},
	}
	for _, tc := range tests {
		var o hostOutcome
		tc.classify(&o, tc.res, tc.err)
		exit := -1
		if o.ExitCode != nil {
			exit = *o.ExitCode
		}
		if o.Status != tc.status || exit != tc.exit || o.SHA256 != tc.sha || o.FullOutput != tc.full {
			t.Errorf("%s: status %s exit %d sha %q full %q; want %s %d %q %q", tc.name, o.Status, exit, o.SHA256, o.FullOutput, tc.status, tc.exit, tc.sha, tc.full)
		}
		if o.Status != bucketSucceeded && o.Reason == "" {
			t.Errorf("%s: no reason for %s", tc.name, o.Status)
		}
	}
}

func TestCompressNames(t *testing.T) {
	tests := []struct {
		names []string
		max   int
		want  string
	}{
		{[]string{"web-3", "web-1", "web-2", "db"}, 100, "db, web-1..web-3"},
		{[]string{"web-10", "web-9", "web-8", "web-1"}, 100, "web-1, web-8..web-10"},
		{[]string{"h001", "h002", "h01"}, 100, "h01, h001, h002"},
		{[]string{"a1", "a2", "b", "c", "d"}, 100, "a1, a2, b, c, d"},
		{[]string{"alpha", "beta", "gamma", "delta"}, 14, "alpha, beta, … 2 more"},
		{[]string{"n0001", "n0002", "n0003", "n0005"}, 100, "n0001..n0003, n0005"},
	}
	for _, tc := range tests {
		if got := compressNames(tc.names, tc.max); got != tc.want {
			t.Errorf("compressNames(%v, %d) = %q, want %q", tc.names, tc.max, got, tc.want)
		}
	}
}

// outcomes makes n hosts: every 50th failed with its own output, the rest
// succeeded with the same output; each output is size bytes.
func outcomes(n, size int) []hostOutcome {
	out := make([]hostOutcome, n)
	line := strings.Repeat("x", 99) + "\n"
	for i := range out {
		o := &out[i]
		o.Host = fmt.Sprintf("web-%05d", i)
		body := strings.Repeat(line, size/100)
		if i%50 == 7 {
			exit := 1
			o.Status, o.ExitCode, o.note, o.Reason = bucketFailed, &exit, "exit 1", "Command exited with code 1"
			o.body = fmt.Sprintf("error on %s\n", o.Host) + body
		} else {
			zero := 0
			o.Status, o.ExitCode, o.note, o.body = bucketSucceeded, &zero, "exit 0", body
		}
		o.Bytes = len(o.body)
	}
	return out
}

// The text stays within the budget however many hosts there are, failed
// groups come first, and each tail shrinks as the groups grow in number.
func TestRenderBudget(t *testing.T) {
	lastTail := fanoutBudget + 1
	for _, n := range []int{1, 8, 60, 500, 10000} {
		res := renderFanout(toolFleetBash, `fleet_bash "x"`, "*", outcomes(n, 10<<10), time.Second)
		text := res.Content[0].(*mcp.TextContent).Text
		if len(text) > fanoutBudget {
			t.Errorf("%d hosts: text is %d bytes, over the %d budget", n, len(text), fanoutBudget)
		}
		failed := (n + 42) / 50
		summary := fmt.Sprintf("%d succeeded, %d failed, 0 timed_out, 0 offline, 0 denied, 0 not_started", n-failed, failed)
		if !strings.Contains(strings.SplitN(text, "\n", 2)[0], summary) {
			t.Errorf("%d hosts: summary line %q lacks %q", n, strings.SplitN(text, "\n", 2)[0], summary)
		}
		if failed > 0 && strings.Index(text, "--- failed") > strings.Index(text, "--- succeeded") {
			t.Errorf("%d hosts: succeeded group shown before the failed ones", n)
		}
		if res.IsError != (failed > 0) {
			t.Errorf("%d hosts: IsError %v with %d failed", n, res.IsError, failed)
		}
		// The tail of the first group shown.
		_, rest, _ := strings.Cut(text, " ---\n")
		tail, _, _ := strings.Cut(rest, "\n---")
		if n >= 8 && len(tail) > lastTail {
			t.Errorf("%d hosts: tail of %d bytes is longer than with fewer hosts (%d)", n, len(tail), lastTail)
		}
		if n >= 8 {
			lastTail = len(tail)
		}
		if n == 10000 && len(tail) > 1024 {
			t.Errorf("%d hosts: a tail of %d bytes did not shrink", n, len(tail))
		}
		if n >= 500 && !strings.Contains(text, "not shown") && !strings.Contains(text, "shown]") {
			t.Errorf("%d hosts: nothing says what was left out", n)
		}
		sc := res.StructuredContent.(fanoutResult)
		if len(sc.Hosts) != n || sc.Counts[bucketFailed] != failed {
			t.Errorf("%d hosts: structured content has %d hosts, %d failed", n, len(sc.Hosts), sc.Counts[bucketFailed])
		}
	}
}

func TestRenderReadVersions(t *testing.T) {
	mk := func(host, sha, body string) hostOutcome {
		return hostOutcome{Host: host, Status: bucketSucceeded, SHA256: sha, body: body, Bytes: len(body)}
	}
	a, b := strings.Repeat("a", 64), strings.Repeat("b", 64)
	outs := []hostOutcome{
		mk("web-1", a, "conf A"), mk("web-2", a, "conf A"), mk("web-3", a, "conf A"),
		mk("web-4", b, "conf B"),
		mk("old-1", "", "conf A"), mk("old-2", "", "conf A"), mk("old-3", "", "conf C"),
		{Host: "web-5", Status: bucketFailed, note: "/etc/x: no such file", Reason: "/etc/x: no such file"},
	}
	res := renderFanout(toolFleetRead, "fleet_read /etc/x", "*", outs, time.Second)
	text := res.Content[0].(*mcp.TextContent).Text
	for _, want := range []string{
		"4 distinct versions: aaaaaaaaaaaa on 3 hosts, sha256 unknown on 2 hosts, sha256 unknown on 1 host, bbbbbbbbbbbb on 1 host",
		"--- version 1 of 4: sha256 " + a + " — 3 hosts: web-1..web-3 ---\nconf A\n",
		"--- version 2 of 4: sha256 unknown (not reported by the host; same text) — 2 hosts: old-1, old-2 ---\nconf A\n",
		"--- failed, /etc/x: no such file — 1 host: web-5",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("text lacks %q:\n%s", want, text)
		}
	}
	if strings.Count(text, "conf A") != 2 {
		t.Errorf("content shown %d times, want once per version:\n%s", strings.Count(text, "conf A"), text)
	}
	sc := res.StructuredContent.(fanoutResult)
	if len(sc.Versions) != 4 || sc.Versions[0].SHA256 != a || sc.Versions[0].Hosts != 3 {
		t.Errorf("versions %+v", sc.Versions)
	}
}

// FuzzRenderFanout: whatever hosts answer, the text stays within the
// budget and valid UTF-8 output stays valid UTF-8.
func FuzzRenderFanout(f *testing.F) {
	f.Add([]byte("hello\nworld\n"), uint16(3), uint16(200))
	f.Add([]byte("héllo wörld ✓\n"), uint16(2000), uint16(60000))
	f.Add([]byte{0xff, 0xfe, '\n'}, uint16(1), uint16(1))
	f.Fuzz(func(t *testing.T, chunk []byte, hosts, size uint16) {
		n := int(hosts%600) + 1
		outs := make([]hostOutcome, n)
		for i := range outs {
			var body strings.Builder
			for body.Len() < int(size%8192)*(i%3) {
				body.Write(chunk)
				if len(chunk) == 0 {
					break
				}
			}
			outs[i] = hostOutcome{Host: fmt.Sprintf("h%d", i), Status: buckets()[i%len(buckets())], note: strings.ToValidUTF8(string(chunk[:min(len(chunk), 20)]), ""), body: body.String()}
			if i%7 == 0 {
				outs[i].body = string(chunk) + outs[i].body
			}
		}
		for _, tool := range []string{toolFleetBash, toolFleetRead} {
			res := renderFanout(tool, "x", "*", outs, time.Second)
			text := res.Content[0].(*mcp.TextContent).Text
			if len(text) > fanoutBudget {
				t.Fatalf("%s: %d bytes over budget", tool, len(text))
			}
			if utf8.Valid(chunk) && !utf8.ValidString(text) {
				t.Fatalf("%s: valid input rendered as invalid UTF-8", tool)
			}
		}
	})
}

// FuzzClassifyBash: whatever text an agent's bash result holds, the
// classification never panics, every host lands in a bucket with a reason
// unless it succeeded, and the output it keeps is part of the text.
func FuzzClassifyBash(f *testing.F) {
	f.Add("out\n\nCommand exited with code 7", true)
	f.Add("x\n\n[Showing lines 1-2 of 9. Full output: /p.log]\n\nCommand timed out after 2 seconds", true)
	f.Add("\n\n", true)
	f.Add("{}", false)
	f.Fuzz(func(t *testing.T, text string, isErr bool) {
		var o hostOutcome
		classifyBash(&o, &protocol.Result{Content: []protocol.Content{protocol.Text(text)}, IsError: isErr}, nil)
		switch {
		case o.Status == "":
			t.Fatalf("%q: no bucket", text)
		case o.Status != bucketSucceeded && o.Reason == "" && o.note == "":
			t.Fatalf("%q: %s without a reason", text, o.Status)
		case !strings.HasPrefix(text, o.body):
			t.Fatalf("%q: kept output %q is not the start of the text", text, o.body)
		case isErr == (o.Status == bucketSucceeded):
			t.Fatalf("%q (error %v): bucket %s", text, isErr, o.Status)
		}
	})
}

// Hosts that each print their own short line are listed one line each
// under one header per outcome.
func TestRenderOneLiners(t *testing.T) {
	var outs []hostOutcome
	for i := range 5 {
		zero, two := 0, 2
		o := hostOutcome{Host: fmt.Sprintf("db-%d", i), Status: bucketSucceeded, ExitCode: &zero, note: "exit 0", body: fmt.Sprintf("v1.%d\n", i)}
		if i == 4 {
			o.Status, o.ExitCode, o.note, o.body = bucketFailed, &two, "exit 2", "oops\n"
		}
		outs = append(outs, o)
	}
	text := renderFanout(toolFleetBash, `fleet_bash "v"`, "db-*", outs, time.Second).Content[0].(*mcp.TextContent).Text
	want := "--- failed, exit 2 — 1 host: db-4 ---\noops\n" +
		"--- succeeded, exit 0 — 4 hosts, each its own output (host: output) ---\ndb-0: v1.0\ndb-1: v1.1\ndb-2: v1.2\ndb-3: v1.3\n"
	if _, rest, _ := strings.Cut(text, "\n"); rest != want {
		t.Errorf("got:\n%s\nwant:\n%s", rest, want)
	}
}

// A host whose policy refused the call is said to be denied once: the
// header names the bucket, the policy, the host and then only the rule.
func TestRenderDeniedOnce(t *testing.T) {
	o := hostOutcome{Host: "web-1"}
	classifyAgentError(&o, protocol.ErrorResult("c", protocol.CodeDenied, "denied by host policy: command rm is not in bash.allow"))
	zero := 0
	ok := hostOutcome{Host: "web-2", Status: bucketSucceeded, ExitCode: &zero, note: "exit 0", body: "fine\n"}
	text := renderFanout(toolFleetBash, `fleet_bash "rm x"`, "web-*", []hostOutcome{o, ok}, time.Second).Content[0].(*mcp.TextContent).Text
	want := "--- denied, by host policy — 1 host: web-1 — command rm is not in bash.allow ---"
	if !strings.Contains(text, want) {
		t.Errorf("got:\n%s\nwant a line:\n%s", text, want)
	}
	if n := strings.Count(text, "denied by host policy"); n != 0 {
		t.Errorf("%q repeated %d times:\n%s", "denied by host policy", n, text)
	}
}
