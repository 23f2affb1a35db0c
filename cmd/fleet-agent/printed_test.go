package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fleetmcp/fleetmcp/agent/identity"
	"github.com/fleetmcp/fleetmcp/agent/identity/identitytest"
	"github.com/fleetmcp/fleetmcp/protocol"
)

// withStdin makes --token_file - read s for the rest of the test.
func withStdin(t *testing.T, s string) {
	old := tokenStdin
	tokenStdin = strings.NewReader(s)
	t.Cleanup(func() { tokenStdin = old })
}

// The commands the gateway prints for each kind of token (the fleet API's
// join_command and install_command, which fleetctl and the --dev banner
// show) run as printed, the token pasted on standard input: no token on
// the command line, the host's name where the token names one.
func TestPrintedJoinCommandsRun(t *testing.T) {
	ca := identitytest.NewCA(t, "fleet")
	g := identitytest.NewGateway(t, ca)
	// The join checks the NATS URLs it is given before it runs.
	g.ServeNATSGreeting(t)
	for _, tc := range []struct {
		info protocol.TokenInfo
		host string
	}{
		{protocol.TokenInfo{}, ""},
		{protocol.TokenInfo{Name: "web-1"}, "web-1"},
		{protocol.TokenInfo{Replace: "web-2"}, "web-2"},
		{protocol.TokenInfo{NamePattern: "web-*"}, "web-3"},
	} {
		resp := &protocol.TokenCreateResponse{Token: g.Token, Info: tc.info, GatewayURL: g.URL, CAPin: g.Pin}
		join, install := protocol.JoinCommands(resp)
		for _, cmd := range []string{join, install} {
			if strings.Contains(cmd, g.Token) || strings.Contains(cmd, "--token ") || !strings.HasSuffix(cmd, " --token_file -") {
				t.Fatalf("printed command %q: the token must come from standard input", cmd)
			}
			if tc.host != "" && tc.info.NamePattern == "" && !strings.Contains(cmd, " --name "+tc.host+" ") {
				t.Errorf("printed command %q does not name host %s", cmd, tc.host)
			}
		}
		args := strings.Fields(strings.ReplaceAll(join, "--name NAME", "--name "+tc.host))
		if args[0] != "fleet-agent" || args[1] != "join" {
			t.Fatalf("join command %q", join)
		}
		state := t.TempDir()
		withStdin(t, g.Token+"\n")
		out := runUntil(t, append(args[1:], "--state_dir", state, "--drain_timeout", "1s"), nil)
		id, err := identity.Load(state)
		if err != nil {
			t.Fatalf("%s: %v\n%s", join, err, out)
		}
		if tc.host != "" && id.Enrolment.Host != tc.host {
			t.Errorf("%s enrolled as %s", join, id.Enrolment.Host)
		}

		// Another machine: another gateway, where its name is free.
		g := identitytest.NewGateway(t, ca)
		resp = &protocol.TokenCreateResponse{Token: g.Token, Info: tc.info, GatewayURL: g.URL, CAPin: g.Pin}
		_, install = protocol.JoinCommands(resp)
		args = strings.Fields(strings.ReplaceAll(install, "--name NAME", "--name "+tc.host))
		prefix := t.TempDir()
		withStdin(t, g.Token+"\n")
		var log syncBuffer
		if err := run(context.Background(), append(args[1:], "--prefix", prefix, "--no_start"), env(nil), &log); err != nil {
			t.Fatalf("%s: %v\n%s", install, err, log.String())
		}
		if _, err := identity.Load(filepath.Join(prefix, "var/lib/fleetmcp-agent")); err != nil {
			t.Fatalf("%s: %v\n%s", install, err, log.String())
		}
	}

	// A NATS join token's command parses too (it enrols over NATS, which
	// this test has not: the refusal is the server's, not the flags').
	resp := &protocol.TokenCreateResponse{Info: protocol.TokenInfo{NATS: true, Name: "edge-1"}, NATSURLs: []string{"tls://127.0.0.1:1"}, CAPin: g.Pin}
	join, _ := protocol.JoinCommands(resp)
	withStdin(t, "fmcpn1.not-a-token\n")
	args := strings.Fields(join)
	err := run(context.Background(), append(args[1:], "--state_dir", t.TempDir()), env(nil), &syncBuffer{})
	if err == nil || strings.Contains(err.Error(), "flag provided") || strings.Contains(err.Error(), "unexpected argument") || strings.Contains(err.Error(), "no join token") {
		t.Errorf("%s: %v", join, err)
	}
}

// --token_file - reads the first line of standard input, bounded, and
// says what is wrong with what it read.
func TestTokenFromStdin(t *testing.T) {
	for _, tc := range []struct{ in, want, err string }{
		{"fmcp1.abc\n", "fmcp1.abc", ""},
		{"  fmcp1.abc  ", "fmcp1.abc", ""},
		{"fmcp1.abc\nsecond line\n", "fmcp1.abc", ""},
		{"", "", "no join token on standard input"},
		{"\n", "", "no join token on standard input"},
		{strings.Repeat("x", maxTokenFileBytes+10), "", "more than"},
	} {
		got, err := readTokenLine(strings.NewReader(tc.in), nil)
		if got != tc.want || (err == nil) != (tc.err == "") || err != nil && !strings.Contains(err.Error(), tc.err) {
			t.Errorf("readTokenLine(%.20q) = %q, %v; want %q, %q", tc.in, got, err, tc.want, tc.err)
		}
	}
	// A terminal is asked; a pipe is not.
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	go func() { w.WriteString("fmcp1.abc\n"); w.Close() }()
	var prompt strings.Builder
	if got, err := readTokenLine(r, &prompt); got != "fmcp1.abc" || err != nil || prompt.Len() != 0 {
		t.Errorf("from a pipe: %q, %v, prompt %q", got, err, prompt.String())
	}
	if _, err := readTokenLine(errReader{}, nil); err == nil || !strings.Contains(err.Error(), "standard input") {
		t.Errorf("a failing read: %v", err)
	}
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, errors.New("broken") }

func FuzzTokenFromStdin(f *testing.F) {
	f.Add("fmcp1.abc\n")
	f.Add("\r\n\n")
	f.Fuzz(func(t *testing.T, in string) {
		got, err := readTokenLine(strings.NewReader(in), nil)
		if err == nil && (got == "" || strings.ContainsAny(got, "\n") || len(got) > maxTokenFileBytes || got != strings.TrimSpace(got)) {
			t.Fatalf("readTokenLine(%q) = %q", in, got)
		}
	})
}
