package policy

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestParseUnrestricted(t *testing.T) {
	for _, text := range []string{"", "\n\n", "# only a comment\n  # another\n", "---\n", "{}", "tools: {}\npaths:\n", "bash: {allow: [], deny: []}"} {
		p, err := Parse([]byte(text), testEnv())
		if err != nil {
			t.Errorf("Parse(%q): %v", text, err)
			continue
		}
		if !p.Unrestricted() || p.Digest() != "" {
			t.Errorf("Parse(%q): unrestricted %v, digest %q; want unrestricted and no digest", text, p.Unrestricted(), p.Digest())
		}
		want := []string{"tools: unrestricted", "paths: unrestricted", "bash: unrestricted", "skills: unrestricted"}
		if got := p.Summary(); !slices.Equal(got, want) {
			t.Errorf("Parse(%q).Summary() = %q, want %q", text, got, want)
		}
	}
	var nilPolicy *Policy
	if !nilPolicy.Unrestricted() || nilPolicy.Digest() != "" || len(nilPolicy.Summary()) != 4 {
		t.Errorf("a nil Policy is not unrestricted")
	}
}

// A mistake in the file stops the agent with an error naming it: nothing
// is silently ignored, so a typo never widens access.
func TestParseErrors(t *testing.T) {
	tests := []struct {
		name, text string
		want       []string
	}{
		{"unknown top key", "tool: {deny: [write]}", []string{"line 1", `unknown key "tool"`, "tools, paths, bash, skills and callers"}},
		{"unknown list key", "tools:\n  alow: [ls]", []string{"line 2", `unknown key "alow"`, "allow and deny"}},
		{"unknown bash key", "bash:\n  alow: [ls]", []string{"line 2", `unknown key "alow"`, "allow, deny and git"}},
		{"unknown git key", "bash:\n  git: {allow: [x.y]}", []string{"line 2", `unknown key "allow"`, "allow_config"}},
		{"unknown path key", "paths: {reads: {allow: [/x]}}", []string{`unknown key "reads"`, "allow, deny, read and write"}},
		{"unknown nested key", "paths: {read: {deny: [/x], al: [/y]}}", []string{`unknown key "al"`}},
		{"string for list", "bash: {allow: git *}", []string{`"git *" must be a list`}},
		{"list for mapping", "tools: [read]", []string{"line 1", "a seq where a mapping with keys allow and deny belongs"}},
		{"nested list", "bash: {allow: [[ls]]}", []string{"line 1", "a list entry must be a name or a pattern, not a list"}},
		{"unknown tool", "tools: {deny: [wirte]}", []string{"tools.deny", `unknown tool "wirte"`, "bash, delete, edit, list, move, patch, read, search, write"}},
		{"unknown allowed tool", "tools: {allow: [hosts]}", []string{"tools.allow", `"hosts"`}},
		{"bad path glob", `paths: {deny: ["/srv/[app"]}`, []string{"paths.deny", "not a valid glob"}},
		{"bad write glob", `paths: {write: {allow: ["/srv/{a,b"]}}`, []string{"paths.write.allow", "not a valid glob"}},
		{"empty path", `paths: {deny: [""]}`, []string{"paths.deny", "empty pattern"}},
		{"null path", `paths: {deny: [~]}`, []string{"line 1", "not null"}},
		{"null allow entry", "bash:\n  allow:\n    -\n", []string{"line 3", "not null"}},
		{"other home", `paths: {deny: ["~root/.ssh"]}`, []string{"only ~ and ~/"}},
		{"control char", "paths: {deny: [\"/a\\tb\"]}", []string{"control character"}},
		{"empty bash", `bash: {deny: ["  "]}`, []string{"bash.deny", "empty pattern"}},
		{"bash control", `bash: {deny: ["rm\x01x"]}`, []string{"bash.deny", "control character"}},
		{"skill slash", `skills: {deny: ["a/b"]}`, []string{"skills.deny", "no slashes"}},
		{"skill glob", `skills: {allow: ["[x"]}`, []string{"skills.allow", "not a valid glob"}},
		{"bad yaml", "bash: {allow: [ls", []string{"not valid YAML or JSON"}},
		{"tabs", "bash:\n\tallow: [ls]", []string{"not valid YAML or JSON"}},
		{"bad json", `{"bash": {"allow": ["ls"]}`, []string{"not valid YAML or JSON"}},
		{"two documents", "bash: {allow: [ls]}\n---\ntools: {deny: [write]}", []string{"more than one YAML document"}},
		{"duplicate key", "bash: {allow: [ls]}\nbash: {deny: [rm]}", []string{"already defined"}},
		{"not a mapping", "- ls\n- cat", []string{"policy file"}},
		{"scalar", "unrestricted", []string{"policy file"}},
		{"too large", "# " + strings.Repeat("x", MaxFileSize), []string{"at most"}},
		{"several", "tools: {deny: [nope]}\npaths: {allow: [\"[\"]}", []string{`unknown tool "nope"`, "not a valid glob"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.text), testEnv())
			if err == nil {
				t.Fatalf("Parse(%q) = nil error", tt.text)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Parse(%q) = %q, want it to mention %q", tt.text, err, w)
				}
			}
		})
	}
}

