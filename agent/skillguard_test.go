//go:build unix

package agent

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// secretSkill is a valid SKILL.md whose description and body must never
// be seen through the skill tool or the catalog when the read tool may
// not read it.
const secretSkill = "---\nname: x\ndescription: SECRET-DESCRIPTION\n---\nSECRET-BODY\n"

// skillHost is a toolbox under policy text (CWD: its working directory)
// whose skills are in CWD/.agents/skills.
func skillHost(t *testing.T, policyText string) (guarded, string) {
	t.Helper()
	g := tbPolicy(t, policyText)
	root := filepath.Join(g.cwd, ".agents", "skills")
	mkdirs(t, root)
	g.skills = newCatalog(root, "h1", g.guard, quietLogger())
	return g, root
}

// noSecret fails if anything the catalog shows, or r, holds the secret.
func noSecret(t *testing.T, what string, g guarded, texts ...string) {
	t.Helper()
	catalog, _ := json.Marshal(g.skills.list())
	for _, s := range append(texts, string(catalog)) {
		if strings.Contains(s, "SECRET") {
			t.Errorf("%s: the secret shows: %s", what, s)
		}
	}
}

// TestSkillLinksOut: a SKILL.md, a skill folder or the skills folder that
// leads out of the allowed paths is read by neither the catalog nor the
// skill tool, as the read tool does not read it; the catalog says why
// without saying where the link leads.
func TestSkillLinksOut(t *testing.T) {
	outside := t.TempDir()
	secret := tbFile(t, outside, "x/SKILL.md", secretSkill)
	for _, tt := range []struct{ name, link, target string }{
		{"SKILL.md", "x/SKILL.md", secret},
		{"skill folder", "x", filepath.Dir(secret)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			g, root := skillHost(t, `paths: {allow: ["CWD/**"]}`)
			mkdirs(t, filepath.Join(root, "x"))
			os.Remove(filepath.Join(root, "x")) // the folder itself may be the link
			mkdirs(t, filepath.Dir(filepath.Join(root, tt.link)))
			if err := os.Symlink(tt.target, filepath.Join(root, tt.link)); err != nil {
				t.Fatal(err)
			}
			g.skills.rescan()
			s, ok := g.skills.lookup("x")
			if !ok || !strings.Contains(s.Problem, "refused by the host policy (paths.allow)") || strings.Contains(s.Problem, outside) {
				t.Errorf("catalog entry %+v, want a problem naming paths.allow and not the link's destination", s)
			}
			r := run(t, g.toolbox, "skill", map[string]any{"name": "x"})
			if !r.IsError && r.Error == nil {
				t.Errorf("skill x: %+v, want an error", r)
			}
			noSecret(t, tt.name, g, tbText(t, r))
			wantDenied(t, "read of the same file", run(t, g.toolbox, "read", map[string]any{"path": s.Path}), "outside paths.allow")
		})
	}
	t.Run("skills folder", func(t *testing.T) {
		g := tbPolicy(t, `paths: {allow: ["CWD/**"]}`)
		root := filepath.Join(g.cwd, "skills")
		if err := os.Symlink(outside, root); err != nil {
			t.Fatal(err)
		}
		g.skills = newCatalog(root, "h1", g.guard, quietLogger())
		r := run(t, g.toolbox, "skill", map[string]any{"name": "x"})
		noSecret(t, "skills folder", g, tbText(t, r))
		if s, _ := g.skills.lookup("x"); !strings.Contains(s.Problem, "refused by the host policy") {
			t.Errorf("catalog entry %+v", s)
		}
	})
}

