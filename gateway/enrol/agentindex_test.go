package enrol

import (
	"testing"
)

// A record this gateway wrote is held at once, so that an old copy put
// back over it before the watch read it (the bucket keeps one entry per
// host, so the watch may never see the write) does not leave the index
// with the record before. The watch's revision is left to the watch.
func TestAgentIndexHoldsOwnWrite(t *testing.T) {
	x := NewIndex()
	revoked := 0
	x.OnRevoked(func(string) { revoked++ })
	first := &AgentRecord{Host: "alpha", PublicKey: "UKEY1", Labels: map[string]string{"env": "test"}, Gen: 1}
	x.Apply("alpha", 1, first)

	second := first.Clone()
	second.Labels = map[string]string{"env": "prod"}
	second.Gen = 2
	x.wrote(&second, 2)
	if rev, _ := x.Progress(); rev != 1 {
		t.Errorf("a write of its own moved the watch's revision to %d, want 1", rev)
	}
	// The watch never sees revision 2: the old copy replaced it first.
	old := first.Clone()
	x.Apply("alpha", 3, &old)
	if r, _ := x.Record("alpha"); r.Gen != 2 || r.Labels["env"] != "prod" {
		t.Errorf("after an old copy replaced the write unseen, the index holds gen %d %v; want gen 2, env=prod", r.Gen, r.Labels)
	}
	if rev, _ := x.Progress(); rev != 3 {
		t.Errorf("watch revision %d after the old copy, want 3", rev)
	}

	// The watch delivering the write later changes nothing.
	late := second.Clone()
	x.Apply("alpha", 2, &late)
	if r, _ := x.Record("alpha"); r.Gen != 2 {
		t.Errorf("gen %d after the late delivery, want 2", r.Gen)
	}
	// An older generation does not replace a newer record; a revocation
	// a write makes is told once.
	x.wrote(&AgentRecord{Host: "alpha", PublicKey: "UKEY1", Gen: 1}, 4)
	if r, _ := x.Record("alpha"); r.Gen != 2 {
		t.Errorf("an older write replaced gen 2 with gen %d", r.Gen)
	}
	rec := second.Clone()
	rec.Gen = 3
	rec.RevokedKeys = []RevokedKey{{PublicKey: "UKEY0"}}
	x.wrote(&rec, 4)
	seen := rec.Clone()
	x.Apply("alpha", 4, &seen)
	if revoked != 1 {
		t.Errorf("a newly revoked key was told %d times, want once", revoked)
	}
	if h, ok := x.KeyHost("UKEY0"); !ok || h != "alpha" {
		t.Errorf("the revoked key maps to %q, %v; want alpha", h, ok)
	}

	// A write the watch has passed already (the record was removed after
	// it) does not bring the record back.
	x.Apply("alpha", 6, nil)
	late4 := rec.Clone()
	late4.Gen = 4
	x.wrote(&late4, 5)
	if r, ok := x.Record("alpha"); ok {
		t.Errorf("a write the watch had passed brought back a removed record: gen %d", r.Gen)
	}
}
