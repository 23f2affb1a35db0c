//go:build unix

package agent

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fleetmcp/fleetmcp/policy"
	"github.com/fleetmcp/fleetmcp/protocol"
)

func TestParseSkill(t *testing.T) {
	long := strings.Repeat("x", 1025)
	tests := []struct {
		name, dir, text string
		wantDesc        string
		wantErr         string // substring; empty: valid
	}{
		{"minimal", "pdf", "---\nname: pdf\ndescription: Fill PDF forms.\n---\nbody\n", "Fill PDF forms.", ""},
		{"all keys", "a-b1", "---\nname: a-b1\ndescription: d\nlicense: MIT\ncompatibility: linux\nallowed-tools: Bash(git:*) Read\nmetadata:\n  author: me\n  version: \"1\"\n---\n", "d", ""},
		{"crlf and bom", "x", "\xef\xbb\xbf---\r\nname: x\r\ndescription: d\r\n---\r\nbody", "d", ""},
		{"no body", "x", "---\nname: x\ndescription: d\n---", "d", ""},
		{"block description", "x", "---\nname: x\ndescription: >\n  two\n  lines\n---\n", "two lines\n", ""},
		{"no frontmatter", "x", "# x\n", "", `first line must be "---"`},
		{"empty file", "x", "", "", `first line must be "---"`},
		{"unclosed", "x", "---\nname: x\ndescription: d\n", "", "not closed"},
		{"not a mapping", "x", "---\n- a\n---\n", "", "not a YAML mapping"},
		{"bad yaml", "x", "---\nname: [x\n---\n", "", "not a YAML mapping"},
		{"unknown key", "x", "---\nname: x\ndescription: d\nversion: 2\n---\n", "d", "unknown key(s) version"},
		{"duplicate key", "x", "---\nname: x\nname: x\ndescription: d\n---\n", "", "already defined"},
		{"metadata not strings", "x", "---\nname: x\ndescription: d\nmetadata: [a]\n---\n", "", "frontmatter"},
		{"missing name", "x", "---\ndescription: d\n---\n", "d", "name is missing"},
		{"missing description", "x", "---\nname: x\n---\n", "", "description is missing"},
		{"blank description", "x", "---\nname: x\ndescription: \"  \"\n---\n", "", "description is missing"},
		{"long description", "x", "---\nname: x\ndescription: " + long + "\n---\n", long, "1025 characters"},
		{"max description", "x", "---\nname: x\ndescription: " + long[1:] + "\n---\n", long[1:], ""},
		{"long compatibility", "x", "---\nname: x\ndescription: d\ncompatibility: " + strings.Repeat("c", 501) + "\n---\n", "d", "compatibility is 501"},
		{"name differs from folder", "y", "---\nname: x\ndescription: d\n---\n", "d", `differs from its folder name "y"`},
		{"uppercase", "PDF", "---\nname: PDF\ndescription: d\n---\n", "d", "lowercase"},
		{"underscore", "a_b", "---\nname: a_b\ndescription: d\n---\n", "d", "lowercase"},
		{"leading hyphen", "-a", "---\nname: -a\ndescription: d\n---\n", "d", "starts or ends"},
		{"trailing hyphen", "a-", "---\nname: a-\ndescription: d\n---\n", "d", "starts or ends"},
		{"double hyphen", "a--b", "---\nname: a--b\ndescription: d\n---\n", "d", "two hyphens"},
		{"name 64", strings.Repeat("n", 64), "---\nname: " + strings.Repeat("n", 64) + "\ndescription: d\n---\n", "d", ""},
		{"name 65", strings.Repeat("n", 65), "---\nname: " + strings.Repeat("n", 65) + "\ndescription: d\n---\n", "d", "65 characters"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := parseSkill(tt.dir, []byte(tt.text))
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("parseSkill: %v", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("parseSkill error = %v, want one containing %q", err, tt.wantErr)
			}
			if tt.wantDesc != "" && m.Description != tt.wantDesc {
				t.Errorf("description = %q, want %q", m.Description, tt.wantDesc)
			}
		})
	}
}

