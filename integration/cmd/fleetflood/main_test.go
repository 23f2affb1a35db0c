package main

import (
	"bytes"
	"context"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestMain lets the test binary play the flooder, the floor server and
// its responder: the command starts its own executable with -role.
func TestMain(m *testing.M) {
	if len(os.Args) > 2 && os.Args[1] == "-role" {
		ctx, stop := context.WithTimeout(context.Background(), 10*time.Minute)
		defer stop()
		if err := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr); err != nil {
			os.Stderr.WriteString(err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// The command runs end to end at a tiny size: the real gateway and agent
// processes, the floor server and its responder, and the flooders, every
// phase of both sides, each honest call's answer checked. It times
// nothing it asserts on; what it asserts is that the flood reached the
// gateway (its renewal requests were answered) and the floor, and that
// the control flood did not (beyond a few late answers of the flood
// before it).
func TestFloodTiny(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts the gateway and agent processes")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	var out, errs bytes.Buffer
	err := run(ctx, []string{"-runs", "2", "-phase", "0", "-calls", "3", "-settle", "200ms", "-report_rate", "2000", "-renew_rate", "200"},
		strings.NewReader(""), &out, &errs)
	if err != nil {
		t.Fatalf("%v\n%s\n%s", err, out.String(), errs.String())
	}
	t.Log(out.String())
	for _, side := range []string{"gateway", "floor"} {
		// Each run's line: the control's renewal requests unanswered
		// (nobody hears them; a few answers of the previous flood may
		// still come), the flood's answered.
		re := regexp.MustCompile(`run \d ` + side + ` .* sent \(control\) \d+\+\d+/s \((\d+) answers\)  \(flood\) \d+\+\d+/s \((\d+) answers\)`)
		runs := re.FindAllStringSubmatch(out.String(), -1)
		if len(runs) != 2 {
			t.Errorf("%d runs of %s in the output, want 2", len(runs), side)
		}
		for _, r := range runs {
			ctl, _ := strconv.Atoi(r[1])
			flood, _ := strconv.Atoi(r[2])
			if flood == 0 || ctl >= flood {
				t.Errorf("%s: %d renewal requests of the flood answered, %d of the control: %s", side, flood, ctl, r[0])
			}
		}
		if !regexp.MustCompile(`(?m)^` + side + ` +[0-9.]+ / [0-9.]+ / [0-9.]+ `).MatchString(out.String()) {
			t.Errorf("no medians of %s", side)
		}
	}
}

func TestParseFlags(t *testing.T) {
	for _, bad := range [][]string{{"-runs", "0"}, {"-calls", "1"}, {"-phase", "-1s"}, {"-call_interval", "2m"}, {"-report_rate", "0"},
		{"-renew_rate", "0"}, {"-call_bytes", "0"}, {"-sides", "other"}, {"-flooder_cpu", "-2"}, {"extra"}, {"-role", "other"}} {
		if _, err := parseFlags(bad, &bytes.Buffer{}); err == nil {
			t.Errorf("parseFlags(%q) accepted", bad)
		}
	}
	o, err := parseFlags([]string{"-sides", "floor", "-runs", "3"}, &bytes.Buffer{})
	if err != nil || len(o.sides) != 1 || o.sides[0] != "floor" || o.runs != 3 {
		t.Errorf("parseFlags: %+v, %v", o, err)
	}
}
