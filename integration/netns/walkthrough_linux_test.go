//go:build linux

package netns

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/fleetmcp/fleetmcp/integration"
)

// TestWalkthroughNetNS runs the commands of deploy/README.md's "A fleet
// from scratch, step by step" as a newcomer would paste them: the
// gateway's blocks on this side, at the address of a veth link, the
// hosts' block in two network namespaces, each a machine that reaches the
// gateway only over its own link. The test replaces the placeholders
// (GATEWAY_IP, CA_PIN, NAME) and the system paths and ports (temporary
// directories, free ports), and pastes what the walk-through says to
// paste: the admin token into fleetctl login, the join token into
// fleet-agent join, the admin token's entry into the tokens file,
// FLEET_MCP_TOKEN for curl. Nothing else of the commands is changed, so a
// wrong flag or a missing step fails here. Then both hosts must be online
// and a bash call on each must run in its own namespace.
func TestWalkthroughNetNS(t *testing.T) {
	blocks := readWalkthrough(t)
	hosts := []*integration.NetNS{integration.NewNetNS(t), integration.NewNetNS(t)}
	names := []string{"web-1", "web-2"}
	gwIP := hosts[0].HostIP
	// The second machine reaches the gateway's address through its own
	// link, as a host on the same network would.
	if out, err := hosts[1].IP("-n", hosts[1].Name, "route", "add", gwIP+"/32", "via", hosts[1].HostIP); err != nil {
		t.Fatalf("route to %s in %s: %v: %s", gwIP, hosts[1].Name, err, out)
	}

	root := t.TempDir()
	w := &walk{
		t:    t,
		bin:  walkBinaries(t),
		home: filepath.Join(root, "gateway-home"),
		subst: strings.NewReplacer(
			// Longest first: a replacer tries them in this order.
			"/var/lib/fleetmcp-agent", "STATE_DIR",
			"/var/lib/fleetmcp", filepath.Join(root, "var-lib-fleetmcp"),
			"/etc/fleetmcp", filepath.Join(root, "etc-fleetmcp"),
			":8443", ":"+strconv.Itoa(integration.FreePortOn(t, "0.0.0.0")),
			":4222", ":"+strconv.Itoa(integration.FreePortOn(t, "0.0.0.0")),
			":8080", ":"+strconv.Itoa(integration.FreePort(t)),
		),
		gatewayIP: gwIP,
	}
	mkdir(t, w.home)
	for _, b := range blocks {
		switch {
		case strings.HasPrefix(b.Where, "the gateway machine"):
			w.run(b, nil, "")
		case strings.HasPrefix(b.Where, "each host"):
			for i, ns := range hosts {
				w.run(b, ns, names[i])
			}
		default:
			t.Fatalf("deploy/README.md:%d: a block runs %q: want on the gateway machine or on each host", b.Line, b.Where)
		}
	}

	for _, step := range []string{"gateway", "login", "token", "join", "agent list", "curl"} {
		if !w.done[step] {
			t.Errorf("the walk-through has no %s step", step)
		}
	}
	if t.Failed() {
		return
	}
	cs := w.client()
	for i, ns := range hosts {
		if !integration.HostOnline(cs, names[i]) {
			t.Errorf("%s is not online at the end of the walk-through", names[i])
			continue
		}
		out := integration.MustOK(t, integration.Call(t, cs, "bash", map[string]any{"host": names[i], "command": "cat /proc/net/dev"}))
		if !strings.Contains(out, ns.NSIf+":") || strings.Contains(out, hosts[1-i].NSIf+":") {
			t.Errorf("bash on %s did not run in its namespace %s (%s):\n%s", names[i], ns.Name, ns.NSIf, out)
		}
	}
}

// walk is the state of a walk-through being run: what earlier steps
// printed that later ones paste.
type walk struct {
	t         *testing.T
	bin       string // the three binaries, for PATH
	home      string // the gateway machine's HOME
	subst     *strings.Replacer
	gatewayIP string

	caPin      string
	adminToken string
	joinToken  string
	printed    string // the join command token create printed
	labels     []string
	mcpAddr    string
	cs         *mcp.ClientSession
	done       map[string]bool
}

var (
	walkAdminTokenRE = regexp.MustCompile(`fmcp_[A-Za-z0-9_-]{20,}`)
	walkSystemPathRE = regexp.MustCompile(`(^|[\s='"])/(etc|var|usr|opt|srv|root|home|lib|boot)(/|\s|$)`)
	walkCAPinRE      = regexp.MustCompile(`(?m)^\s*CA pin:\s+(sha256:[0-9a-f]{64})$`)
)

