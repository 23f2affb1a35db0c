package main

import (
	"context"
	"errors"
	"flag"
	"runtime"
	"strings"
	"testing"
)

// help is not an error, and -h of each command starts with its synopsis;
// install's shows the state directory it installs to.
func TestHelp(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"help"}, []string{"Usage:", "fleet-agent join [flags]", "fleet-agent install [flags]", "fleet-agent doctor [flags]", "-state_dir"}},
		{[]string{"help", "join"}, []string{"Usage: fleet-agent join --gateway", "--token_file -", "FLEET_JOIN_TOKEN", "-ca_pin"}},
		{[]string{"help", "install"}, []string{"Usage: fleet-agent install", "-prefix", "-user"}},
		{[]string{"help", "doctor"}, []string{"Usage: fleet-agent doctor", "-timeout"}},
	} {
		var out syncBuffer
		if err := run(context.Background(), tc.args, env(nil), &out); err != nil {
			t.Errorf("%q = %v; want help without an error", tc.args, err)
		}
		for _, w := range tc.want {
			if !strings.Contains(out.String(), w) {
				t.Errorf("%q does not say %q:\n%s", tc.args, w, out.String())
			}
		}
	}
	if err := run(context.Background(), []string{"help", "fly"}, env(nil), &syncBuffer{}); err == nil || !strings.Contains(err.Error(), "join, install and doctor") {
		t.Errorf("help fly: %v", err)
	}
	for _, cmd := range []string{"join", "install", "doctor"} {
		var out syncBuffer
		if err := run(context.Background(), []string{cmd, "-h"}, env(nil), &out); !errors.Is(err, flag.ErrHelp) || !strings.HasPrefix(out.String(), "Usage: fleet-agent "+cmd) {
			t.Errorf("%s -h: %v\n%s", cmd, err, out.String())
		}
	}
	if runtime.GOOS == "linux" {
		var out syncBuffer
		_ = run(context.Background(), []string{"install", "-h"}, env(map[string]string{"HOME": "/home/someone"}), &out)
		if !strings.Contains(out.String(), `(default "/var/lib/fleetmcp-agent")`) || strings.Contains(out.String(), "/home/someone") {
			t.Errorf("install -h does not show the service's state directory as --state_dir's default:\n%s", out.String())
		}
	}
}
