package childproc

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestMain makes the test binary a child when CHILDPROC_CHILD says how:
// "answer" prints a line of noise and READY, then answers "ping X" with
// "PONG X" until its input ends; "exit" ends at once with status 2;
// "silent" says nothing and waits for its input to end.
func TestMain(m *testing.M) {
	switch os.Getenv("CHILDPROC_CHILD") {
	case "":
		os.Exit(m.Run())
	case "answer":
		os.Stdout.WriteString("starting\nREADY\n")
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			if x, ok := strings.CutPrefix(sc.Text(), "ping "); ok {
				os.Stdout.WriteString("PONG " + x + "\n")
			}
		}
		os.Exit(0)
	case "exit":
		os.Exit(2)
	case "silent":
		_, _ = io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	}
}

func child(t *testing.T, mode string) *exec.Cmd {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), "CHILDPROC_CHILD="+mode)
	return cmd
}

func isReady(l string) bool { return l == "READY" }

func TestStartAskStop(t *testing.T) {
	p, err := Start(context.Background(), "answerer", child(t, "answer"), io.Discard, time.Minute, isReady)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Stop()
	if got, err := p.Ask(context.Background(), time.Minute, "ping 42", "PONG"); err != nil || got != "42" {
		t.Fatalf("Ask = %q, %v; want 42", got, err)
	}
	if p.Name() != "answerer" || p.Pid() <= 0 {
		t.Errorf("Name, Pid = %q, %d", p.Name(), p.Pid())
	}
	p.Stop()
	select {
	case <-p.Done():
	default:
		t.Fatal("Done not closed after Stop")
	}
	if _, err := p.Expect(context.Background(), time.Minute, isReady); err == nil || !strings.Contains(err.Error(), "answerer exited") {
		t.Errorf("Expect after Stop: %v, want that answerer exited", err)
	}
}

func TestStartExitBeforeReady(t *testing.T) {
	_, err := Start(context.Background(), "quitter", child(t, "exit"), io.Discard, time.Minute, isReady)
	if err == nil || !strings.Contains(err.Error(), "quitter exited (exit status 2)") {
		t.Fatalf("Start: %v, want that quitter exited with status 2", err)
	}
}

func TestStartNotReadyInTime(t *testing.T) {
	_, err := Start(context.Background(), "mute", child(t, "silent"), io.Discard, 200*time.Millisecond, isReady)
	if err == nil || !strings.Contains(err.Error(), "mute did not answer within 200ms") {
		t.Fatalf("Start: %v, want that mute did not answer in time", err)
	}
}

func TestSendWithStdinSet(t *testing.T) {
	cmd := child(t, "silent")
	cmd.Stdin = strings.NewReader("")
	p, err := Start(context.Background(), "fed", cmd, io.Discard, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Stop()
	if err := p.Send("hello"); err == nil {
		t.Error("Send to a process whose input was set succeeded")
	}
	<-p.Done() // its input ended: it exits by itself
}

func TestServe(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var out bytes.Buffer
	served := make(chan error, 1)
	go func() {
		served <- Serve(ctx, ln, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "hi") }), &LockedWriter{W: &out}, "nats://x")
	}()
	resp, err := http.Get("http://" + ln.Addr().String() + "/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != "hi" {
		t.Errorf("body %q, want hi", body)
	}
	cancel()
	if err := <-served; err != nil {
		t.Fatalf("Serve: %v", err)
	}
	if want := "READY http://" + ln.Addr().String() + " nats://x\n"; out.String() != want {
		t.Errorf("said %q, want %q", out.String(), want)
	}
}

func TestFreeAddrAndBuildErrors(t *testing.T) {
	addr, err := FreeAddr()
	if err != nil || !strings.HasPrefix(addr, "127.0.0.1:") {
		t.Fatalf("FreeAddr = %q, %v", addr, err)
	}
	_, err = Build(context.Background(), t.TempDir(), "no-such-command")
	if err == nil || !strings.Contains(err.Error(), "go build no-such-command") {
		t.Errorf("Build of a missing command: %v", err)
	}
}
