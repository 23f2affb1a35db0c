package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// proc is a child process: its standard output, line by line, on
// lines; its standard input, when it takes commands, on in.
type proc struct {
	name  string
	cmd   *exec.Cmd
	in    io.WriteCloser
	lines chan string
	done  chan struct{}
}

// start runs cmd and returns once it printed a line for which ready
// holds, at most limit later. Every line is kept on p.lines (the last
// 1,000 unread ones) for expect.
func start(ctx context.Context, name string, cmd *exec.Cmd, stderr io.Writer, limit time.Duration, ready func(string) bool) (*proc, error) {
	cmd.Stderr = stderr
	cmd.SysProcAttr = childAttr()
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, in: in, lines: make(chan string, 1000), done: make(chan struct{})}
	scanned := make(chan struct{})
	go func() {
		defer close(scanned)
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			select {
			case p.lines <- sc.Text():
			default: // nobody reads them: the oldest are not needed
			}
		}
		_, _ = io.Copy(io.Discard, out)
	}()
	go func() { <-scanned; _ = cmd.Wait(); close(p.done) }()
	if ready == nil {
		return p, nil
	}
	if _, err := p.expect(ctx, limit, ready); err != nil {
		p.stop()
		return nil, err
	}
	return p, nil
}

// expect waits at most limit for a line of p's for which want holds,
// and returns it; the lines before it are dropped.
func (p *proc) expect(ctx context.Context, limit time.Duration, want func(string) bool) (string, error) {
	timer := time.NewTimer(limit)
	defer timer.Stop()
	for {
		select {
		case line := <-p.lines:
			if want(line) {
				return line, nil
			}
		case <-p.done:
			return "", fmt.Errorf("%s exited (%v)", p.name, p.cmd.ProcessState)
		case <-timer.C:
			return "", fmt.Errorf("%s did not answer within %s", p.name, limit)
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
}

// ask sends one command line to p and waits at most limit for its
// answer, the next line starting with answer.
func (p *proc) ask(ctx context.Context, limit time.Duration, command, answer string) (string, error) {
	if _, err := fmt.Fprintln(p.in, command); err != nil {
		return "", fmt.Errorf("%s: %w", p.name, err)
	}
	line, err := p.expect(ctx, limit, func(l string) bool { return strings.HasPrefix(l, answer) })
	if err != nil {
		return "", fmt.Errorf("%s, after %q: %w", p.name, command, err)
	}
	return strings.TrimSpace(strings.TrimPrefix(line, answer)), nil
}

// pid returns p's process ID (that of the program taskset runs, too:
// taskset execs it).
func (p *proc) pid() int { return p.cmd.Process.Pid }

// stop asks the process to end and waits, killing it after 20 s.
func (p *proc) stop() {
	if p == nil {
		return
	}
	_ = p.in.Close()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// command makes the command that runs name with args, on cpu alone
// when cpu is not negative.
func command(cpu int, name string, args ...string) *exec.Cmd {
	if cpu >= 0 {
		name, args = pinned(cpu, name, args...)
	}
	return exec.Command(name, args...)
}

// buildBinaries builds fleet-gateway, fleet-agent and fleetctl into dir.
func buildBinaries(ctx context.Context, dir string) (map[string]string, error) {
	bins := map[string]string{}
	for _, name := range []string{"fleet-gateway", "fleet-agent", "fleetctl"} {
		bin := filepath.Join(dir, name)
		out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/fleetmcp/fleetmcp/cmd/"+name).CombinedOutput()
		if err != nil {
			return nil, fmt.Errorf("go build %s: %w\n%s", name, err, out)
		}
		bins[name] = bin
	}
	return bins, nil
}

func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// lockedWriter serialises the writes of several goroutines to w.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
