package hacheck

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/fleetmcp/fleetmcp/gateway/audit"
)

// Record is an audit record as the stream holds it.
type Record struct {
	Seq   uint64
	MsgID string
	audit.Record
}

// State is what the fleet holds once the run is over and the faults are
// healed, as the caller read it.
type State struct {
	// Records is the whole audit stream.
	Records []Record
	// Hosts are, for each replica, the hosts it lists and their states
	// (online, offline, revoked).
	Hosts []map[string]string
	// Agents are the hosts in the agent records (enrolled).
	Agents []string
	// TokenUsed is how many enrolments the workload's join token counts
	// (when the workload enrolled).
	TokenUsed int
}

// Report is what the checker found.
type Report struct {
	RunID     string
	Ops       int
	ByOutcome map[Outcome]int
	// Records is how many records of this run the stream holds.
	Records int
	// Lost are answered calls without a record; Duplicates tags or call
	// IDs stored more than once; Phantoms records of this run that no
	// call made; Mismatched records that do not say what their call did.
	Lost, Duplicates, Phantoms, Mismatched []string
	// UnansweredStored counts calls whose client got no answer (or a
	// refusal, or a withheld result) but which have a record.
	UnansweredStored int
	// Enrolments: acknowledged, those not in the agent records, and the
	// token's count against the range the history allows.
	Enrolled          int
	LostEnrolments    []string
	RefusedButEnroled []string
	TokenUsed         int
	TokenRange        [2]int
	TokenProblem      string
	// Registry lists disagreements between replicas and hosts not online.
	Registry []string
	// Faults says what each fault cost.
	Faults []FaultReport
}

// FaultReport is what clients saw after one fault.
type FaultReport struct {
	What string
	At   time.Time
	// Failed counts operations in flight at the fault or started before
	// the next mark that were not answered with their result.
	Failed int
	// Recovery is how long after the fault every worker had a call
	// answered with its result again, started after the fault (-1: not
	// within the run).
	Recovery time.Duration
	// MaxLatency is the longest answered call in flight at the fault or
	// started within Recovery after it.
	MaxLatency time.Duration
}

// OK reports whether nothing was lost, duplicated or made up, and the
// registries and the token agree with the history.
func (r *Report) OK() bool {
	return len(r.Lost) == 0 && len(r.Duplicates) == 0 && len(r.Phantoms) == 0 && len(r.Mismatched) == 0 &&
		len(r.LostEnrolments) == 0 && len(r.RefusedButEnroled) == 0 && r.TokenProblem == "" && len(r.Registry) == 0
}

// Verify checks st against h; hosts are the hosts the calls went to.
func Verify(h *History, st *State, hosts []string) *Report {
	ops := h.Ops()
	r := &Report{RunID: h.RunID, Ops: len(ops), ByOutcome: map[Outcome]int{}}
	byTag := map[string][]Record{}
	ids := map[string]int{}
	for _, rec := range st.Records {
		// Message IDs are random (the gateway's own, for de-duplication):
		// a call stored twice shows as its call ID twice.
		ids[rec.CallID]++
		if rec.MsgID == "" {
			r.Mismatched = append(r.Mismatched, fmt.Sprintf("record %d (call %s): no message ID, so a resend could have stored it twice", rec.Seq, rec.CallID))
		}
		if strings.HasPrefix(rec.ExecutionID, h.RunID+"-") {
			byTag[rec.ExecutionID] = append(byTag[rec.ExecutionID], rec)
		}
	}
	for id, n := range ids {
		if n > 1 {
			r.Duplicates = append(r.Duplicates, fmt.Sprintf("call ID %s stored %d times", id, n))
		}
	}
	issued := map[string]bool{}
	for _, op := range ops {
		r.ByOutcome[op.Outcome]++
		if op.Kind != "call" {
			continue
		}
		issued[op.Tag] = true
		recs := byTag[op.Tag]
		r.Records += len(recs)
		r.checkCall(op, recs)
	}
	for tag := range byTag {
		if !issued[tag] {
			r.Phantoms = append(r.Phantoms, tag)
		}
	}
	r.checkEnrolments(ops, st)
	r.checkRegistry(st, hosts)
	r.Faults = faults(ops, h.Marks())
	for _, l := range [][]string{r.Lost, r.Duplicates, r.Phantoms, r.Mismatched, r.LostEnrolments, r.Registry} {
		sort.Strings(l)
	}
	return r
}

func (r *Report) checkCall(op Op, recs []Record) {
	answered := op.Outcome == OK || op.Outcome == ToolError
	switch {
	case len(recs) > 1:
		r.Duplicates = append(r.Duplicates, fmt.Sprintf("call %s (%s) has %d records", op.Tag, op.Outcome, len(recs)))
	case len(recs) == 0 && answered:
		r.Lost = append(r.Lost, fmt.Sprintf("call %s (%s through gateway %d at %s) has no record", op.Tag, op.Outcome, op.Gateway, op.End.Format(time.StampMilli)))
	case len(recs) == 1 && !answered:
		r.UnansweredStored++
	}
	if len(recs) != 1 {
		return
	}
	rec := recs[0]
	if !slices.Equal(rec.Hosts, []string{op.Host}) || rec.Tool != "bash" {
		r.Mismatched = append(r.Mismatched, fmt.Sprintf("call %s: record of %s on %v, the call was bash on %s", op.Tag, rec.Tool, rec.Hosts, op.Host))
	}
	if op.Outcome == OK && rec.Outcome != "ok" {
		r.Mismatched = append(r.Mismatched, fmt.Sprintf("call %s answered ok, its record says %s (%s)", op.Tag, rec.Outcome, rec.Error))
	}
}

