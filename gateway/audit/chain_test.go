package audit

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
)

// chainFixture builds stored messages the way the writer chains them.
type chainFixture struct {
	seal *testSealer
	msgs []chainMsg
	tail chainLink
	now  time.Time
}

func newChainFixture(t *testing.T) *chainFixture {
	t.Helper()
	return &chainFixture{seal: testSeal(t), now: time.Now()}
}

// unchained appends a record as a gateway stored it before chaining.
func (f *chainFixture) unchained(id string) {
	data := recordJSON(id, "bash")
	seq := f.tail.seq + 1
	seal := f.seal.Mark(false, id, data)
	f.msgs = append(f.msgs, chainMsg{Seq: seq, Time: f.now, Seal: seal, Data: data})
	f.tail = chainLink{seq: seq, digest: chainDigest(seq, "", seal, data), time: f.now}
}

// chained appends a record as the writer stores it.
func (f *chainFixture) chained(id, tool string) {
	data := recordJSON(id, tool)
	prev := f.tail.header()
	seq := f.tail.seq + 1
	seal := f.seal.Mark(true, id, chainSealInput(prev, data))
	f.msgs = append(f.msgs, chainMsg{Seq: seq, Time: f.now, Prev: prev, Seal: seal, Data: data})
	f.tail = chainLink{seq: seq, digest: chainDigest(seq, prev, seal, data), time: f.now}
}

func recordJSON(id, tool string) []byte {
	d, _ := json.Marshal(Record{CallID: id, Tool: tool, Decision: DecisionAllowed, Outcome: OutcomeOK, Reason: "reason of " + id})
	return d
}

func (f *chainFixture) verify(msgs []chainMsg, streamLast uint64) ChainReport {
	v := newChainVerifier(f.seal, 24*time.Hour, f.now)
	for _, m := range msgs {
		v.add(m)
	}
	return v.finish(streamLast)
}

// problems renders a report's problems as "kind@seq" for comparison.
func problems(r ChainReport) string {
	var out []string
	for _, p := range r.Problems {
		out = append(out, fmt.Sprintf("%s@%d", p.Kind, p.Seq))
	}
	return strings.Join(out, " ")
}

// Each way a record can be removed, changed or moved is named with its
// sequence; a whole chain, and one whose first records were stored before
// chaining, verify.
func TestChainVerify(t *testing.T) {
	f := newChainFixture(t)
	f.unchained("old1")
	f.unchained("old2")
	for i := range 6 {
		f.chained(fmt.Sprintf("c%d", i), "bash")
	}
	all := f.msgs // seqs 1-2 unchained, 3-8 chained
	last := uint64(len(all))

	drop := func(i int) []chainMsg { return append(append([]chainMsg{}, all[:i]...), all[i+1:]...) }
	swapped := append([]chainMsg{}, all...)
	swapped[4].Data, swapped[5].Data = swapped[5].Data, swapped[4].Data
	swapped[4].Prev, swapped[5].Prev = swapped[5].Prev, swapped[4].Prev
	swapped[4].Seal, swapped[5].Seal = swapped[5].Seal, swapped[4].Seal
	changed := append([]chainMsg{}, all...)
	changed[5].Data = bytes.Replace(changed[5].Data, []byte(`"outcome":"ok"`), []byte(`"outcome":"error"`), 1)
	resealed := append([]chainMsg{}, all...)
	// A record replaced by a well-formed one with a seal of its own (as
	// a sealing key holder could): its successor's link still breaks.
	other := recordJSON("other", "bash")
	resealed[5].Data = other
	resealed[5].Seal = f.seal.Mark(true, "other", chainSealInput(resealed[5].Prev, other))
	forged := append(append([]chainMsg{}, all...), chainMsg{Seq: last + 1, Time: f.now, Data: recordJSON("forged", "bash")})

	cases := []struct {
		name       string
		msgs       []chainMsg
		streamLast uint64
		intact     bool
		want       string
	}{
		{"whole", all, last, true, ""},
		{"a record removed in the middle", drop(5), last, false, "missing@7 broken_link@7"},
		{"the last record removed", all[:len(all)-1], last, false, "missing@8"},
		{"the head cut", all[5:], last, false, "head_missing@6"},
		{"two records out of place", swapped, last, false, "broken_link@5 broken_link@6 broken_link@7"},
		{"a record changed", changed, last, false, "unsealed@6 broken_link@7"},
		{"a record replaced and resealed", resealed, last, false, "broken_link@7"},
		{"an unchained record appended", forged, last + 1, false, "unchained@9 unsealed@9"},
		{"only records from before chaining", all[:2], 2, true, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := f.verify(c.msgs, c.streamLast)
			if r.Intact != c.intact || problems(r) != c.want {
				t.Errorf("intact %v, problems %q; want %v, %q\n%s", r.Intact, problems(r), c.intact, c.want, r.Summary())
			}
		})
	}
	r := f.verify(all, last)
	if r.Unchained != 2 || r.Chained != 6 || r.First != 1 || r.Last != 8 || !strings.Contains(r.Summary(), "2 stored before chaining") {
		t.Errorf("report %+v\n%s", r, r.Summary())
	}
}

