package agent

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// TestInstalledRecord: the record of installed bundles accepts, during a
// swap, the version served before and the one swapped in, and afterwards
// only what the swap left (the new one when it happened, the old one when
// it did not); it survives a restart, and a damaged or missing file is an
// empty record, so nothing is served until the desired state is checked.
func TestInstalledRecord(t *testing.T) {
	state := t.TempDir()
	a, b := "sha256:"+strings.Repeat("a", 64), "sha256:"+strings.Repeat("b", 64)
	r := loadInstalled(state, quietLogger())
	if got := r.get("deploy"); got.accepts(a) || got.accepts("") {
		t.Fatalf("an empty record accepts: %+v", got)
	}
	steps := []struct {
		do          func() error
		accept, not []string
	}{
		{func() error { return r.begin("deploy", a) }, []string{a}, []string{b}},
		{func() error { return r.abort("deploy") }, nil, []string{a, b}},
		{func() error { return r.begin("deploy", a) }, []string{a}, []string{b}},
		{func() error { return r.commit("deploy", a) }, []string{a}, []string{b}},
		{func() error { return r.begin("deploy", b) }, []string{a, b}, nil},
		{func() error { return r.abort("deploy") }, []string{a}, []string{b}},
		{func() error { return r.begin("deploy", b) }, []string{a, b}, nil},
		{func() error { return r.commit("deploy", b) }, []string{b}, []string{a}},
	}
	for i, s := range steps {
		if err := s.do(); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		// What a restart reads is what this process holds.
		for _, rec := range []*installedRecord{r, loadInstalled(state, quietLogger())} {
			got := rec.get("deploy")
			for _, id := range s.accept {
				if !got.accepts(id) {
					t.Errorf("step %d: %+v does not accept %s", i, got, id[:12])
				}
			}
			for _, id := range s.not {
				if got.accepts(id) {
					t.Errorf("step %d: %+v accepts %s", i, got, id[:12])
				}
			}
		}
	}
	if err := r.forget("deploy"); err != nil {
		t.Fatal(err)
	}
	if got := loadInstalled(state, quietLogger()).get("deploy"); got != (installedSkill{}) {
		t.Errorf("after forget: %+v", got)
	}
	for _, bad := range []string{`{`, `{"skills":{"../x":{"bundle":"` + a + `"}}}`, `{"skills":{"deploy":{"bundle":"sha256:AB"}}}`, `{"skills":{"deploy":{}}}`} {
		if err := os.WriteFile(filepath.Join(state, skillsInstalledFile), []byte(bad), 0o600); err != nil {
			t.Fatal(err)
		}
		if got := loadInstalled(state, quietLogger()).get("deploy"); got != (installedSkill{}) {
			t.Errorf("a damaged record %s is read as %+v", bad, got)
		}
	}
}

func FuzzParseInstalled(f *testing.F) {
	id := "sha256:" + strings.Repeat("c", 64)
	f.Add([]byte(`{"skills":{"deploy":{"bundle":"` + id + `"}}}`))
	f.Add([]byte(`{"skills":{"deploy":{"next":"` + id + `"}}}`))
	f.Add([]byte(`{"skills":{"deploy":{"bundle":"` + id + `","next":"sha256:x"}}}`))
	f.Add([]byte(`{"skills":{"a/b":{"bundle":"` + id + `"}}}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, data []byte) {
		by, err := parseInstalled(data)
		if err != nil {
			return
		}
		for name, s := range by {
			if protocol.ValidateSkillName(name) != nil {
				t.Fatalf("accepted the skill name %q", name)
			}
			if s.Bundle == "" && s.Next == "" || s.Bundle != "" && !validBundleID(s.Bundle) || s.Next != "" && !validBundleID(s.Next) {
				t.Fatalf("accepted %+v for %s", s, name)
			}
		}
		// What it accepts, written back, reads the same.
		again, err := json.Marshal(installedFile{Skills: by})
		if err != nil {
			t.Fatal(err)
		}
		if back, err := parseInstalled(again); err != nil || len(back) != len(by) {
			t.Fatalf("written back: %v, %d of %d", err, len(back), len(by))
		}
	})
}