// TestSkillLinkMovedIn: the way in of a link that points out of the
// allowed paths, moved into a skill folder with the move tool (which
// moves links, not what they lead to).
func TestSkillLinkMovedIn(t *testing.T) {
	secret := tbFile(t, t.TempDir(), "notes.md", secretSkill)
	g, root := skillHost(t, `paths: {allow: ["CWD/**"]}`)
	mkdirs(t, filepath.Join(root, "x"))
	g.link(t, secret, "incoming/SKILL.md")
	r := run(t, g.toolbox, "move", map[string]any{"path": "incoming/SKILL.md", "destination": filepath.Join(root, "x", skillFile)})
	wantAllowed(t, "move the link", r)
	g.skills.rescan()
	r = run(t, g.toolbox, "skill", map[string]any{"name": "x"})
	noSecret(t, "moved link", g, tbText(t, r))
	if !r.IsError && r.Error == nil {
		t.Errorf("skill x: %+v, want an error", r)
	}
}

// TestSkillOwnFiles: a SKILL.md that is the agent's own file, by a link
// or a hard link, is not read, whatever the policy allows.
func TestSkillOwnFiles(t *testing.T) {
	g, root := skillHost(t, `bash: {deny: ["rm *"]}`)
	own := tbFile(t, g.state, "tasks/t1/meta.md", secretSkill)
	mkdirs(t, filepath.Join(root, "x"), filepath.Join(root, "creds"))
	if err := os.Symlink(own, filepath.Join(root, "x", skillFile)); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(g.secret, filepath.Join(root, "creds", skillFile)); err != nil {
		t.Fatal(err)
	}
	g.skills.rescan()
	for _, name := range []string{"x", "creds"} {
		s, _ := g.skills.lookup(name)
		if s.Problem == "" || s.Description != "" {
			t.Errorf("catalog entry %+v, want a problem", s)
		}
		r := run(t, g.toolbox, "skill", map[string]any{"name": name})
		noSecret(t, name, g, tbText(t, r))
		if strings.Contains(tbText(t, r), "s3cret") {
			t.Errorf("skill %s returned the credentials: %q", name, tbText(t, r))
		}
	}
	if s, _ := g.skills.lookup("x"); !strings.Contains(s.Problem, "agent's own files") {
		t.Errorf("link to the state directory: %q", s.Problem)
	}
}

