//go:build unix

package agent

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// TestConfigRefusesWhatCannotBeAnnounced: a working directory or shell
// beyond the protocol's announce limits stop the agent at start
// with an error naming the setting, rather than an agent every gateway
// ignores.
func TestConfigRefusesWhatCannotBeAnnounced(t *testing.T) {
	tests := []struct {
		name string
		mod  func(*Config)
		want []string
	}{
		{"cwd", func(c *Config) { c.Cwd = "/" + strings.Repeat("d", protocol.MaxPathLen) }, []string{"--cwd", "4096", "shorter working directory"}},
		{"shell", func(c *Config) { c.Shell = "/" + strings.Repeat("s", protocol.MaxPathLen) }, []string{"--shell", "4096"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Config{Servers: []string{"nats://127.0.0.1:1"}, Name: "h1", StateDir: t.TempDir(), Cwd: t.TempDir(), Logger: quietLogger()}
			tc.mod(&cfg)
			_, err := New(cfg)
			if err == nil {
				t.Fatal("New accepted it")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
			if len(err.Error()) > 500 {
				t.Errorf("error of %d bytes quotes too much", len(err.Error()))
			}
		})
	}
}

// TestCatalogBounded: the catalog keeps at most protocol.MaxSkills skills
// (the first by name), and cuts an invalid skill's description and
// problem to what can be announced.
func TestCatalogBounded(t *testing.T) {
	root := filepath.Join(t.TempDir(), "skills")
	for i := range protocol.MaxSkills + 5 {
		writeSkill(t, root, fmt.Sprintf("s%04d", i), "does a thing", "")
	}
	huge := strings.Repeat("é", 300000) // invalid: over 1024 characters
	writeSkill(t, root, "a-big", "", "---\nname: a-big\ndescription: "+huge+"\nunknown-"+strings.Repeat("k", 5000)+": 1\n---\n")
	c := newCatalog(root, "h1", testGuard(t, nil), quietLogger())
	skills := c.list()
	if len(skills) != protocol.MaxSkills {
		t.Fatalf("catalog has %d skills, want %d", len(skills), protocol.MaxSkills)
	}
	if skills[0].Name != "a-big" || skills[len(skills)-1].Name != fmt.Sprintf("s%04d", protocol.MaxSkills-2) {
		t.Errorf("catalog runs %s..%s; want the first skills by name", skills[0].Name, skills[len(skills)-1].Name)
	}
	a := protocol.Announce{Host: "h1", Skills: skills}
	if err := a.Validate(); err != nil {
		t.Errorf("the catalog cannot be announced: %v", err)
	}
	if big := skills[0]; big.Problem == "" || len(big.Description) > protocol.MaxSkillDescriptionLen || !strings.HasPrefix(huge, big.Description) {
		t.Errorf("invalid skill: problem %q, description of %d bytes", protocol.Excerpt(big.Problem), len(big.Description))
	}
}

// TestFitAnnounce: a catalog too large for one message is announced in
// part — as many skills as fit, first by name — rather than not at all.
func TestFitAnnounce(t *testing.T) {
	msg := protocol.Announce{Host: "h1", Cwd: "/srv"}
	for i := range 150 {
		msg.Skills = append(msg.Skills, protocol.Skill{Name: fmt.Sprintf("s%03d", i), Description: strings.Repeat("d", 1000), Path: "/p"})
	}
	for _, limit := range []int{protocol.MaxAnnounceBytes, 64 << 10, 4 << 10, 200} {
		m := msg
		data, dropped, err := fitAnnounce(&m, limit)
		if err != nil {
			t.Fatal(err)
		}
		var back protocol.Announce
		if err := json.Unmarshal(data, &back); err != nil {
			t.Fatal(err)
		}
		if len(back.Skills)+dropped != 150 || (len(data) > limit && len(back.Skills) > 0) {
			t.Errorf("limit %d: %d bytes with %d skills, %d left out", limit, len(data), len(back.Skills), dropped)
		}
		if dropped > 0 {
			m.Skills = msg.Skills[:len(back.Skills)+1]
			if more, _ := json.Marshal(m); len(more) <= limit {
				t.Errorf("limit %d: left out %d skills where %d fit", limit, dropped, dropped-1)
			}
		}
	}
}

// TestFetchWhileCallIsDecoded: a complete large call that onCall is still
// decoding is known to a fetch (answered with a keepalive), not unknown.
func TestFetchWhileCallIsDecoded(t *testing.T) {
	a := newTestAgent(t, Config{})
	if _, _, _, err := assembleTest(a, callFrame("big", 1, 2, `{"id":"big",`), "r"); err != nil {
		t.Fatal(err)
	}
	data, _, _, err := assembleTest(a, callFrame("big", 2, 2, `"x":1}`), "r")
	if err != nil || data == nil {
		t.Fatalf("complete call: %q, %v", data, err)
	}
	if _, ok := a.pend.touch("big"); !ok {
		t.Error("a call being decoded is unknown to a fetch")
	}
	a.pend.forget("big")
	if _, ok := a.pend.touch("big"); ok {
		t.Error("a call taken in is still pending")
	}
}
