package gateway

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/fleetmcp/fleetmcp/protocol"

	"github.com/fleetmcp/fleetmcp/gateway/internal/textutil"
)

// This file renders a fan-out's outcomes as one tool result. Hosts with
// the same outcome and the same output (for fleet_read: the same
// SHA-256) form one group, shown once with its hosts' names; groups that
// did not succeed come first. The text never exceeds fanoutBudget: every
// group gets its header, and the outputs share what is left, so each
// one's tail shrinks as the number of groups grows; groups that do not
// fit at all are counted in a last line. structuredContent lists every
// host whatever fits.

const (
	// fanoutBudget bounds the text of a fan-out result, as the bash tool
	// bounds its output.
	fanoutBudget = protocol.MaxOutputBytes
	// minShownBody is the least output a shown group gets (less when its
	// output is shorter); groups that cannot get it are not shown.
	minShownBody = 160
	// cutMarkerLen bounds the note that says an output was cut.
	cutMarkerLen = 48
	// omittedReserve is kept for the line that counts groups not shown.
	omittedReserve = 400
)

// fanoutResult is a fan-out's structuredContent.
type fanoutResult struct {
	Tool       string         `json:"tool"`
	Selector   string         `json:"selector"`
	Total      int            `json:"total"`
	Counts     map[string]int `json:"counts"`
	DurationMS int64          `json:"duration_ms"`
	// Versions are fleet_read's distinct file versions, most hosts first;
	// an empty sha256 stands for hosts that did not report one.
	Versions []readVersion `json:"versions,omitempty"`
	Hosts    []hostOutcome `json:"hosts"`
}

type readVersion struct {
	SHA256 string `json:"sha256"`
	Hosts  int    `json:"hosts"`
	Bytes  int    `json:"bytes"`
}

// outcomeGroup is hosts with the same outcome and output.
type outcomeGroup struct {
	status, note string
	sha          string
	known        bool // sha is the host-reported hash (fleet_read)
	body         string
	hosts        []*hostOutcome
}

// statusRank orders groups: what needs attention first.
func statusRank(status string) int {
	return slices.Index([]string{bucketFailed, bucketTimedOut, bucketDenied, bucketOffline, bucketNotStarted, bucketSucceeded}, status)
}

// groupOutcomes groups hosts by outcome and output.
func groupOutcomes(tool string, outcomes []hostOutcome) []*outcomeGroup {
	byKey := make(map[string]*outcomeGroup)
	var groups []*outcomeGroup
	for i := range outcomes {
		o := &outcomes[i]
		g := &outcomeGroup{status: o.Status, note: o.note, body: o.body}
		key := o.Status + "\x00" + o.note + "\x00"
		if tool == toolFleetRead && o.Status == bucketSucceeded {
			// Hosts that report no hash are grouped by identical text,
			// which proves nothing about the rest of a long file; the
			// text says so.
			g.note, g.sha, g.known = "", o.SHA256, o.SHA256 != ""
			if g.known {
				key += "sha256:" + o.SHA256
			} else {
				key += "text:" + o.body
			}
		} else {
			key += o.body
		}
		if have := byKey[key]; have != nil {
			g = have
		} else {
			byKey[key] = g
			groups = append(groups, g)
		}
		g.hosts = append(g.hosts, o)
	}
	slices.SortStableFunc(groups, func(a, b *outcomeGroup) int {
		return cmp.Or(cmp.Compare(statusRank(a.status), statusRank(b.status)), cmp.Compare(len(b.hosts), len(a.hosts)),
			strings.Compare(a.note, b.note), strings.Compare(a.hosts[0].Host, b.hosts[0].Host))
	})
	return groups
}

