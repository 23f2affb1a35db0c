package main

import (
	"bytes"
	"context"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestMain lets the test binary play the floor server: the benchmark
// starts its own executable with -role floor.
func TestMain(m *testing.M) {
	if len(os.Args) > 2 && os.Args[1] == "-role" {
		ctx, stop := context.WithTimeout(context.Background(), 10*time.Minute)
		defer stop()
		if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
			os.Stderr.WriteString(err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// The benchmark runs end to end at a tiny size: the real gateway and
// agent processes and the floor server, every case of both eras, each
// call's result checked, and a ratio for each fleet case. It times
// nothing it asserts on.
func TestBenchTiny(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts the gateway and agent processes")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	var out, errs bytes.Buffer
	err := run(ctx, []string{"-rounds", "2", "-calls", "3", "-large_calls", "1", "-large_size", "200000", "-concurrency", "1,2"}, &out, &errs)
	if err != nil {
		t.Fatalf("fleetbench: %v\n%s\n%s", err, out.String(), errs.String())
	}
	t.Log(out.String())
	for _, call := range []string{"read 4 KiB", "write 4 KiB", "bash echo hi", "read 5 MB", "write 5 MB"} {
		for _, target := range []string{"gateway --dev, own agent", "gateway + fleet-agent"} {
			for _, era := range []string{"2025", "2026"} {
				for _, c := range []string{"1", "2"} {
					re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(call) + ` +` + regexp.QuoteMeta(target) + ` +` + era + ` c=` + c + ` +\S`)
					if !re.MatchString(out.String()) {
						t.Errorf("no ratio for %s, %s, era %s, c=%s", call, target, era, c)
					}
				}
			}
		}
	}
	for _, target := range []string{"relay floor", "signed relay floor"} {
		for _, era := range []string{"2025", "2026"} {
			for _, c := range []string{"1", "2"} {
				re := regexp.MustCompile(`(?m)^read 4 KiB +` + target + ` +` + era + ` c=` + c + ` +p50 \S+× the bare echo`)
				if !re.MatchString(out.String()) {
					t.Errorf("no ratio for read 4 KiB, %s, era %s, c=%s", target, era, c)
				}
			}
		}
	}
	for _, want := range []string{"medians over 2 rounds", "echo           bare go-sdk server         2026   2", "bash echo hi   local spawn"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q", want)
		}
	}
}

func TestParseFlags(t *testing.T) {
	for _, bad := range [][]string{{"-rounds", "0"}, {"-concurrency", "0"}, {"-concurrency", "x"}, {"-only", "("}, {"-small_size", "100000"},
		{"-large_size", "0"}, {"-calls", "0"}, {"extra"}, {"-role", "other"}} {
		if _, err := parseFlags(bad, &bytes.Buffer{}); err == nil {
			t.Errorf("parseFlags(%q) accepted", bad)
		}
	}
	o, err := parseFlags([]string{"-concurrency", "1,8", "-only", "read"}, &bytes.Buffer{})
	if err != nil || len(o.concurrency) != 2 || !o.only.MatchString("read 4 KiB") {
		t.Errorf("parseFlags: %+v, %v", o, err)
	}
}
