package main

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"
	"time"
)

// TestMain lets the test binary play the gateway child: the load command
// starts its own executable with -role gateway.
func TestMain(m *testing.M) {
	if len(os.Args) > 2 && os.Args[1] == "-role" {
		if err := run(context.Background(), os.Args[1:], os.Stdout, os.Stderr); err != nil {
			os.Stderr.WriteString(err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// The load command measures a small fleet end to end: memory, both
// fan-outs, and the return of every agent after a NATS restart.
func TestLoadSmallFleet(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a gateway process")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var out, errs bytes.Buffer
	if err := run(ctx, []string{"-hosts", "40", "-runs", "2", "-settle", "200ms"}, &out, &errs); err != nil {
		t.Fatalf("fleetload: %v\n%s\n%s", err, out.String(), errs.String())
	}
	t.Log(out.String())
	for _, want := range []string{
		"gateway memory: RSS ", "fleet_read across 40 hosts (max_concurrency default): p50 ",
		"fleet_bash across 40 hosts", "all 40 agents reconnected within", "after the restart: fleet_bash \"true\" reached all 40 hosts",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q", want)
		}
	}
	if strings.Contains(out.String(), "WARNING") {
		t.Errorf("a fan-out did not reach every host:\n%s", out.String())
	}
}

// The enrolment mode enrols every host over HTTPS with one join token,
// and the token ends spent with exactly as many uses.
func TestLoadEnrolOverHTTPS(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a gateway process")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var out, errs bytes.Buffer
	if err := run(ctx, []string{"-hosts", "50", "-enrol_only", "-enrol_conns", "8"}, &out, &errs); err != nil {
		t.Fatalf("fleetload: %v\n%s\n%s", err, out.String(), errs.String())
	}
	if !strings.Contains(out.String(), "50 hosts enrolled over HTTPS with one join token") {
		t.Errorf("output:\n%s", out.String())
	}
}

func TestParseFlags(t *testing.T) {
	for _, bad := range [][]string{{"-hosts", "0"}, {"-hosts", "x"}, {"-runs", "0"}, {"-concurrency", "501"}, {"extra"}, {"-enrol", "carrier-pigeon"}, {"-enrol_conns", "0"}} {
		if _, err := parseFlags(bad, &bytes.Buffer{}); err == nil {
			t.Errorf("parseFlags(%q) accepted", bad)
		}
	}
	o, err := parseFlags([]string{"-hosts", "10,20", "-concurrency", "0,500"}, &bytes.Buffer{})
	if err != nil || len(o.hosts) != 2 || o.concurrency[1] != 500 {
		t.Errorf("parseFlags: %+v, %v", o, err)
	}
}