// run runs block b's commands on the gateway machine (ns nil) or on the
// host in ns called name.
func (w *walk) run(b shBlock, ns *integration.NetNS, name string) {
	t := w.t
	t.Helper()
	if w.done == nil {
		w.done = map[string]bool{}
	}
	home, stateDir := w.home, ""
	if ns != nil {
		home = filepath.Join(filepath.Dir(w.home), name+"-home")
		stateDir = filepath.Join(filepath.Dir(w.home), name+"-var-lib-fleetmcp-agent")
		mkdir(t, home)
	}
	text := w.placeholders(b, name, stateDir)
	// Run as root, a system path left as it is would change this machine.
	if m := walkSystemPathRE.FindString(text); m != "" {
		t.Fatalf("deploy/README.md:%d: the walk-through names %s, which the test does not replace with a temporary one: add it to the replacements", b.Line, strings.TrimSpace(m))
	}
	cmds, err := shCommands(text)
	if err != nil {
		t.Fatalf("deploy/README.md:%d: %v", b.Line, err)
	}
	for _, c := range cmds {
		where := "the gateway machine"
		if ns != nil {
			where = name
		}
		t.Logf("on %s: %s", where, c.Text)
		a := c.Args
		switch {
		case a[0] == "fleet-gateway" && slices.Contains(a, "--new_api_token"):
			out := w.output(c, ns, home, "")
			w.adminToken = walkAdminTokenRE.FindString(out)
			var entry string
			for _, l := range strings.Split(out, "\n") {
				if l = strings.TrimSpace(l); strings.HasPrefix(l, "- {name:") {
					entry = l
				}
			}
			file := flagValue(a, "--api_tokens")
			if w.adminToken == "" || entry == "" || file == "" {
				t.Fatalf("%s: printed no token or no entry, or names no --api_tokens file:\n%s", c.Text, out)
			}
			// "Put the entry into FILE, under tokens:"
			integration.WriteFile(t, file, "tokens:\n  "+entry+"\n")
		case a[0] == "fleet-gateway":
			p := w.start(c, ns, home, "")
			integration.WaitFor(t, 60*time.Second, "the gateway's CA pin in what it prints", func() bool {
				if p.exited() {
					t.Fatalf("%s: the gateway exited:\n%s", c.Text, p.out.String())
				}
				m := walkCAPinRE.FindStringSubmatch(p.out.String())
				if m != nil {
					w.caPin = m[1]
				}
				return m != nil
			})
			w.mcpAddr = flagValue(a, "--listen")
			w.done["gateway"] = true
		case a[0] == "fleetctl" && len(a) > 1 && a[1] == "login":
			w.need(c, "the admin token", w.adminToken)
			w.output(c, ns, home, w.adminToken+"\n")
			w.done["login"] = true
		case a[0] == "fleetctl" && len(a) > 2 && a[1] == "token" && a[2] == "create":
			out := w.output(c, ns, home, "")
			w.joinToken = joinTokenRE.FindString(out)
			w.printed = regexp.MustCompile(`fleet-agent join .*`).FindString(out)
			if w.joinToken == "" || w.printed == "" {
				t.Fatalf("%s printed no join token or no join command:\n%s", c.Text, out)
			}
			w.labels = strings.Split(flagValue(a, "--labels"), ",")
			w.done["token"] = true
		case a[0] == "fleet-agent" && len(a) > 1 && a[1] == "join":
			w.need(c, "a join token", w.joinToken)
			if ns == nil {
				t.Fatalf("deploy/README.md:%d: fleet-agent join runs on the gateway machine; want it on each host", b.Line)
			}
			// The README's command is the one token create printed, with
			// agent flags after it.
			if want := strings.Fields(strings.ReplaceAll(w.printed, "NAME", name)); len(a) < len(want) || !slices.Equal(a[:len(want)], want) {
				t.Errorf("deploy/README.md:%d: the join command\n\t%s\ndoes not start with the one fleetctl token create printed:\n\t%s", b.Line, strings.Join(a, " "), strings.Join(want, " "))
			}
			p := w.start(c, ns, home, w.joinToken+"\n")
			cs := w.client()
			integration.WaitFor(t, 60*time.Second, name+" online", func() bool {
				if p.exited() {
					t.Fatalf("%s on %s exited:\n%s", c.Text, name, p.out.String())
				}
				return integration.HostOnline(cs, name)
			})
			w.done["join"] = true
		case a[0] == "fleetctl" && len(a) > 2 && a[1] == "agent" && a[2] == "list":
			out := w.output(c, ns, home, "")
			for _, want := range append([]string{"web-1", "web-2"}, w.labels...) {
				if !strings.Contains(out, want) {
					t.Errorf("%s does not show %s:\n%s", c.Text, want, out)
				}
			}
			w.done["agent list"] = true
		case a[0] == "curl":
			out := w.output(c, ns, home, "")
			if !strings.Contains(out, `"result"`) || strings.Contains(out, `"isError":true`) || strings.Contains(out, `"error"`) {
				t.Errorf("%s answered no result:\n%s", c.Text, out)
			}
			w.done["curl"] = true
		default:
			w.output(c, ns, home, "")
		}
	}
}

