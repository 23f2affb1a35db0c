//go:build unix

package agent

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetmcp/fleetmcp/policy"
)

// These tests kill real processes in the middle of a patch's commit
// (SIGKILL: no deferred function, no cleanup runs) and check that a new
// process, starting its toolbox on the same state directory, leaves
// every file of the patch either as before or as after the patch.

// crashHelperEnv makes the test binary run crashHelper instead of the
// tests.
const crashHelperEnv = "FLEET_PATCH_CRASH_HELPER"

// TestPatchCrashHelper is the process the crash tests kill. It starts a
// toolbox on the state directory it is given (which recovers what a
// killed process left) and, in commit mode, applies the patch in the
// file it is given. It prints "stalled" and waits to be killed at the
// point it is told (a commit point such as "rename:17", or
// "recover:3" for the fourth file a recovery handles), and prints
// "renaming" when the first file is about to be renamed in.
func TestPatchCrashHelper(t *testing.T) {
	if os.Getenv(crashHelperEnv) == "" {
		t.Skip("run by the crash tests as a separate process")
	}
	stall := os.Getenv("FPC_STALL")
	stop := func(key string) {
		if key == stall {
			fmt.Println("stalled")
			time.Sleep(time.Hour) // until killed
		}
	}
	tb, err := newToolbox(toolboxConfig{
		Cwd: os.Getenv("FPC_CWD"), StateDir: os.Getenv("FPC_STATE"), Shell: "/bin/sh",
		BashDefaultTimeout: time.Second, BashMaxTimeout: time.Second,
		recoverHook: func(i int) { stop("recover:" + strconv.Itoa(i)) },
	})
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	if os.Getenv("FPC_MODE") == "recover" {
		fmt.Println("recovered")
		return
	}
	patch, err := os.ReadFile(os.Getenv("FPC_PATCH"))
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	hooks := &patchHooks{at: func(point string, step int) {
		key := point
		if step >= 0 {
			key += ":" + strconv.Itoa(step)
		}
		if key == "rename:0" {
			fmt.Println("renaming")
		}
		stop(key)
	}}
	tc := &toolCall{ID: "crash", Args: mustJSON(t, map[string]any{"patch": string(patch)}), Output: func([]byte) {}}
	r := tb.runPatch(context.Background(), tc, hooks)
	fmt.Printf("done error=%v\n", r.IsError)
}

// crashProc is a helper process.
type crashProc struct {
	cmd   *exec.Cmd
	lines chan string
	done  chan struct{} // closed once all output is read

	mu  sync.Mutex
	out strings.Builder // everything it printed, for failures
}