func TestParseEnvErrors(t *testing.T) {
	if _, err := Parse([]byte(`paths: {deny: ["~/.ssh"]}`), Env{Cwd: "/srv", Tools: testTools}); err == nil || !strings.Contains(err.Error(), "no home directory") {
		t.Errorf("~ without a home: %v", err)
	}
	if _, err := Parse([]byte(`bash: {deny: [rm]}`), Env{Cwd: "relative", Tools: testTools}); err == nil || !strings.Contains(err.Error(), "not an absolute path") {
		t.Errorf("relative working directory: %v", err)
	}
	if _, err := Parse([]byte(`bash: {deny: [rm]}`), Env{Cwd: "/srv", Tools: testTools, Shell: "/usr/bin/zsh"}); err == nil || !strings.Contains(err.Error(), "zsh") {
		t.Errorf("command rules on zsh: %v", err)
	}
	// Without command rules any shell will do.
	if _, err := Parse([]byte(`tools: {deny: [write]}`), Env{Cwd: "/srv", Tools: testTools, Shell: "fish"}); err != nil {
		t.Errorf("tool rules on fish: %v", err)
	}
	for _, sh := range []string{"", "bash", "/bin/bash", "/bin/sh", "dash", "/usr/bin/mksh"} {
		if _, err := Parse([]byte(`bash: {deny: [rm]}`), Env{Cwd: "/srv", Tools: testTools, Shell: sh}); err != nil {
			t.Errorf("command rules on %q: %v", sh, err)
		}
	}
}

// The digest covers the rules, not how they are written.
func TestDigest(t *testing.T) {
	base := mustParse(t, "tools: {deny: [write, edit]}\nbash: {allow: [\"git *\", \"ls *\"]}\n")
	same := []string{
		"# comment\nbash:\n  allow:\n    - ls *\n    - \"git  *\"\n    - ls *\ntools:\n  deny: [edit, write, write]\n",
		`{"tools": {"deny": ["edit", "write"]}, "bash": {"allow": ["git *", "ls *"], "deny": []}, "skills": {}}`,
	}
	for _, text := range same {
		if d := mustParse(t, text).Digest(); d != base.Digest() {
			t.Errorf("digest of %q = %s, want %s", text, d, base.Digest())
		}
	}
	if !strings.HasPrefix(base.Digest(), "sha256:") || len(base.Digest()) != len("sha256:")+64 {
		t.Errorf("digest %q is not sha256:<64 hex digits>", base.Digest())
	}
	for _, text := range []string{
		"tools: {deny: [write]}\nbash: {allow: [\"git *\", \"ls *\"]}\n",
		"tools: {allow: [write, edit]}\nbash: {allow: [\"git *\", \"ls *\"]}\n",
		"tools: {deny: [write, edit]}\nbash: {deny: [\"git *\", \"ls *\"]}\n",
		"tools: {deny: [write, edit]}\nbash: {allow: [\"git *\", \"ls *\"]}\nskills: {deny: [x]}\n",
	} {
		if d := mustParse(t, text).Digest(); d == base.Digest() {
			t.Errorf("digest of %q equals that of different rules", text)
		}
	}
	// The normalised form parses back to the same digest.
	again, err := Parse(base.rules.canonical(), testEnv())
	if err != nil || again.Digest() != base.Digest() {
		t.Errorf("canonical form %s: %v, digest %s, want %s", base.rules.canonical(), err, again.Digest(), base.Digest())
	}
}