func FuzzParseSkill(f *testing.F) {
	f.Add("pdf", "---\nname: pdf\ndescription: d\n---\nbody")
	f.Add("x", "---\nname: x\nmetadata: {a: b}\n---\n")
	f.Add("x", "---\n---\n")
	f.Add("a-b", "---\r\nname: a-b\r\ndescription: >\r\n  d\r\n---")
	f.Fuzz(func(t *testing.T, dir, text string) {
		m, err := parseSkill(dir, []byte(text))
		if err != nil {
			return
		}
		if protocol.ValidateSkillName(m.Name) != nil || m.Name != dir || strings.TrimSpace(m.Description) == "" {
			t.Fatalf("parseSkill(%q) accepted %+v", text, m)
		}
	})
}

// writeSkill writes root/name/SKILL.md with the given description, or
// with text as is when text is not empty.
func testPolicy(t *testing.T, text string) *policy.Policy {
	t.Helper()
	p, err := policy.Parse([]byte(text), policy.Env{Cwd: "/", Tools: toolNames(), Shell: "/bin/sh"})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestCatalogScan(t *testing.T) {
	root := filepath.Join(t.TempDir(), "skills")
	c := newCatalog(root, "h1", testGuard(t, nil), quietLogger())
	if got := c.list(); len(got) != 0 {
		t.Fatalf("missing root: %v, want an empty catalog", got)
	}
	writeSkill(t, root, "zeta", "last one", "")
	writeSkill(t, root, "alpha", "first one", "")
	writeSkill(t, root, "broken", "", "no frontmatter\n")
	writeSkill(t, root, "secret", "hidden", "")
	if err := os.MkdirAll(filepath.Join(root, "empty-folder"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "README.md"), []byte("not a skill"), 0o644); err != nil {
		t.Fatal(err)
	}
	c = newCatalog(root, "h1", testGuard(t, testPolicy(t, "skills: {deny: [secret]}\n")), quietLogger())
	got := c.list()
	want := []protocol.Skill{
		{Name: "alpha", Description: "first one", Path: filepath.Join(root, "alpha", skillFile)},
		{Name: "broken", Path: filepath.Join(root, "broken", skillFile), Problem: `SKILL.md does not start with YAML frontmatter: its first line must be "---"`},
		{Name: "zeta", Description: "last one", Path: filepath.Join(root, "zeta", skillFile)},
	}
	if !slices.Equal(got, want) {
		t.Errorf("catalog =\n%+v\nwant\n%+v", got, want)
	}
	if _, ok := c.lookup("secret"); ok {
		t.Error("a skill the policy denies is in the catalog")
	}
}

// waitSkills polls c until check passes, for at most 3 s.
func waitSkills(t *testing.T, c *catalog, what string, check func([]protocol.Skill) bool) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for !check(c.list()) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: catalog is %+v", what, c.list())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func skillNamed(skills []protocol.Skill, name string) (protocol.Skill, bool) {
	i := slices.IndexFunc(skills, func(s protocol.Skill) bool { return s.Name == name })
	if i < 0 {
		return protocol.Skill{}, false
	}
	return skills[i], true
}

func TestCatalogWatch(t *testing.T) {
	for _, pollOnly := range []bool{false, true} {
		t.Run(fmt.Sprintf("pollOnly=%v", pollOnly), func(t *testing.T) {
			testCatalogWatch(t, pollOnly)
		})
	}
}