// renderFanout builds the result of a fan-out.
func renderFanout(tool, what, selector string, outcomes []hostOutcome, took time.Duration) *mcp.CallToolResult {
	counts := countBuckets(outcomes)
	groups := groupOutcomes(tool, outcomes)
	sr := fanoutResult{Tool: tool, Selector: selector, Total: len(outcomes), Counts: counts, DurationMS: took.Milliseconds(), Hosts: outcomes}

	var b strings.Builder
	fmt.Fprintf(&b, "%s on %d hosts (selector %q) in %s: ", what, len(outcomes), selector, took.Round(10*time.Millisecond))
	for i, name := range buckets() {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%d %s", counts[name], name)
	}
	labels := map[*outcomeGroup]string{}
	if tool == toolFleetRead {
		var versions []*outcomeGroup
		for _, g := range groups {
			if g.status == bucketSucceeded {
				versions = append(versions, g)
				sr.Versions = append(sr.Versions, readVersion{SHA256: g.sha, Hosts: len(g.hosts), Bytes: g.hosts[0].Bytes})
			}
		}
		fmt.Fprintf(&b, "; %s", versionSummary(versions))
		for i, g := range versions {
			labels[g] = fmt.Sprintf("version %d of %d", i+1, len(versions))
		}
	}
	b.WriteString("\n")
	b.WriteString(renderGroups(groups, labels, tool == toolFleetRead, fanoutBudget-b.Len()))

	res := textResult(b.String())
	res.StructuredContent = sr
	// Like bash: a command that failed or timed out somewhere is an
	// error, and so is a fan-out that succeeded nowhere. Offline or
	// denied hosts alone are not: the summary names them.
	res.IsError = counts[bucketFailed]+counts[bucketTimedOut] > 0 || counts[bucketSucceeded] == 0
	return res
}