func TestSummary(t *testing.T) {
	p := mustParse(t, `
tools: {deny: [write, edit]}
paths: {allow: ["/srv/app/**"], deny: ["**/.ssh/**"], write: {deny: ["/srv/app/vendor/**"]}}
bash: {allow: ["git *"], deny: ["git push *"]}
`)
	want := []string{
		"tools: deny edit, write",
		"paths: allow /srv/app/**; deny **/.ssh/**; write: deny /srv/app/vendor/**",
		"bash: allow git *; deny git push *",
		"skills: unrestricted",
	}
	if got := p.Summary(); !slices.Equal(got, want) {
		t.Errorf("Summary() =\n%q\nwant\n%q", got, want)
	}
}

func TestTools(t *testing.T) {
	tests := []struct {
		text    string
		allowed []string
		rule    string
	}{
		{"", testTools, ""},
		{"tools: {deny: [write, edit]}", []string{"bash", "delete", "list", "move", "patch", "read", "search"}, "tools.deny"},
		{"tools: {allow: [read, bash]}", []string{"bash", "read"}, "tools.allow"},
		{"tools: {allow: [read, write], deny: [write]}", []string{"read"}, ""},
	}
	for _, tt := range tests {
		p := mustParse(t, tt.text)
		var got []string
		for _, tool := range testTools {
			err := p.AllowTool(tool)
			if err == nil {
				got = append(got, tool)
				continue
			}
			var d *Denial
			if !errors.As(err, &d) || !strings.Contains(err.Error(), "denied by host policy: tool "+tool+" is not served on this host") {
				t.Errorf("%q: AllowTool(%s) = %v", tt.text, tool, err)
			}
			if tt.rule != "" && d.Rule != tt.rule {
				t.Errorf("%q: AllowTool(%s) rule %s, want %s", tt.text, tool, d.Rule, tt.rule)
			}
		}
		if !slices.Equal(got, tt.allowed) {
			t.Errorf("%q: tools allowed %v, want %v", tt.text, got, tt.allowed)
		}
	}
}

func TestSkills(t *testing.T) {
	tests := []struct {
		text string
		yes  []string
		no   []string
	}{
		{"", []string{"send-email", "anything"}, nil},
		{"skills: {deny: [send-email]}", []string{"send-emails", "deploy"}, []string{"send-email"}},
		{"skills: {allow: [\"git-*\", docs], deny: [git-push]}", []string{"git-log", "docs"}, []string{"git-push", "deploy", "docs2"}},
		{"skills: {deny: [\"*\"]}", nil, []string{"a", "b-c"}},
	}
	for _, tt := range tests {
		p := mustParse(t, tt.text)
		for _, s := range tt.yes {
			if !p.AllowSkill(s) {
				t.Errorf("%q: skill %s refused", tt.text, s)
			}
		}
		for _, s := range tt.no {
			if p.AllowSkill(s) {
				t.Errorf("%q: skill %s allowed", tt.text, s)
			}
		}
	}
	var nilPolicy *Policy
	if !nilPolicy.AllowSkill("x") || nilPolicy.CheckSkill("x") != nil {
		t.Error("nil policy refuses a skill")
	}
	// CheckSkill names the rule that refuses, for the rollout's status.
	p := mustParse(t, "skills: {allow: [\"git-*\"], deny: [git-push]}")
	for skill, rule := range map[string]string{"git-push": "skills.deny", "deploy": "skills.allow", "git-log": ""} {
		err := p.CheckSkill(skill)
		var d *Denial
		switch {
		case rule == "" && err != nil:
			t.Errorf("CheckSkill(%s) = %v, want nil", skill, err)
		case rule != "" && (!errors.As(err, &d) || d.Rule != rule || !strings.Contains(d.Reason, skill)):
			t.Errorf("CheckSkill(%s) = %v, want a denial by %s naming the skill", skill, err, rule)
		}
	}
}
