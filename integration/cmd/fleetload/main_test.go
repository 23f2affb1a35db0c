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
		"the agents made ",
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

// The rollout mode rolls a pushed skill out to a small fleet, twice,
// each time until every simulated host holds the new bundle, and reports
// the median and the JetStream consumers, which are the gateway's few.
func TestLoadRollout(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a gateway process")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var out, errs bytes.Buffer
	if err := run(ctx, []string{"-mode", "rollout", "-hosts", "30", "-runs", "2", "-enrol", "local"}, &out, &errs); err != nil {
		t.Fatalf("fleetload -mode rollout: %v\n%s\n%s", err, out.String(), errs.String())
	}
	t.Log(out.String())
	for _, want := range []string{"== skill rollout to 30 hosts", "run 1: every host installed after ", "run 2: every host installed after ",
		"skill rollout to 30 hosts: median "} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q", want)
		}
	}
	m := regexp.MustCompile(`JetStream consumers of the skill streams at most map\[([^\]]*)\] \((\d+) samples missed\)`).FindStringSubmatch(out.String())
	if m == nil {
		t.Fatalf("no consumer count in the output")
	}
	total := 0
	for _, kv := range strings.Fields(m[1]) {
		_, n, _ := strings.Cut(kv, ":")
		c, err := strconv.Atoi(n)
		if err != nil {
			t.Fatalf("consumer count %q", kv)
		}
		total += c
	}
	if total == 0 || total > 5 {
		t.Errorf("the skill streams had %d consumers at most for 30 hosts (%s); want the gateway's few, none per host", total, m[1])
	}
}

func TestParseFlags(t *testing.T) {
	for _, bad := range [][]string{{"-hosts", "0"}, {"-hosts", "x"}, {"-runs", "0"}, {"-concurrency", "501"}, {"extra"}, {"-enrol", "carrier-pigeon"}, {"-enrol_conns", "0"}, {"-mode", "sideways"}, {"-restart_profile_seconds", "0"}} {
		if _, err := parseFlags(bad, &bytes.Buffer{}); err == nil {
			t.Errorf("parseFlags(%q) accepted", bad)
		}
	}
	o, err := parseFlags([]string{"-hosts", "10,20", "-concurrency", "0,500"}, &bytes.Buffer{})
	if err != nil || len(o.hosts) != 2 || o.concurrency[1] != 500 {
		t.Errorf("parseFlags: %+v, %v", o, err)
	}
}