// startHelper starts the helper in mode (commit or recover) on the tree
// at cwd and the state directory state, stalling at stall.
func startHelper(t *testing.T, mode, cwd, state, patchFile, stall string) *crashProc {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestPatchCrashHelper$", "-test.count=1")
	cmd.Env = append(os.Environ(), crashHelperEnv+"=1", "FPC_MODE="+mode, "FPC_CWD="+cwd,
		"FPC_STATE="+state, "FPC_PATCH="+patchFile, "FPC_STALL="+stall)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &crashProc{cmd: cmd, lines: make(chan string, 16), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		defer close(p.lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			p.mu.Lock()
			p.out.WriteString(sc.Text() + "\n")
			p.mu.Unlock()
			select {
			case p.lines <- sc.Text():
			default: // nobody waits for this line
			}
		}
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return p
}

// await waits for a line starting with one of prefixes and returns it;
// "" when the process ended first.
func (p *crashProc) await(t *testing.T, prefixes ...string) string {
	t.Helper()
	timeout := time.After(2 * time.Minute)
	for {
		select {
		case l, ok := <-p.lines:
			if !ok {
				return ""
			}
			for _, pre := range prefixes {
				if strings.HasPrefix(l, pre) {
					return l
				}
			}
		case <-timeout:
			t.Fatalf("helper printed none of %q within 2 minutes", prefixes)
		}
	}
}

// kill kills the process with SIGKILL and waits for it.
func (p *crashProc) kill(t *testing.T) {
	t.Helper()
	_ = p.cmd.Process.Kill()
	<-p.done // all output read: only then may Wait close the pipe
	_ = p.cmd.Wait()
}

// finish waits for the process to exit on its own and fails unless it
// printed want.
func (p *crashProc) finish(t *testing.T, want string) {
	t.Helper()
	<-p.done
	err := p.cmd.Wait()
	if err != nil || !strings.Contains(p.output(), want) {
		t.Fatalf("helper: %v, output:\n%s", err, p.output())
	}
}

// output returns what the process printed so far.
func (p *crashProc) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

// crashTree is a tree of files and a patch that changes 400 of them:
// it modifies 380, deletes 10 and creates 10 in new directories.
type crashTree struct {
	root, state, patchFile string
	before, after          map[string]string // relative path: content; absent: no file
}

func newCrashTree(t *testing.T) *crashTree {
	t.Helper()
	base := t.TempDir()
	ct := &crashTree{root: filepath.Join(base, "tree"), state: filepath.Join(base, "state"),
		patchFile: filepath.Join(base, "patch.diff"), before: map[string]string{}, after: map[string]string{}}
	var patch strings.Builder
	for i := range 380 {
		p := fmt.Sprintf("d%d/m%03d.txt", i%8, i)
		ct.before[p] = fmt.Sprintf("head %d\nold %d\ntail\n", i, i)
		ct.after[p] = fmt.Sprintf("head %d\nnew %d\ntail\n", i, i)
		fmt.Fprintf(&patch, "--- a/%s\n+++ b/%s\n@@ -1,3 +1,3 @@\n head %d\n-old %d\n+new %d\n tail\n", p, p, i, i, i)
	}
	for i := range 10 {
		p := fmt.Sprintf("d%d/x%d.txt", i%3, i)
		ct.before[p] = fmt.Sprintf("doomed %d\n", i)
		fmt.Fprintf(&patch, "--- a/%s\n+++ /dev/null\n@@ -1 +0,0 @@\n-doomed %d\n", p, i)
		p = fmt.Sprintf("new/sub%d/c%d.txt", i%2, i)
		ct.after[p] = fmt.Sprintf("created %d\n", i)
		fmt.Fprintf(&patch, "--- /dev/null\n+++ b/%s\n@@ -0,0 +1 @@\n+created %d\n", p, i)
	}
	for p, c := range ct.before {
		tbFile(t, ct.root, p, c)
	}
	if err := os.WriteFile(ct.patchFile, []byte(patch.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return ct
}

// outcome checks the tree after a recovery: every file of the patch as
// before it, or every one as after it, no hidden file of a commit, no
// journal. It returns "before" or "after".
func (ct *crashTree) outcome(t *testing.T) string {
	t.Helper()
	got := map[string]string{}
	var hidden []string
	err := filepath.WalkDir(ct.root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(ct.root, p)
		if strings.Contains(d.Name(), ".tmp-") || strings.Contains(d.Name(), ".orig-") {
			hidden = append(hidden, rel)
			return nil
		}
		data, err := os.ReadFile(p)
		got[rel] = string(data)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(hidden) > 0 {
		t.Errorf("%d hidden files of the commit remain, e.g. %s", len(hidden), hidden[0])
	}
	if names, _ := os.ReadDir(filepath.Join(ct.state, journalDirName)); len(names) > 0 {
		t.Errorf("the journal directory still holds %s", names[0].Name())
	}
	result := ""
	switch {
	case sameFiles(got, ct.before):
		if _, err := os.Lstat(filepath.Join(ct.root, "new")); err == nil {
			t.Errorf("the files are as before the patch, but the directory it made is still there")
		}
		result = "before"
	case sameFiles(got, ct.after):
		result = "after"
	default:
		old, changed := 0, 0
		for p, c := range got {
			switch c {
			case ct.before[p]:
				old++
			case ct.after[p]:
				changed++
			}
		}
		t.Fatalf("the tree is half patched: %d files as before, %d as after, %d files in all", old, changed, len(got))
	}
	return result
}

func sameFiles(got, want map[string]string) bool {
	if len(got) != len(want) {
		return false
	}
	for p, c := range want {
		if g, ok := got[p]; !ok || g != c {
			return false
		}
	}
	return true
}

// crashPoint is where a kill lands, and what the tree must be after.
type crashPoint struct {
	stall string // the helper's stall point; "" for a kill at a random time once renaming began
	want  string // "before", "after", or "" for either
}

// randomCrashPoint picks a kill point: before, during or after the
// renames; mostly during.
func randomCrashPoint(r *rand.Rand) crashPoint {
	switch n := r.IntN(10); {
	case n == 0:
		return crashPoint{[]string{"staged", "backed-up"}[r.IntN(2)], "before"}
	case n == 1:
		return crashPoint{[]string{"committed", "cleaned"}[r.IntN(2)], "after"}
	case n <= 3:
		return crashPoint{"", ""}
	}
	return crashPoint{"rename:" + strconv.Itoa(r.IntN(400)), "before"}
}

// killCount is how many kills TestPatchKillLoop makes: 20, or
// FLEET_PATCH_KILLS.
func killCount(t *testing.T) int {
	n := 20
	if testing.Short() {
		n = 5
	}
	if s := os.Getenv("FLEET_PATCH_KILLS"); s != "" {
		var err error
		if n, err = strconv.Atoi(s); err != nil || n < 1 {
			t.Fatalf("FLEET_PATCH_KILLS=%q is not a positive number", s)
		}
	}
	return n
}

// TestPatchKillLoop kills a process applying a 400-file patch at points
// before, during and after its renames, sometimes kills the process
// recovering it too, and checks that the next process to start leaves
// the 400 files all as before or all as after, with no hidden file and
// no journal left. FLEET_PATCH_KILLS sets the number of kills.
func TestPatchKillLoop(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 1))
	outcomes := map[string]int{}
	for i := range killCount(t) {
		cp := randomCrashPoint(r)
		ct := newCrashTree(t)
		p := startHelper(t, "commit", ct.root, ct.state, ct.patchFile, cp.stall)
		if cp.stall == "" {
			if p.await(t, "renaming", "done") == "renaming" {
				time.Sleep(time.Duration(r.IntN(3000)) * time.Microsecond)
			}
		} else if l := p.await(t, "stalled", "done"); l != "stalled" {
			t.Fatalf("kill %d at %s: the helper did not stall there:\n%s", i, cp.stall, p.output())
		}
		p.kill(t)

		// Sometimes the recovery is killed too, in the middle.
		if cp.stall != "" && r.IntN(4) == 0 {
			rp := startHelper(t, "recover", ct.root, ct.state, "", "recover:"+strconv.Itoa(r.IntN(400)))
			if rp.await(t, "stalled", "recovered") == "stalled" {
				rp.kill(t)
			}
		}
		startHelper(t, "recover", ct.root, ct.state, "", "").finish(t, "recovered")
		got := ct.outcome(t)
		if cp.want != "" && got != cp.want {
			t.Fatalf("kill %d at %q: the files are as %s the patch, want as %s", i, cp.stall, got, cp.want)
		}
		outcomes[got]++
	}
	t.Logf("outcomes: %v", outcomes)
}

// TestPatchCrashKeepsOthersChanges: a file someone changed between the
// crash and the recovery is kept as they left it; the rest of the patch
// is rolled back and the change logged.
func TestPatchCrashKeepsOthersChanges(t *testing.T) {
	ct := newCrashTree(t)
	p := startHelper(t, "commit", ct.root, ct.state, ct.patchFile, "rename:200")
	p.await(t, "stalled")
	p.kill(t)
	// Files renamed in before the kill are in sorted order: d0/m000 is.
	mine := filepath.Join(ct.root, "d0/m000.txt")
	if got := tbRead(t, mine); got != ct.after["d0/m000.txt"] {
		t.Fatalf("d0/m000.txt = %q before recovery; want the patch's version", got)
	}
	if err := os.WriteFile(mine, []byte("edited by hand\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var log strings.Builder
	recoverIn(t, ct, &log)
	if got := tbRead(t, mine); got != "edited by hand\n" {
		t.Errorf("the file changed by hand = %q; want it kept", got)
	}
	ct.before["d0/m000.txt"] = "edited by hand\n"
	if got := ct.outcome(t); got != "before" {
		t.Errorf("outcome %s, want before", got)
	}
	if !strings.Contains(log.String(), "kept as found") || !strings.Contains(log.String(), mine) {
		t.Errorf("log does not report the kept file:\n%s", log.String())
	}
}

// recoverIn starts a toolbox on ct's state directory in this process,
// which recovers what a killed process left, logging to log.
func recoverIn(t *testing.T, ct *crashTree, log io.Writer) *toolbox {
	t.Helper()
	return recoverWith(t, ct, log, nil)
}

// recoverWith is recoverIn under the host policy pol.
func recoverWith(t *testing.T, ct *crashTree, log io.Writer, pol *policy.Policy) *toolbox {
	t.Helper()
	tb, err := newToolbox(toolboxConfig{Cwd: ct.root, StateDir: ct.state, Shell: "/bin/sh",
		BashDefaultTimeout: time.Second, BashMaxTimeout: time.Second, Policy: pol,
		Logger: slog.New(slog.NewTextHandler(log, nil))})
	if err != nil {
		t.Fatal(err)
	}
	return tb
}