func (r *Report) checkEnrolments(ops []Op, st *State) {
	enrolled := map[string]bool{}
	for _, a := range st.Agents {
		enrolled[a] = true
	}
	lo, unsure := 0, 0
	for _, op := range ops {
		if op.Kind != "enrol" {
			continue
		}
		switch op.Outcome {
		case OK:
			lo++
			r.Enrolled++
			if !enrolled[op.Host] {
				r.LostEnrolments = append(r.LostEnrolments, op.Host)
			}
		case Failed:
			// An enrolment whose answer was lost spent a use if it
			// is stored: the token must count it.
			if enrolled[op.Host] {
				lo++
			} else {
				unsure++
			}
		default:
			if enrolled[op.Host] {
				r.RefusedButEnroled = append(r.RefusedButEnroled, op.Host)
			}
		}
	}
	if lo+unsure == 0 {
		return
	}
	r.TokenUsed, r.TokenRange = st.TokenUsed, [2]int{lo, lo + unsure}
	if st.TokenUsed < lo || st.TokenUsed > lo+unsure {
		r.TokenProblem = fmt.Sprintf("the join token counts %d enrolments; the history allows %d to %d", st.TokenUsed, lo, lo+unsure)
	}
}

func (r *Report) checkRegistry(st *State, hosts []string) {
	for i, m := range st.Hosts {
		for _, h := range hosts {
			if m[h] != "online" {
				r.Registry = append(r.Registry, fmt.Sprintf("replica %d lists %s as %q", i, h, m[h]))
			}
		}
		if i > 0 {
			a, b := slices.Sorted(maps.Keys(st.Hosts[0])), slices.Sorted(maps.Keys(m))
			if !slices.Equal(a, b) {
				r.Registry = append(r.Registry, fmt.Sprintf("replica %d lists hosts %v, replica 0 %v", i, b, a))
			}
		}
	}
}

// faults measures each mark: what failed until the next mark, and when
// every worker was served again.
func faults(ops []Op, marks []Mark) []FaultReport {
	var out []FaultReport
	workers := map[int]bool{}
	for _, op := range ops {
		if op.Kind == "call" {
			workers[op.Worker] = true
		}
	}
	for i, m := range marks {
		end := time.Now()
		if i+1 < len(marks) {
			end = marks[i+1].At
		}
		fr := FaultReport{What: m.What, At: m.At, Recovery: -1}
		served := map[int]time.Time{}
		for _, op := range ops {
			if op.Kind != "call" {
				continue
			}
			inFlight := op.Start.Before(m.At) && op.End.After(m.At)
			if (inFlight || !op.Start.Before(m.At) && op.Start.Before(end)) && op.Outcome != OK {
				fr.Failed++
			}
			if op.Outcome == OK && !op.Start.Before(m.At) {
				if t, ok := served[op.Worker]; !ok || op.End.Before(t) {
					served[op.Worker] = op.End
				}
			}
		}
		if len(served) == len(workers) {
			var last time.Time
			for _, t := range served {
				if t.After(last) {
					last = t
				}
			}
			fr.Recovery = last.Sub(m.At)
		}
		horizon := end
		if fr.Recovery >= 0 {
			horizon = m.At.Add(fr.Recovery)
		}
		for _, op := range ops {
			if op.Kind == "call" && op.Outcome == OK && op.End.After(m.At) && op.Start.Before(horizon) {
				fr.MaxLatency = max(fr.MaxLatency, op.End.Sub(op.Start))
			}
		}
		out = append(out, fr)
	}
	return out
}

// String is the report for people.
func (r *Report) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "run %s: %d operations", r.RunID, r.Ops)
	for _, o := range []Outcome{OK, ToolError, Withheld, Refused, Failed} {
		fmt.Fprintf(&b, ", %s %d", o, r.ByOutcome[o])
	}
	fmt.Fprintf(&b, "\n  audit: %d records of this run; lost %d, duplicated %d, phantom %d, mismatched %d; unanswered calls with a record: %d\n",
		r.Records, len(r.Lost), len(r.Duplicates), len(r.Phantoms), len(r.Mismatched), r.UnansweredStored)
	if r.TokenRange != [2]int{} || r.Enrolled > 0 {
		fmt.Fprintf(&b, "  enrolments: %d acknowledged, %d missing from the agent records, %d refused yet enrolled; token counts %d (history allows %d-%d)\n",
			r.Enrolled, len(r.LostEnrolments), len(r.RefusedButEnroled), r.TokenUsed, r.TokenRange[0], r.TokenRange[1])
	}
	fmt.Fprintf(&b, "  registry: %d problems\n", len(r.Registry))
	for _, f := range r.Faults {
		rec := "not within the run"
		if f.Recovery >= 0 {
			rec = f.Recovery.Round(10 * time.Millisecond).String()
		}
		fmt.Fprintf(&b, "  %s: %d calls not answered with their result; every worker served again after %s; longest answered call %s\n",
			f.What, f.Failed, rec, f.MaxLatency.Round(10*time.Millisecond))
	}
	for _, l := range []struct {
		name string
		list []string
	}{{"lost", r.Lost}, {"duplicate", r.Duplicates}, {"phantom", r.Phantoms}, {"mismatch", r.Mismatched},
		{"lost enrolment", r.LostEnrolments}, {"refused yet enrolled", r.RefusedButEnroled}, {"registry", r.Registry}} {
		for i, s := range l.list {
			if i == 10 {
				fmt.Fprintf(&b, "  %s: ... %d more\n", l.name, len(l.list)-10)
				break
			}
			fmt.Fprintf(&b, "  %s: %s\n", l.name, s)
		}
	}
	if r.TokenProblem != "" {
		fmt.Fprintf(&b, "  token: %s\n", r.TokenProblem)
	}
	return b.String()
}
