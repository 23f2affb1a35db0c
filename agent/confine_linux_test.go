package agent

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fleetmcp/fleetmcp/agent/confine"
)

// confinedBox returns a toolbox whose commands are confined (mode), with
// its state directory holding a key file, and the directories it uses:
// root/state, root/ws (working directory), root/skills (with s1/run.sh).
func confinedBox(t *testing.T, mode string) (tb *toolbox, root, seed string) {
	t.Helper()
	return confinedBoxSkills(t, mode, "skills")
}

// confinedBoxSkills is confinedBox with the skills directory at skills
// (relative to the root).
func confinedBoxSkills(t *testing.T, mode, skills string) (tb *toolbox, root, seed string) {
	t.Helper()
	root, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	seed = "SUAKEYSEEDTHATMUSTNOTLEAK" + strings.Repeat("X", 20)
	for path, data := range map[string]string{
		"state/identity/agent.nk": seed + "\n",
		skills + "/s1/run.sh":     "#!/bin/sh\necho skill-ran\n",
		skills + "/s1/SKILL.md":   "---\nname: s1\ndescription: test\n---\n",
		"ws/readme.txt":           "workspace\n",
	} {
		p := filepath.Join(root, path)
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cfg := toolboxConfig{
		Cwd: filepath.Join(root, "ws"), StateDir: filepath.Join(root, "state"), SkillsDir: filepath.Join(root, skills),
		Shell: "/bin/sh", BashDefaultTimeout: 30 * time.Second, BashMaxTimeout: 60 * time.Second,
		ChildEnv: os.Environ(), Host: "test-host", ConfineCommands: mode, ConfineHelper: exe,
	}
	if strings.HasPrefix(skills, "state/") {
		// The agent's own layout: the fleet's skills in the state
		// directory, the host's own in the working directory.
		cfg.FleetSkills, cfg.SkillsDir = cfg.SkillsDir, filepath.Join(root, "ws", ".agents", "skills")
	}
	if tb, err = newToolbox(cfg); err != nil {
		t.Fatal(err)
	}
	if err := tb.tasks.Open(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		tb.tasks.Close()
		killTaskGroups(tb.tasks)
	})
	return tb, root, seed
}

func needLandlock(t *testing.T) {
	t.Helper()
	if abi, why := confine.ABI(); abi == 0 {
		t.Skipf("commands cannot be confined here: %s", why)
	}
}

// stateAttacks are commands that try to read, write, create, rename or
// delete something in the state directory (run in root/ws, STATE its
// path), each in its own way.
var stateAttacks = []string{
	"cat STATE/identity/agent.nk",
	"cat ../state/identity/agent.nk",
	"cat ./../ws/../state/identity/agent.nk",
	"cd STATE/identity && cat agent.nk",
	"cd STATE && cat /proc/self/cwd/identity/agent.nk",
	"ln -s STATE link && cat link/identity/agent.nk",
	"ln -s STATE/identity/agent.nk key && cat key",
	"ln STATE/identity/agent.nk hard && cat hard",
	"cat /proc/$PPID/root/STATE/identity/agent.nk",
	"cat /proc/$$/root/STATE/identity/agent.nk",
	"exec 3<STATE/identity/agent.nk && cat <&3",
	"cp -r STATE copy && cat copy/identity/agent.nk",
	"tar -C STATE -cf a.tar . && tar -xOf a.tar",
	"for f in /proc/$PPID/fd/*; do cat $f; done 2>/dev/null; cat STATE/identity/agent.nk",
	"echo forged > STATE/identity/agent.nk",
	"echo more >> STATE/identity/agent.nk",
	": > STATE/identity/agent.nk",
	"truncate -s 0 STATE/identity/agent.nk",
	"rm -f STATE/identity/agent.nk",
	"mv STATE/identity STATE/gone",
	"mv STATE/identity/agent.nk agent.nk",
	"mkdir STATE/new",
	"touch STATE/identity/trusted.json",
	"ln -s /tmp STATE/tasks/evil",
	"mkfifo STATE/fifo",
	"rm -rf STATE",
}

