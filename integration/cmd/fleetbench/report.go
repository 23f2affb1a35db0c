package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

func median[T int64 | float64 | time.Duration](xs []T) T {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func ms(d time.Duration) string { return fmt.Sprintf("%.3f ms", float64(d.Microseconds())/1000) }

// The medians of a case over the rounds.
func (c *bcase) medP50() time.Duration { return median(c.p50) }
func (c *bcase) medP99() time.Duration { return median(c.p99) }
func (c *bcase) medRate() float64      { return median(c.rate) }
func (c *bcase) mbps() float64         { return c.medRate() * float64(c.bytes) / 1e6 }

func describeTarget(t string) string {
	switch t {
	case "floor":
		return "bare go-sdk server"
	case "relay":
		return "relay floor"
	case "signed relay":
		return "signed relay floor"
	case "dev":
		return "gateway --dev, own agent"
	case "agent":
		return "gateway + fleet-agent"
	}
	return "local spawn"
}

// report prints every case's medians, then the ratios to the floors.
func (b *bench) report(w io.Writer) {
	fmt.Fprintf(w, "\nmedians over %d rounds\n", b.o.rounds)
	fmt.Fprintf(w, "%-14s %-26s %-4s %3s %11s %11s %9s %8s %s\n", "call", "target", "era", "c", "p50", "p99", "calls/s", "MB/s", "CPU per call (gateway, agent)")
	for _, c := range b.cases {
		if len(c.p50) == 0 {
			continue
		}
		mb := ""
		if c.bytes > 0 {
			mb = fmt.Sprintf("%.1f", c.mbps())
		}
		cpu := ""
		if c.cpu != nil {
			cpu = fmt.Sprintf("%.0f µs, %.0f µs", median(c.cpu["gateway"])*1e6, median(c.cpu["agent"])*1e6)
		}
		fmt.Fprintf(w, "%-14s %-26s %-4s %3d %11s %11s %9.0f %8s %s\n", c.name, describeTarget(c.target), orDash(c.era), c.conc, ms(c.medP50()), ms(c.medP99()), c.medRate(), mb, cpu)
	}
	fmt.Fprintf(w, "\nratios to the floors (goals: 4 KiB read p50 ≤ 1.5× the bare echo at c=1, calls/s ≥ 0.8× at c=8; bash p50 ≤ local spawn + 0.5 ms; large transfers ≥ 100 MB/s)\n")
	for _, c := range b.cases {
		if len(c.p50) == 0 || c.target == "floor" || c.target == "local" {
			continue
		}
		if line := b.ratio(c); line != "" {
			fmt.Fprintf(w, "%-14s %-26s %-4s c=%-2d %s\n", c.name, describeTarget(c.target), c.era, c.conc, line)
		}
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// ratio compares case c with its floor.
func (b *bench) ratio(c *bcase) string {
	era := c.era
	if c.name == "bash echo hi" {
		era = ""
	}
	target := "floor"
	if era == "" {
		target = "local"
	}
	f := b.byKey[(&bcase{name: floorName(c.name), target: target, era: era, conc: c.conc}).key()]
	if f == nil || len(f.p50) == 0 {
		return ""
	}
	switch {
	case c.name == "bash echo hi":
		return fmt.Sprintf("p50 local spawn %+.3f ms, calls/s %.2f× local spawn", float64((c.medP50()-f.medP50()).Microseconds())/1000, c.medRate()/f.medRate())
	case c.bytes > 0:
		verdict := "meets 100 MB/s"
		if c.mbps() < 100 {
			verdict = "below 100 MB/s"
		}
		return fmt.Sprintf("%.1f MB/s: %.2f× the bare server's %.1f MB/s; %s", c.mbps(), c.mbps()/f.mbps(), f.mbps(), verdict)
	}
	parts := []string{fmt.Sprintf("p50 %.2f× the bare echo", float64(c.medP50())/float64(f.medP50())),
		fmt.Sprintf("calls/s %.2f×", c.medRate()/f.medRate())}
	return strings.Join(parts, ", ")
}
