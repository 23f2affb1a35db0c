package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/fleetmcp/fleetmcp/gateway"
	"github.com/fleetmcp/fleetmcp/gateway/audit"
)

// Processes, files, logs and NATS connections the tests share.

// WaitProcess waits for cmd in the background; the channel is closed when
// it has exited.
func WaitProcess(cmd *exec.Cmd) <-chan struct{} {
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	return done
}

// WriteFile writes content to path, making its directory.
func WriteFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// SyncBuffer is a log sink safe for concurrent writes.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// FleetctlBinary builds cmd/fleetctl once per test binary.
func FleetctlBinary(t testing.TB) string { return fleetctlCommand.binary(t) }

// HostOnline asks the gateway whether host is online.
func HostOnline(cs *mcp.ClientSession, host string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "hosts", Arguments: map[string]any{"filter": host}})
	return err == nil && strings.Contains(Text(res), host+"\tonline")
}

// WatchedConn is a connection with an agent's credential whose end is
// recorded: when it was cut off, and every error the server sent it
// (its reason, then the refusals of its attempts to come back).
type WatchedConn struct {
	nc    *nats.Conn
	mu    sync.Mutex
	cutAt time.Time
	errs  []error
	cut   chan struct{}
}

// WatchConn connects to url with a credential and seed (and the CA caPEM
// when set), reconnecting as an agent would.
func WatchConn(t *testing.T, url, token string, seed []byte, caPEM []byte) *WatchedConn {
	t.Helper()
	w := &WatchedConn{cut: make(chan struct{})}
	var once sync.Once
	opts := []nats.Option{
		nats.UserJWTAndSeed(token, string(seed)),
		nats.MaxReconnects(-1), nats.ReconnectWait(50 * time.Millisecond),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			w.mu.Lock()
			if w.cutAt.IsZero() {
				w.cutAt = time.Now()
			}
			w.mu.Unlock()
			once.Do(func() { close(w.cut) })
		}),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			w.mu.Lock()
			w.errs = append(w.errs, err)
			w.mu.Unlock()
		}),
	}
	if len(caPEM) > 0 {
		opts = append(opts, AgentTLS(caPEM))
	}
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatalf("connect with the credential: %v", err)
	}
	t.Cleanup(nc.Close)
	w.nc = nc
	return w
}

// WaitCut waits until the connection is cut off and returns when.
func (w *WatchedConn) WaitCut(t *testing.T, within time.Duration) time.Time {
	t.Helper()
	select {
	case <-w.cut:
	case <-time.After(within):
		t.Fatalf("the connection was not cut off within %s", within)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.cutAt
}

// WaitErr waits until the server sent the connection an error matching
// want.
func (w *WatchedConn) WaitErr(t *testing.T, what string, want func(error) bool) {
	t.Helper()
	WaitFor(t, 10*time.Second, what, func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		for _, err := range w.errs {
			if want(err) {
				return true
			}
		}
		return false
	})
}

// EnrolKey enrols host with a new key on gw and returns its credential
// and seed.
func EnrolKey(t *testing.T, gw *gateway.Gateway, host string, opts ...gateway.EnrolOption) (gateway.AgentCredentials, []byte, error) {
	t.Helper()
	kp, _ := nkeys.CreateUser()
	pub, _ := kp.PublicKey()
	seed, _ := kp.Seed()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	creds, err := gw.EnrolLocal(ctx, host, pub, map[string]string{"env": "test"}, opts...)
	return creds, seed, err
}

// TestLog is a writer that sends each write, a process's or a logger's
// lines, to t's log.
func TestLog(t testing.TB) io.Writer { return testWriter{t} }

// ModuleRoot is the directory holding the module's go.mod: the first
// above the test's working directory (its package's directory).
func ModuleRoot(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's working directory")
		}
		dir = parent
	}
}

// AuditRecords calls the audit tool with filters and returns its records.
func AuditRecords(t *testing.T, cs *mcp.ClientSession, filters map[string]any) []audit.Record {
	t.Helper()
	res := Call(t, cs, "audit", filters)
	MustOK(t, res)
	data, _ := json.Marshal(res.StructuredContent)
	var page struct {
		Records []audit.Record `json:"records"`
	}
	if err := json.Unmarshal(data, &page); err != nil {
		t.Fatalf("audit structuredContent %s: %v", data, err)
	}
	return page.Records
}

// Scrape returns the samples at url by series ("name{labels}"; labels in
// the order the exposition gives them, sorted by name).
func Scrape(t testing.TB, url string) map[string]float64 {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("Scrape %s: %v", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("Scrape %s: %s", url, resp.Status)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("sample %q: %v", line, err)
		}
		out[line[:i]] = v
	}
	return out
}

// Capture subscribes to subject and returns the messages it sees, and
// the function that ends the subscription.
func Capture(t *testing.T, nc *nats.Conn, subject string) (<-chan *nats.Msg, func()) {
	t.Helper()
	ch := make(chan *nats.Msg, 64)
	sub, err := nc.ChanSubscribe(subject, ch)
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return ch, func() { _ = sub.Unsubscribe() }
}

// NextMsg returns the next message on ch, or fails the test after 20 s
// without one (what names it).
func NextMsg(t *testing.T, ch <-chan *nats.Msg, what string) *nats.Msg {
	t.Helper()
	select {
	case m := <-ch:
		return m
	case <-time.After(20 * time.Second):
		t.Fatalf("no %s within 20s", what)
		return nil
	}
}

// LargeContent is a file content of n MiB.
func LargeContent(n int) string { return strings.Repeat("0123456789abcdef", n*MiB/16) }
