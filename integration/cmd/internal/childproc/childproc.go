// Package childproc runs the child processes of the load commands: it
// builds the fleet binaries, starts a process and waits for the line that
// says it is ready, talks to it line by line, and stops it. A child serves
// HTTP and says it is ready with Serve; LoadAverage reads the machine's
// load for the commands' reports.
package childproc

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Proc is a child process: its standard output is read line by line
// (the last 1,000 unread lines are kept for Expect); its standard input,
// unless the command had one set, is a pipe for Send and Ask.
type Proc struct {
	name  string
	cmd   *exec.Cmd
	in    io.WriteCloser
	lines chan string
	done  chan struct{}
}

// Start runs cmd and returns once it printed a line for which ready
// holds, at most limit later; with ready nil, at once.
func Start(ctx context.Context, name string, cmd *exec.Cmd, stderr io.Writer, limit time.Duration, ready func(string) bool) (*Proc, error) {
	cmd.Stderr = stderr
	cmd.SysProcAttr = attr()
	var in io.WriteCloser
	if cmd.Stdin == nil {
		var err error
		if in, err = cmd.StdinPipe(); err != nil {
			return nil, err
		}
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &Proc{name: name, cmd: cmd, in: in, lines: make(chan string, 1000), done: make(chan struct{})}
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
	if _, err := p.Expect(ctx, limit, ready); err != nil {
		p.Stop()
		return nil, err
	}
	return p, nil
}

// Name is the name p was started with.
func (p *Proc) Name() string { return p.name }

// Done is closed once p has exited.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Pid returns p's process ID (that of the program taskset runs, too:
// taskset execs it).
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Expect waits at most limit for a line of p's for which want holds,
// and returns it; the lines before it are dropped.
func (p *Proc) Expect(ctx context.Context, limit time.Duration, want func(string) bool) (string, error) {
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

// Send writes line, and a newline, to p's standard input.
func (p *Proc) Send(line string) error {
	if p.in == nil {
		return errors.New("its standard input was set when it started")
	}
	_, err := fmt.Fprintln(p.in, line)
	return err
}

// Ask sends one command line to p and waits at most limit for its
// answer, the next line starting with answer; it returns the rest of
// that line.
func (p *Proc) Ask(ctx context.Context, limit time.Duration, command, answer string) (string, error) {
	if err := p.Send(command); err != nil {
		return "", fmt.Errorf("%s: %w", p.name, err)
	}
	line, err := p.Expect(ctx, limit, func(l string) bool { return strings.HasPrefix(l, answer) })
	if err != nil {
		return "", fmt.Errorf("%s, after %q: %w", p.name, command, err)
	}
	return strings.TrimSpace(strings.TrimPrefix(line, answer)), nil
}

// Stop asks the process to end and waits, killing it after 20 s. A nil
// p is stopped already.
func (p *Proc) Stop() {
	if p == nil {
		return
	}
	if p.in != nil {
		_ = p.in.Close()
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// Build builds the commands of this module named (fleet-gateway,
// fleet-agent, fleetctl) into dir, and returns each one's path by name.
func Build(ctx context.Context, dir string, names ...string) (map[string]string, error) {
	bins := map[string]string{}
	for _, name := range names {
		bin := filepath.Join(dir, name)
		out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/fleetmcp/fleetmcp/cmd/"+name).CombinedOutput()
		if err != nil {
			return nil, fmt.Errorf("go build %s: %w\n%s", name, err, out)
		}
		bins[name] = bin
	}
	return bins, nil
}

// FreeAddr returns a loopback TCP address that was free a moment ago.
func FreeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// LockedWriter serialises the writes of several goroutines to W.
type LockedWriter struct {
	mu sync.Mutex
	W  io.Writer
}

func (l *LockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.W.Write(p)
}

// Serve is the child's side of the ready line: it serves h on ln, says
// `READY http://<address> <also>` on stdout once it listens, and serves
// until ctx ends (then shuts down, waiting at most 5 s) or serving fails.
func Serve(ctx context.Context, ln net.Listener, h http.Handler, stdout io.Writer, also string) error {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	fmt.Fprintf(stdout, "READY http://%s %s\n", ln.Addr(), also)
	select {
	case <-ctx.Done():
	case err := <-served:
		return err
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	return nil
}

// LoadAverage returns the machine's 1, 5 and 15 minute load averages
// from /proc/loadavg, or "unknown".
func LoadAverage() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(data))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}