// versionSummary says how many distinct versions the hosts have:
// "3 distinct versions: a1b2c3d4e5f6 on 998 hosts, …".
func versionSummary(versions []*outcomeGroup) string {
	if len(versions) == 0 {
		return "no host returned the file"
	}
	var b strings.Builder
	if len(versions) == 1 {
		b.WriteString("1 version: ")
	} else {
		fmt.Fprintf(&b, "%d distinct versions: ", len(versions))
	}
	for i, g := range versions {
		if i == 5 {
			fmt.Fprintf(&b, ", … %d more", len(versions)-5)
			break
		}
		if i > 0 {
			b.WriteString(", ")
		}
		h := "sha256 unknown"
		if g.known {
			h = g.sha[:12]
		}
		fmt.Fprintf(&b, "%s on %d %s", h, len(g.hosts), plural(len(g.hosts), "host", "hosts"))
	}
	return b.String()
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// renderGroups writes the groups within budget bytes: all headers that
// fit, each with at least minShownBody of its output, and then shares
// what is left between the outputs. Hosts whose command printed one short
// line of its own (hostname, a version) are listed one line each,
// "host: line", under one header per outcome.
func renderGroups(groups []*outcomeGroup, labels map[*outcomeGroup]string, head bool, budget int) string {
	if len(groups) == 0 {
		return ""
	}
	// Host lists share half the budget; those of hosts that did not
	// succeed get more room, since they are what needs attention.
	listCap := min(max(budget/(2*len(groups)), 48), 4000)
	trouble := 0
	for _, g := range groups {
		if g.status != bucketSucceeded {
			trouble++
		}
	}
	troubleCap := min(max(budget/(4*max(trouble, 1)), listCap), 4000)
	// One-line hosts are listed compactly in runs of at least two with
	// the same outcome.
	compact := make([]bool, len(groups))
	for i := 0; i < len(groups); {
		j := i
		for j < len(groups) && !head && oneLiner(groups[j]) && groups[j].status == groups[i].status && groups[j].note == groups[i].note {
			j++
		}
		for k := i; k < j && j-i >= 2; k++ {
			compact[k] = true
		}
		i = max(j, i+1)
	}
	headers := make([]string, 0, len(groups))
	avail := budget - omittedReserve
	used := 0
	for i, g := range groups {
		var h string
		switch {
		case compact[i]:
			h = g.hosts[0].Host + ": " + strings.TrimSuffix(g.body, "\n")
			if i == 0 || !compact[i-1] || groups[i-1].status != g.status || groups[i-1].note != g.note {
				h = sectionHeader(groups[i:], compact[i:]) + "\n" + h
			}
		case g.status != bucketSucceeded:
			h = groupHeader(g, labels[g], troubleCap)
		default:
			h = groupHeader(g, labels[g], listCap)
		}
		cost := len(h) + 1
		if body := displayBody(g, compact[i]); body != "" {
			cost += min(len(body), minShownBody) + 1
		}
		if used+cost > avail {
			break
		}
		used += cost
		headers = append(headers, h)
	}
	shown := groups[:len(headers)]
	// Share the rest of the budget: outputs that need less than an equal
	// share get what they need, the others split what remains.
	extra := make([]int, len(shown))
	need := make([]int, len(shown))
	for i, g := range shown {
		need[i] = max(len(displayBody(g, compact[i]))-minShownBody, 0)
	}
	left := avail - used
	waterFill(need, extra, left)

	var b strings.Builder
	for i, g := range shown {
		b.WriteString(headers[i])
		b.WriteByte('\n')
		body := displayBody(g, compact[i])
		if body == "" {
			continue
		}
		allot := min(len(body), minShownBody) + extra[i]
		if allot < len(body) {
			body = cutBody(body, max(allot-cutMarkerLen, 0), head)
		}
		b.WriteString(body)
		if !strings.HasSuffix(body, "\n") {
			b.WriteByte('\n')
		}
	}
	if rest := groups[len(shown):]; len(rest) > 0 {
		b.WriteString(omittedLine(rest))
	}
	return b.String()
}

// maxOneLiner bounds the output of a host listed on one line.
const maxOneLiner = 200

// oneLiner reports whether g is one host whose output is one short line.
func oneLiner(g *outcomeGroup) bool {
	if len(g.hosts) != 1 || g.hosts[0].FullOutput != "" || g.status != bucketSucceeded && g.status != bucketFailed && g.status != bucketTimedOut {
		return false
	}
	line := strings.TrimSuffix(g.body, "\n")
	return line != "" && len(line) <= maxOneLiner && !strings.ContainsAny(line, "\n\r")
}

// sectionHeader heads a run of one-line hosts with the same outcome.
func sectionHeader(run []*outcomeGroup, compact []bool) string {
	n := 0
	for n < len(run) && compact[n] && run[n].status == run[0].status && run[n].note == run[0].note {
		n++
	}
	what := run[0].status
	if run[0].note != "" && run[0].note != what {
		what += ", " + run[0].note
	}
	return fmt.Sprintf("--- %s — %d %s, each its own output (host: output) ---", what, n, plural(n, "host", "hosts"))
}

// waterFill gives each of need up to its need from total, in equal shares.
func waterFill(need, got []int, total int) {
	open := 0
	for _, n := range need {
		if n > 0 {
			open++
		}
	}
	for total > 0 && open > 0 {
		share := max(total/open, 1)
		for i, n := range need {
			if got[i] >= n || total == 0 {
				continue
			}
			give := min(share, n-got[i], total)
			got[i] += give
			total -= give
			if got[i] >= n {
				open--
			}
		}
	}
}

// displayBody is what a group shows under its header (nothing for a
// host listed on one line).
func displayBody(g *outcomeGroup, compact bool) string {
	if compact {
		return ""
	}
	switch g.status {
	case bucketSucceeded, bucketFailed, bucketTimedOut:
		return g.body
	}
	return ""
}

// cutBody keeps n bytes of s, its end (a command's tail) or its start
// (a file's head), preferably at a line break, and says what it kept.
func cutBody(s string, n int, head bool) string {
	if head {
		kept := s[:n]
		for len(kept) > 0 && !utf8.RuneStart(s[len(kept)]) {
			kept = kept[:len(kept)-1]
		}
		if i := strings.LastIndexByte(kept, '\n'); i >= len(kept)/2 {
			kept = kept[:i+1]
		}
		return fmt.Sprintf("%s\n[first %s of %s shown]", strings.TrimRight(kept, "\n"), humanBytes(len(kept)), humanBytes(len(s)))
	}
	kept := s[len(s)-n:]
	for len(kept) > 0 && !utf8.RuneStart(kept[0]) {
		kept = kept[1:]
	}
	if i := strings.IndexByte(kept, '\n'); i >= 0 && i < len(kept)/2 {
		kept = kept[i+1:]
	}
	return fmt.Sprintf("[last %s of %s shown]\n%s", humanBytes(len(kept)), humanBytes(len(s)), kept)
}

func humanBytes(n int) string {
	if n < 1024 {
		return strconv.Itoa(n) + " B"
	}
	return strconv.FormatFloat(float64(n)/1024, 'f', 1, 64) + " KB"
}

// groupHeader is a group's first line: outcome, hosts and, for a single
// host, why it did not succeed.
func groupHeader(g *outcomeGroup, label string, listCap int) string {
	var b strings.Builder
	b.WriteString("--- ")
	switch {
	case label != "" && g.known:
		fmt.Fprintf(&b, "%s: sha256 %s", label, g.sha)
	case label != "":
		fmt.Fprintf(&b, "%s: sha256 unknown (not reported by the host; same text)", label)
	default:
		b.WriteString(g.status)
		if g.note != "" && g.note != g.status {
			b.WriteString(", " + g.note)
		}
	}
	names := make([]string, len(g.hosts))
	for i, o := range g.hosts {
		names[i] = o.Host
	}
	fmt.Fprintf(&b, " — %d %s: %s", len(names), plural(len(names), "host", "hosts"), compressNames(names, listCap))
	if len(g.hosts) == 1 {
		o := g.hosts[0]
		// The header names the host and the outcome already: the reason
		// says only what they do not.
		reason := strings.TrimPrefix(oneLine(o.Reason), "host "+o.Host+": ")
		if o.Status == bucketDenied && g.note == noteHostPolicy {
			reason = strings.TrimPrefix(reason, "denied by host policy: ")
		}
		if r := textutil.Truncate(reason, 300); r != "" && r != g.note && o.Status != bucketSucceeded && !strings.HasPrefix(r, "Command ") {
			b.WriteString(" — " + r)
		}
		if o.FullOutput != "" {
			b.WriteString(" — full output: " + o.FullOutput)
		}
	} else if slices.ContainsFunc(g.hosts, func(o *hostOutcome) bool { return o.FullOutput != "" }) {
		b.WriteString(" — full outputs: see structuredContent")
	}
	b.WriteString(" ---")
	return b.String()
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

// omittedLine counts the groups that did not fit.
func omittedLine(rest []*outcomeGroup) string {
	hosts := 0
	per := map[string]int{}
	for _, g := range rest {
		hosts += len(g.hosts)
		per[g.status] += len(g.hosts)
	}
	var parts []string
	for _, s := range buckets() {
		if per[s] > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", per[s], s))
		}
	}
	return fmt.Sprintf("[%d more %s in %d %s not shown (%s): the %dKB budget is spent; every host's outcome is in structuredContent.hosts]\n",
		hosts, plural(hosts, "host", "hosts"), len(rest), plural(len(rest), "group", "groups"), strings.Join(parts, ", "), fanoutBudget>>10)
}

// compressNames lists host names in natural order, writing runs of
// numbered names as ranges (web-001..web-120), within about max bytes;
// what does not fit is counted.
func compressNames(names []string, maxLen int) string {
	type numbered struct {
		prefix, digits string
		n              int
		name           string
	}
	ns := make([]numbered, len(names))
	for i, name := range names {
		j := len(name)
		for j > 0 && name[j-1] >= '0' && name[j-1] <= '9' {
			j--
		}
		d := name[j:]
		n, err := strconv.Atoi(d)
		if d == "" || len(d) > 9 || err != nil {
			n, d = -1, ""
			j = len(name)
		}
		ns[i] = numbered{prefix: name[:j], digits: d, n: n, name: name}
	}
	slices.SortFunc(ns, func(a, b numbered) int {
		return cmp.Or(strings.Compare(a.prefix, b.prefix), cmp.Compare(a.n, b.n), cmp.Compare(len(a.digits), len(b.digits)), strings.Compare(a.name, b.name))
	})
	// Two numbers follow each other in a run when the second is one more
	// and both are written alike: zero-padded to the same width, or not
	// padded at all (web-9, web-10).
	follows := func(a, b numbered) bool {
		unpadded := func(x numbered) bool { return x.digits == "0" || x.digits[0] != '0' }
		return a.n >= 0 && b.n == a.n+1 && a.prefix == b.prefix &&
			(len(a.digits) == len(b.digits) || unpadded(a) && unpadded(b))
	}
	var b strings.Builder
	for i := 0; i < len(ns); {
		j := i + 1
		for j < len(ns) && follows(ns[j-1], ns[j]) {
			j++
		}
		entry := ns[i].name
		if j-i >= 3 && ns[i].n >= 0 {
			entry = ns[i].name + ".." + ns[j-1].name
		} else {
			j = i + 1
		}
		sep := ""
		if b.Len() > 0 {
			sep = ", "
		}
		if b.Len()+len(sep)+len(entry) > maxLen && b.Len() > 0 {
			fmt.Fprintf(&b, ", … %d more", len(ns)-i)
			break
		}
		b.WriteString(sep + entry)
		i = j
	}
	return b.String()
}