// A first record whose predecessor retention removed is no gap; one whose
// predecessor retention would still keep is.
func TestChainVerifyHead(t *testing.T) {
	f := newChainFixture(t)
	f.tail = chainLink{seq: 41, digest: strings.Repeat("ab", 32), time: f.now.Add(-25 * time.Hour)}
	f.chained("after-age-out", "bash")
	r := f.verify(f.msgs, 42)
	if !r.Intact || !r.AgedOut {
		t.Errorf("aged out: %+v", r)
	}
	f = newChainFixture(t)
	f.tail = chainLink{seq: 41, digest: strings.Repeat("ab", 32), time: f.now.Add(-time.Hour)}
	f.chained("after-cut", "bash")
	r = f.verify(f.msgs, 42)
	if r.Intact || problems(r) != "head_missing@42" || !strings.Contains(r.Problems[0].Detail, "sequences up to 41 were removed") {
		t.Errorf("cut: %s", r.Summary())
	}
}

// A gap record keeps the trail from reading as intact and is listed.
func TestChainVerifyGapRecord(t *testing.T) {
	f := newChainFixture(t)
	f.chained("c1", "bash")
	f.chained("gap", auditGapTool)
	r := f.verify(f.msgs, 2)
	if r.Intact || len(r.Gaps) != 1 || r.Gaps[0].Seq != 2 || problems(r) != "recorded_gap@2" {
		t.Errorf("%+v\n%s", r, r.Summary())
	}
}

func TestParseChainLink(t *testing.T) {
	d := strings.Repeat("0f", 32)
	good := []chainLink{{}, {seq: 7, digest: d, time: time.Unix(0, 1700000000123456789)}, {seq: 9}, {seq: 3, time: time.Unix(5, 0)}}
	for _, l := range good {
		got, err := parseChainLink(l.header())
		if err != nil || got.seq != l.seq || got.digest != l.digest || !got.time.Equal(l.time) {
			t.Errorf("%q: %+v, %v", l.header(), got, err)
		}
	}
	for _, s := range []string{"", "1", "1 - - x", "x - -", "1 zz -", "1 " + d[:10] + " -", "1 - -5", "1 - abc", "0 " + d + " -", "0 - 5", "-1 - -"} {
		if _, err := parseChainLink(s); err == nil {
			t.Errorf("%q parsed", s)
		}
	}
}

func FuzzParseChainLink(f *testing.F) {
	f.Add("0 - -")
	f.Add("12 " + strings.Repeat("ab", 32) + " 1700000000000000000")
	f.Add("1 - 5")
	f.Fuzz(func(t *testing.T, s string) {
		l, err := parseChainLink(s)
		if err != nil {
			return
		}
		again, err := parseChainLink(l.header())
		if err != nil || again.seq != l.seq || again.digest != l.digest || !again.time.Equal(l.time) {
			t.Fatalf("%q -> %q does not read back: %+v %v", s, l.header(), again, err)
		}
	})
}