func testCatalogWatch(t *testing.T, pollOnly bool) {
	root := filepath.Join(t.TempDir(), "skills")
	c := newCatalog(root, "h1", testGuard(t, testPolicy(t, "skills: {deny: [\"hidden-*\"]}\n")), quietLogger())
	c.pollOnly = pollOnly
	if pollOnly {
		c.pollEvery = 200 * time.Millisecond // still a poll, but a quick test
	}
	changes := make(chan struct{}, 100)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.watch(ctx, func() { changes <- struct{}{} }); close(done) }()
	defer func() { cancel(); <-done }()

	// The root appears after the watch began, then a skill in it.
	writeSkill(t, root, "one", "first", "")
	start := time.Now()
	waitSkills(t, c, "added skill", func(s []protocol.Skill) bool { _, ok := skillNamed(s, "one"); return ok })
	if d := time.Since(start); d > 2*time.Second+500*time.Millisecond {
		t.Errorf("new skill took %s to appear", d)
	}
	writeSkill(t, root, "two", "second", "")
	waitSkills(t, c, "second skill", func(s []protocol.Skill) bool { return len(s) == 2 })

	writeSkill(t, root, "one", "edited", "")
	waitSkills(t, c, "edited description", func(s []protocol.Skill) bool {
		sk, _ := skillNamed(s, "one")
		return sk.Description == "edited"
	})
	writeSkill(t, root, "two", "", "---\nname: two\n---\n")
	waitSkills(t, c, "invalid skill", func(s []protocol.Skill) bool {
		sk, _ := skillNamed(s, "two")
		return strings.Contains(sk.Problem, "description is missing")
	})
	writeSkill(t, root, "hidden-x", "denied", "")
	if err := os.RemoveAll(filepath.Join(root, "one")); err != nil {
		t.Fatal(err)
	}
	waitSkills(t, c, "deleted skill", func(s []protocol.Skill) bool { _, ok := skillNamed(s, "one"); return !ok })
	if _, ok := c.lookup("hidden-x"); ok {
		t.Error("a skill the policy denies appeared")
	}
	if len(changes) == 0 {
		t.Error("changes were not reported")
	}
}

// TestCatalogWatchRootRecreated: the root deleted and made again is
// watched again.
func TestCatalogWatchRootRecreated(t *testing.T) {
	root := filepath.Join(t.TempDir(), "skills")
	writeSkill(t, root, "one", "first", "")
	c := newCatalog(root, "h1", testGuard(t, nil), quietLogger())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.watch(ctx, func() {}); close(done) }()
	defer func() { cancel(); <-done }()
	// Only the watch adds a skill to the catalog (newCatalog scanned
	// before it): seen, the watch is set up.
	writeSkill(t, root, "two", "second", "")
	waitSkills(t, c, "the watch to see a new skill", func(s []protocol.Skill) bool { _, ok := skillNamed(s, "two"); return ok })
	if err := os.RemoveAll(root); err != nil {
		t.Fatal(err)
	}
	waitSkills(t, c, "root removed", func(s []protocol.Skill) bool { return len(s) == 0 })
	writeSkill(t, root, "back", "again", "")
	waitSkills(t, c, "root made again", func(s []protocol.Skill) bool { _, ok := skillNamed(s, "back"); return ok })
	writeSkill(t, root, "back", "edited", "")
	waitSkills(t, c, "edit in the new root", func(s []protocol.Skill) bool {
		sk, _ := skillNamed(s, "back")
		return sk.Description == "edited"
	})
}

// TestCatalogWatchStops: the watch returns, with its goroutines, when its
// context ends.
func TestCatalogWatchStops(t *testing.T) {
	for _, pollOnly := range []bool{false, true} {
		root := t.TempDir()
		writeSkill(t, root, "one", "first", "")
		before := runtime.NumGoroutine()
		for range 20 {
			c := newCatalog(root, "h1", testGuard(t, nil), quietLogger())
			c.pollOnly = pollOnly
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { c.watch(ctx, func() {}); close(done) }()
			time.Sleep(5 * time.Millisecond)
			cancel()
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				t.Fatalf("pollOnly=%v: watch did not return after its context ended", pollOnly)
			}
		}
		deadline := time.Now().Add(2 * time.Second)
		for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if n := runtime.NumGoroutine(); n > before {
			t.Errorf("pollOnly=%v: %d goroutines after the watches stopped, %d before", pollOnly, n, before)
		}
	}
}