func TestConfinedCommandsKeepOutOfState(t *testing.T) {
	needLandlock(t)
	tb, root, seed := confinedBox(t, ConfineRequired)
	state := filepath.Join(root, "state")
	key := filepath.Join(state, "identity", "agent.nk")
	before := listTree(t, state)
	for _, cmd := range stateAttacks {
		cmd = strings.ReplaceAll(cmd, "STATE", state)
		t.Run(cmd, func(t *testing.T) {
			text, isErr, _ := tbBash(t, tb, map[string]any{"command": cmd})
			if strings.Contains(text, seed) {
				t.Fatalf("the command read the key:\n%s", text)
			}
			if !isErr {
				t.Errorf("the command succeeded:\n%s", text)
			}
			if data, err := os.ReadFile(key); err != nil || string(data) != seed+"\n" {
				t.Fatalf("the key file changed: %q, %v", data, err)
			}
			if now := listTree(t, state); now != before {
				t.Fatalf("the state directory changed:\n%s\nwas\n%s", now, before)
			}
		})
	}
}

// listTree returns the names, modes and sizes of everything in dir.
func listTree(t *testing.T, dir string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		size := fi.Size()
		if d.IsDir() {
			size = 0
		}
		fmt.Fprintf(&b, "%s %v %d\n", path, fi.Mode(), size)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func TestConfinedCommandsWorkElsewhere(t *testing.T) {
	needLandlock(t)
	tb, root, _ := confinedBox(t, ConfineRequired)
	tmp, err := os.MkdirTemp("", "confined-*")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(tmp)
	for _, c := range []struct{ cmd, want string }{
		{"echo written > sub.txt && mkdir -p d && echo written > d/f && cat sub.txt d/f && rm -r d sub.txt", "written\nwritten"},
		{"cat readme.txt", "workspace"},
		{"echo t > " + tmp + "/f && cat " + tmp + "/f && rm " + tmp + "/f && echo removed", "removed"},
		{"sh " + root + "/skills/s1/run.sh", "skill-ran"},
		{root + "/skills/s1/run.sh", "skill-ran"},
		{"ls " + root + "/state", "identity"}, // names may be listed, never opened
		{"head -c 4 /etc/hostname >/dev/null && echo read-etc", "read-etc"},
	} {
		text, isErr, _ := tbBash(t, tb, map[string]any{"command": c.cmd})
		if isErr || !strings.Contains(text, c.want) {
			t.Errorf("%s: error %v, output %q; want %q", c.cmd, isErr, text, c.want)
		}
	}
	for _, cmd := range []string{
		"echo x >> " + root + "/skills/s1/run.sh",
		"touch " + root + "/skills/s1/new",
		"rm " + root + "/skills/s1/SKILL.md",
	} {
		if text, isErr, _ := tbBash(t, tb, map[string]any{"command": cmd}); !isErr {
			t.Errorf("%s changed the skills directory: %q", cmd, text)
		}
	}
	if data, _ := os.ReadFile(filepath.Join(root, "skills", "s1", "run.sh")); string(data) != "#!/bin/sh\necho skill-ran\n" {
		t.Errorf("a skill's script changed: %q", data)
	}
}

func TestConfinedBackgroundTasks(t *testing.T) {
	needLandlock(t)
	tb, root, seed := confinedBox(t, ConfineRequired)
	id := startTask(t, tb, "cat "+filepath.Join(root, "state", "identity", "agent.nk"), nil)
	r, v := waitTask(t, tb, id)
	if text := resultTextOf(r); strings.Contains(text, seed) || v.ExitCode == nil || *v.ExitCode == 0 {
		t.Errorf("a background task read the key: exit %v, %q", v.ExitCode, text)
	}
	// The task's exit status is still recorded: the wrapper that writes
	// it in the state directory is not confined, the command is.
	id = startTask(t, tb, "echo task-ok > "+filepath.Join(root, "ws", "d-task")+" 2>&1; mkdir -p t && echo task-ok > t/f && cat t/f", nil)
	r, v = waitTask(t, tb, id)
	if text := resultTextOf(r); !strings.Contains(text, "task-ok") || v.ExitCode == nil || *v.ExitCode != 0 {
		t.Errorf("a background task could not write its working directory: exit %v, %q", v.ExitCode, text)
	}
}

// TestUnconfinedCommandsReadState shows what confinement stops: with it
// off, the first attack reads the key.
func TestUnconfinedCommandsReadState(t *testing.T) {
	tb, root, seed := confinedBox(t, ConfineOff)
	text, _, _ := tbBash(t, tb, map[string]any{"command": "cat " + filepath.Join(root, "state", "identity", "agent.nk")})
	if !strings.Contains(text, seed) {
		t.Fatalf("unconfined, the command could not read the key: %q", text)
	}
	if !strings.HasPrefix(tb.jail.state, "none: off") {
		t.Errorf("state %q", tb.jail.state)
	}
}

func TestConfineRequiredWithoutHelper(t *testing.T) {
	root := t.TempDir()
	cfg := toolboxConfig{
		Cwd: root, StateDir: filepath.Join(root, "state"), Shell: "/bin/sh",
		BashDefaultTimeout: 30 * time.Second, BashMaxTimeout: 60 * time.Second, Host: "test-host", ConfineCommands: ConfineRequired,
	}
	tb, err := newToolbox(cfg)
	if err != nil {
		t.Fatal(err)
	}
	text, isErr, _ := tbBash(t, tb, map[string]any{"command": "echo ran"})
	if !isErr || strings.Contains(text, "ran\n") || !strings.Contains(text, "confine_commands required") {
		t.Fatalf("required without the means: error %v, %q", isErr, text)
	}
	if !strings.HasPrefix(tb.jail.state, "none: ") {
		t.Errorf("state %q", tb.jail.state)
	}
	cfg.ConfineCommands = "sometimes"
	if _, err := newToolbox(cfg); err == nil || !strings.Contains(err.Error(), "auto, required or off") {
		t.Errorf("a bad mode: %v", err)
	}
}

// git runs through its guard, whose files lie in the state directory,
// from confined commands as it does from unconfined ones.
func TestGitGuardConfined(t *testing.T) {
	needLandlock(t)
	t.Run("ordinary use", func(t *testing.T) { gitGuardOrdinaryUse(t, ConfineRequired) })
	t.Run("attacks", func(t *testing.T) { gitGuardAttacks(t, ConfineRequired) })
}

// Skills installed inside the state directory run from confined
// commands, which can neither change them nor reach the rest of it.
func TestConfinedSkillsInStateDir(t *testing.T) {
	needLandlock(t)
	tb, root, seed := confinedBoxSkills(t, ConfineRequired, "state/skills")
	skill := filepath.Join(root, "state", "skills", "s1")
	for _, c := range []struct {
		cmd  string
		want string // "": the command must fail
	}{
		{"sh " + skill + "/run.sh", "skill-ran"},
		{skill + "/run.sh", "skill-ran"},
		{"cat " + skill + "/SKILL.md", "name: s1"},
		{"cat " + skill + "/../../identity/agent.nk", ""},
		{"echo x >> " + skill + "/run.sh", ""},
		{"rm " + skill + "/SKILL.md", ""},
		{"touch " + skill + "/new", ""},
	} {
		text, isErr, _ := tbBash(t, tb, map[string]any{"command": c.cmd})
		switch {
		case strings.Contains(text, seed):
			t.Errorf("%s read the key", c.cmd)
		case c.want == "" && !isErr:
			t.Errorf("%s succeeded: %q", c.cmd, text)
		case c.want != "" && (isErr || !strings.Contains(text, c.want)):
			t.Errorf("%s: error %v, %q; want %q", c.cmd, isErr, text, c.want)
		}
	}
}