// placeholders fills in b's placeholders and replaces its system paths
// and ports; a host's state directory is its own (stateDir).
func (w *walk) placeholders(b shBlock, name, stateDir string) string {
	text := w.subst.Replace(b.Text)
	for _, p := range []struct{ name, value, after string }{
		{"GATEWAY_IP", w.gatewayIP, ""},
		{"CA_PIN", w.caPin, "the gateway has started and printed it"},
		{"NAME", name, "a host's block"},
		{"STATE_DIR", stateDir, "a host's block (/var/lib/fleetmcp-agent)"},
	} {
		re := regexp.MustCompile(`\b` + p.name + `\b`)
		if !re.MatchString(text) {
			continue
		}
		if p.value == "" {
			w.t.Fatalf("deploy/README.md:%d: %s is used before %s", b.Line, p.name, p.after)
		}
		text = re.ReplaceAllLiteralString(text, p.value)
	}
	return text
}

// need fails when what a command reads has not been printed yet.
func (w *walk) need(c shCommand, what, v string) {
	if v == "" {
		w.t.Fatalf("%s: needs %s, which no earlier step printed", c.Text, what)
	}
}

// command is c as the shell runs it on the machine, with home as HOME
// and working directory.
func (w *walk) command(ctx context.Context, c shCommand, ns *integration.NetNS, home, stdin string) *exec.Cmd {
	args := []string{"-c", "exec " + c.Text}
	var cmd *exec.Cmd
	if ns == nil {
		cmd = exec.CommandContext(ctx, "bash", args...)
	} else {
		cmd = exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", ns.Name, "bash"}, args...)...)
	}
	cmd.Dir = home
	cmd.Env = w.env(home)
	cmd.Stdin = strings.NewReader(stdin)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return cmd
}

// env is a clean environment: none of this machine's fleet settings,
// proxies or XDG directories; HOME as given, the binaries first on PATH,
// and FLEET_MCP_TOKEN once the admin token exists.
func (w *walk) env(home string) []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if k == "HOME" || k == "PATH" || strings.HasPrefix(k, "FLEET_") || strings.HasPrefix(k, "XDG_") || strings.HasSuffix(strings.ToLower(k), "_proxy") {
			continue
		}
		env = append(env, kv)
	}
	env = append(env, "HOME="+home, "PATH="+w.bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	if w.adminToken != "" {
		env = append(env, "FLEET_MCP_TOKEN="+w.adminToken)
	}
	return env
}

// output runs c to its end and returns what it printed; failing or
// taking more than a minute fails the test.
func (w *walk) output(c shCommand, ns *integration.NetNS, home, stdin string) string {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := w.command(ctx, c, ns, home, stdin).CombinedOutput()
	w.t.Logf("%s", out)
	if err != nil {
		w.t.Fatalf("%s: %v (its output is above)", c.Text, err)
	}
	return string(out)
}

// walkProcess is a command of the walk-through that runs on (a gateway,
// an agent), stopped with the test.
type walkProcess struct {
	cmd  *exec.Cmd
	done <-chan struct{}
	out  *integration.SyncBuffer
}

func (p *walkProcess) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// start starts c and leaves it running; at the test's end it gets
// SIGTERM and must stop within 20 s.
func (w *walk) start(c shCommand, ns *integration.NetNS, home, stdin string) *walkProcess {
	t := w.t
	t.Helper()
	p := &walkProcess{out: &integration.SyncBuffer{}}
	p.cmd = w.command(context.Background(), c, ns, home, stdin)
	p.cmd.Stdout = io.MultiWriter(p.out, integration.TestLog(t))
	p.cmd.Stderr = p.cmd.Stdout
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("%s: %v", c.Text, err)
	}
	p.done = integration.WaitProcess(p.cmd)
	t.Cleanup(func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(20 * time.Second):
			t.Errorf("%s did not stop within 20s of SIGTERM", c.Text)
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// client is an MCP client of the gateway with the admin token.
func (w *walk) client() *mcp.ClientSession {
	t := w.t
	t.Helper()
	if w.cs != nil {
		return w.cs
	}
	if w.mcpAddr == "" || w.adminToken == "" {
		t.Fatal("no MCP endpoint (--listen) or no admin token yet")
	}
	c := mcp.NewClient(&mcp.Implementation{Name: "fleet-test", Version: "1"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	transport := &mcp.StreamableClientTransport{Endpoint: "http://" + w.mcpAddr + "/mcp", DisableStandaloneSSE: true, HTTPClient: integration.BearerClient(w.adminToken)}
	cs, err := c.Connect(ctx, transport, &mcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
	if err != nil {
		t.Fatalf("connect MCP client: %v", err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	w.cs = cs
	return cs
}

// flagValue is the value of flag name in args (--name V or --name=V).
func flagValue(args []string, name string) string {
	for i, a := range args {
		if a == name && i+1 < len(args) {
			return args[i+1]
		}
		if v, ok := strings.CutPrefix(a, name+"="); ok {
			return v
		}
	}
	return ""
}

// walkBinaries puts fleet-gateway, fleet-agent and fleetctl into one
// directory, for PATH.
func walkBinaries(t *testing.T) string {
	dir := t.TempDir()
	for name, path := range map[string]string{"fleet-gateway": integration.GatewayBinary(t), "fleet-agent": integration.AgentBinary(t), "fleetctl": integration.FleetctlBinary(t)} {
		if err := os.Symlink(path, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func mkdir(t *testing.T, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(fmt.Errorf("mkdir: %w", err))
	}
}
