package service

import (
	"context"
	"encoding/xml"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// recorder collects what serve reports.
type recorder struct {
	mu   sync.Mutex
	got  []status
	seen chan state
}

func (r *recorder) report(s status) {
	r.mu.Lock()
	r.got = append(r.got, s)
	r.mu.Unlock()
	r.seen <- s.state
}

func (r *recorder) states() []state {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []state
	for _, s := range r.got {
		out = append(out, s.state)
	}
	return out
}

// TestServeStop: a stop or a shutdown cancels the agent's context (the
// agent drains on it), the stop is reported pending with the drain's wait
// hint while it drains, and stopped once it has returned.
func TestServeStop(t *testing.T) {
	for _, req := range []request{reqStop, reqShutdown} {
		rec := &recorder{seen: make(chan state, 16)}
		requests := make(chan request)
		drained := make(chan struct{})
		runErr := errors.New("drained")
		done := make(chan error, 1)
		go func() {
			done <- serve(func(ctx context.Context) error {
				<-ctx.Done()
				close(drained)
				return runErr
			}, nil, requests, rec.report, 45*time.Second)
		}()
		for _, want := range []state{stateStartPending, stateRunning} {
			if got := <-rec.seen; got != want {
				t.Fatalf("reported %v, want %v", got, want)
			}
		}
		requests <- reqInterrogate
		if got := <-rec.seen; got != stateRunning {
			t.Fatalf("interrogate: reported %v", got)
		}
		select {
		case <-drained:
			t.Fatal("the agent was stopped before a stop was asked for")
		default:
		}
		requests <- req
		if err := <-done; err != runErr {
			t.Errorf("serve returned %v, want run's error", err)
		}
		<-drained
		want := []state{stateStartPending, stateRunning, stateRunning, stateStopPending, stateStopped}
		if got := rec.states(); !slices.Equal(got, want) {
			t.Errorf("request %v: states %v, want %v", req, got, want)
		}
		if s := rec.got[3]; s.waitHint != 45*time.Second || s.acceptStop {
			t.Errorf("stop pending reported as %+v", s)
		}
		if !rec.got[1].acceptStop {
			t.Error("running without accepting stop")
		}
	}
}

// TestServeRunEnds: an agent that stops by itself (a bad configuration)
// ends the service with its error.
func TestServeRunEnds(t *testing.T) {
	rec := &recorder{seen: make(chan state, 16)}
	bad := errors.New("no NATS server given")
	err := serve(func(context.Context) error { return bad }, nil, make(chan request), rec.report, time.Second)
	if err != bad {
		t.Errorf("serve = %v", err)
	}
	if got := rec.states(); got[len(got)-1] != stateStopped {
		t.Errorf("states %v, want to end stopped", got)
	}
}

func testDefinition() Definition {
	return Definition{
		Name: "io.fleetmcp.agent", Executable: "/usr/local/bin/fleet-agent",
		Args:       []string{"--nats", "tls://gw.example:4222", "--name", "mac-1", "--label", "team=a&b <x>"},
		WorkingDir: "/Users/Shared/fleet", Env: []string{"FLEET_POLICY=/etc/fleet/policy.yaml", "B=2"},
		LogFile: "/var/log/fleet-agent.log", DrainTimeout: 30 * time.Second,
	}
}

// plist is the subset of a property list the tests read back.
type plist struct {
	Dict struct {
		Items []struct {
			XMLName xml.Name
			Value   string   `xml:",chardata"`
			Strings []string `xml:"string"`
		} `xml:",any"`
	} `xml:"dict"`
}

// TestLaunchdPlist: the plist is well-formed XML that launchd reads as the
// agent's command line, kept alive, with a stop timeout beyond the drain
// and its tasks left running across restarts; text is escaped.
func TestLaunchdPlist(t *testing.T) {
	data, err := LaunchdPlist(testDefinition())
	if err != nil {
		t.Fatal(err)
	}
	var p plist
	if err := xml.Unmarshal(data, &p); err != nil {
		t.Fatalf("not XML: %v\n%s", err, data)
	}
	items := p.Dict.Items
	values := map[string]int{}
	for i := 0; i+1 < len(items); i += 2 {
		if items[i].XMLName.Local != "key" {
			t.Fatalf("item %d is %s, want a key", i, items[i].XMLName.Local)
		}
		values[items[i].Value] = i + 1
	}
	get := func(k string) (string, string) {
		i, ok := values[k]
		if !ok {
			t.Fatalf("no %s in\n%s", k, data)
		}
		return items[i].XMLName.Local, items[i].Value
	}
	if _, v := get("Label"); v != "io.fleetmcp.agent" {
		t.Errorf("Label %q", v)
	}
	if args := items[values["ProgramArguments"]].Strings; !slices.Equal(args, append([]string{"/usr/local/bin/fleet-agent"}, testDefinition().Args...)) {
		t.Errorf("ProgramArguments %q", args)
	}
	for k, want := range map[string]string{"RunAtLoad": "true", "KeepAlive": "true", "AbandonProcessGroup": "true"} {
		if tag, _ := get(k); tag != want {
			t.Errorf("%s is <%s/>, want <%s/>", k, tag, want)
		}
	}
	if _, v := get("ExitTimeOut"); v != "45" {
		t.Errorf("ExitTimeOut %s, want the drain timeout and the margin", v)
	}
	if _, v := get("StandardErrorPath"); v != "/var/log/fleet-agent.log" {
		t.Errorf("StandardErrorPath %q", v)
	}
	if !strings.Contains(string(data), "<key>B</key>\n\t\t<string>2</string>\n\t\t<key>FLEET_POLICY</key>") {
		t.Errorf("environment not sorted or missing:\n%s", data)
	}
	if strings.Contains(string(data), "a&b <x>") {
		t.Error("text is not escaped")
	}
	for _, bad := range []Definition{
		{Name: "io.fleetmcp.agent", Executable: "fleet-agent"},
		{Name: "bad name", Executable: "/x"},
		{Name: "", Executable: "/x"},
		{Name: "ok", Executable: "/x", Env: []string{"NOVALUE"}},
		{Name: "ok", Executable: "/x", Args: []string{"a\x00b"}},
		{Name: "ok", Executable: "/x", WorkingDir: "rel"},
	} {
		if _, err := LaunchdPlist(bad); err == nil {
			t.Errorf("LaunchdPlist(%+v) succeeded", bad)
		}
		if _, err := WindowsService(bad); err == nil {
			t.Errorf("WindowsService(%+v) succeeded", bad)
		}
	}
}

// splitCommandLine is the C runtime's parser (CommandLineToArgvW's rules
// for arguments after the program name), to check CommandLine against.
func splitCommandLine(s string) []string {
	var args []string
	var cur strings.Builder
	inArg, quoted := false, false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '\\':
			n := 0
			for i < len(s) && s[i] == '\\' {
				n++
				i++
			}
			if i < len(s) && s[i] == '"' {
				cur.WriteString(strings.Repeat(`\`, n/2))
				if n%2 == 1 {
					cur.WriteByte('"')
				} else {
					quoted = !quoted
				}
			} else {
				cur.WriteString(strings.Repeat(`\`, n))
				i--
			}
			inArg = true
		case c == '"':
			quoted, inArg = !quoted, true
		case (c == ' ' || c == '\t') && !quoted:
			if inArg {
				args = append(args, cur.String())
				cur.Reset()
				inArg = false
			}
		default:
			cur.WriteByte(c)
			inArg = true
		}
	}
	if inArg {
		args = append(args, cur.String())
	}
	return args
}

// TestWindowsService: the service's command line parses back into the
// agent's arguments whatever they hold; the service starts automatically,
// restarts on failure and gives the agent its drain time on stop.
func TestWindowsService(t *testing.T) {
	args := []string{"--nats", "tls://gw:4222", "--name", "win 1", "--cwd", `C:\Program Files\fleet\`, "--label", `say="hi \"there\""`, "", `a\\b`, `trailing\`, "\t"}
	c, err := WindowsService(Definition{Name: "fleet-agent", Executable: `C:\Program Files\fleetmcp\fleet-agent.exe`, Args: args, DrainTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if got := splitCommandLine(c.CommandLine); !slices.Equal(got, append([]string{`C:\Program Files\fleetmcp\fleet-agent.exe`}, args...)) {
		t.Errorf("command line %s parses to %q", c.CommandLine, got)
	}
	if !c.StartAutomatic || !c.DelayedAutoStart || c.StopWaitHint != 45*time.Second || len(c.RestartDelays) == 0 || c.DisplayName == "" || c.Description == "" {
		t.Errorf("config %+v", c)
	}
}

func FuzzCommandLine(f *testing.F) {
	f.Add("a b", `c"d`, `e\`)
	f.Add(`\\"`, "", "\t")
	f.Fuzz(func(t *testing.T, a, b, c string) {
		args := []string{"prog", a, b, c}
		if got := splitCommandLine(CommandLine(args)); !slices.Equal(got, args) {
			t.Fatalf("%q -> %s -> %q", args, CommandLine(args), got)
		}
	})
}

// TestServeReload: a parameter change reloads (the service's SIGHUP) and
// the service stays running, saying it takes parameter changes; without a
// reload function it says it does not, and a parameter change does
// nothing.
func TestServeReload(t *testing.T) {
	for _, withReload := range []bool{true, false} {
		rec := &recorder{seen: make(chan state, 16)}
		requests := make(chan request)
		reloads := make(chan struct{}, 4)
		var reload func()
		if withReload {
			reload = func() { reloads <- struct{}{} }
		}
		done := make(chan error, 1)
		go func() {
			done <- serve(func(ctx context.Context) error { <-ctx.Done(); return nil }, reload, requests, rec.report, time.Second)
		}()
		<-rec.seen
		<-rec.seen
		requests <- reqReload
		if got := <-rec.seen; got != stateRunning {
			t.Fatalf("after a parameter change: reported %v", got)
		}
		requests <- reqReload
		<-rec.seen
		requests <- reqStop
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if n := len(reloads); withReload && n != 2 || !withReload && n != 0 {
			t.Errorf("reload %v: %d reloads after two parameter changes", withReload, n)
		}
		if s := rec.got[1]; !s.acceptStop || s.acceptReload != withReload {
			t.Errorf("reload %v: running reported as %+v", withReload, s)
		}
	}
}