// TestSkillSpecialFiles: a SKILL.md that is a FIFO, or a link to one or
// to a device, neither hangs the catalog scan nor the skill tool.
func TestSkillSpecialFiles(t *testing.T) {
	g, root := skillHost(t, `bash: {deny: ["rm *"]}`)
	mkdirs(t, filepath.Join(root, "fifo"), filepath.Join(root, "linked-fifo"), filepath.Join(root, "device"))
	if err := syscall.Mkfifo(filepath.Join(root, "fifo", skillFile), 0o644); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(t.TempDir(), "pipe")
	if err := syscall.Mkfifo(other, 0o644); err != nil {
		t.Fatal(err)
	}
	for link, target := range map[string]string{"linked-fifo": other, "device": "/dev/zero"} {
		if err := os.Symlink(target, filepath.Join(root, link, skillFile)); err != nil {
			t.Fatal(err)
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		g.skills.rescan()
		for _, name := range []string{"fifo", "linked-fifo", "device"} {
			run(t, g.toolbox, "skill", map[string]any{"name": name})
		}
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the catalog scan or the skill tool hangs on a FIFO or a device")
	}
	for name, want := range map[string]string{"fifo": "named pipe", "linked-fifo": "named pipe", "device": "a device"} {
		if s, _ := g.skills.lookup(name); !strings.Contains(s.Problem, want) {
			t.Errorf("%s: problem %q, want it to mention %q", name, s.Problem, want)
		}
	}
}

// TestSkillBundledFiles: the files a skill lists are those the read tool
// would read: not links out of the allowed paths, not denied files, not
// links to folders.
func TestSkillBundledFiles(t *testing.T) {
	outside := tbFile(t, t.TempDir(), "secret.txt", "SECRET\n")
	g, root := skillHost(t, `paths: {allow: ["CWD/**"], deny: ["*.pem"]}`)
	writeSkill(t, root, "pdf", "Fill forms.", "")
	dir := filepath.Join(root, "pdf")
	for _, f := range []string{"ok.md", "scripts/run.sh", "key.pem"} {
		tbFile(t, dir, f, "x\n")
	}
	for link, target := range map[string]string{"inside.md": "ok.md", "out.md": outside, "dirlink": "scripts", "pem-link": "key.pem", "dangling": "nowhere"} {
		if err := os.Symlink(target, filepath.Join(dir, link)); err != nil {
			t.Fatal(err)
		}
	}
	g.skills.rescan()
	r := run(t, g.toolbox, "skill", map[string]any{"name": "pdf"})
	_, list, _ := strings.Cut(tbText(t, r), "read tool):\n")
	if want := "inside.md\nok.md\nscripts/run.sh\n"; list != want {
		t.Errorf("bundled files:\n%s\nwant\n%s", list, want)
	}
}

// TestSkillNames: names that are not a folder of the catalog reach
// nothing.
func TestSkillNames(t *testing.T) {
	g, root := skillHost(t, `paths: {allow: ["CWD/**"]}`)
	writeSkill(t, root, "ok", "fine", "")
	writeSkill(t, g.cwd, "up", "above the skills folder", "")
	g.skills.rescan()
	if r := run(t, g.toolbox, "skill", map[string]any{"name": "ok"}); r.IsError {
		t.Fatalf("skill ok: %q", tbText(t, r))
	}
	for _, name := range []string{"../up", "../../.agents/skills/ok", "ok/..", ".", "..", "ok/../ok", "/ok"} {
		r := run(t, g.toolbox, "skill", map[string]any{"name": name})
		if got := tbText(t, r); !r.IsError || !strings.HasPrefix(got, "no skill ") {
			t.Errorf("skill %q = %q, want no skill", name, got)
		}
	}
}

// TestSkillManagedLinks: in the host's skills folder, the links of the
// fleet's form are what an older agent installed there, where any caller
// who may write could change them: they are never served from there
// (the rollout installs them in the fleet's folder); .fleet is hidden
// even with a SKILL.md in it; a link of another form into .fleet is not
// taken for the fleet's and is read as any link is, under the policy.
func TestSkillManagedLinks(t *testing.T) {
	outside := t.TempDir()
	tbFile(t, outside, "x/SKILL.md", secretSkill)
	g, root := skillHost(t, `paths: {allow: ["CWD/**"]}`)
	tbFile(t, root, ".fleet/SKILL.md", "---\nname: fleet\ndescription: not a skill\n---\n")
	tbFile(t, root, ".fleet/deploy/0123456789ab/SKILL.md", "---\nname: deploy\ndescription: managed\n---\nbody\n")
	tbFile(t, root, ".fleet/deploy/0123456789ab/ref.md", "ref\n")
	for link, target := range map[string]string{
		"deploy": ".fleet/deploy/0123456789ab",
		"other":  ".fleet/deploy/0123456789ab", // the form is deploy's, not other's
	} {
		if err := os.Symlink(target, filepath.Join(root, link)); err != nil {
			t.Fatal(err)
		}
	}
	mkdirs(t, filepath.Join(root, ".fleet", "x"))
	if err := os.Symlink(filepath.Join(outside, "x"), filepath.Join(root, ".fleet", "x", "aaaaaaaaaaaa")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(".fleet/x/aaaaaaaaaaaa", filepath.Join(root, "x")); err != nil {
		t.Fatal(err)
	}
	g.skills.rescan()
	for _, name := range []string{fleetDir, "deploy", "x"} {
		if s, ok := g.skills.lookup(name); ok {
			t.Errorf("the catalog shows %s from the host's skills folder: %+v", name, s)
		}
	}
	if text := tbText(t, run(t, g.toolbox, "skill", map[string]any{"name": "deploy"})); !strings.HasPrefix(text, "no skill deploy") {
		t.Errorf("skill tool for an older agent's link in the host's folder:\n%s", text)
	}
	if s, _ := g.skills.lookup("other"); !strings.Contains(s.Problem, "differs from its folder name") {
		t.Errorf("a link of another form into .fleet: %+v, want it read as any link (and its name checked)", s)
	}
	noSecret(t, "version folder linking out", g, tbText(t, run(t, g.toolbox, "skill", map[string]any{"name": "x"})))
}
