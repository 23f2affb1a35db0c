//go:build unix

package agent

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/fleetmcp/fleetmcp/agent/safefs"
	"github.com/fleetmcp/fleetmcp/policy"
)

// validJournal is a record as a commit writes it.
func validJournal() *journalRecord {
	return &journalRecord{Version: journalVersion, ID: strings.Repeat("ab", 16), Entries: []journalEntry{
		{Dir: "/srv/app", Name: "main.go", Action: actModify, Old: sha("a"), New: sha("b")},
		{Dir: "/srv/app/new/sub", Name: "n.txt", Action: actCreate, New: sha("n"), Made: []string{"/srv/app/new", "/srv/app/new/sub"}},
		{Dir: "/srv/app", Name: "gone.txt", Action: actDelete, Old: sha("g")},
	}}
}

func TestJournalRoundTrip(t *testing.T) {
	rec := validJournal()
	got, err := parseJournal(encodeJournal(rec))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, rec) {
		t.Errorf("round trip = %+v, want %+v", got, rec)
	}
	if s := rec.staged(0); s != ".main.go.tmp-"+rec.ID+"-0" {
		t.Errorf("staged name %q", s)
	}
	if b := rec.backup(2); b != ".gone.txt.orig-"+rec.ID+"-2" {
		t.Errorf("backup name %q", b)
	}
}

// TestParseJournalRejects: every malformed journal is refused with what
// is wrong with it.
func TestParseJournalRejects(t *testing.T) {
	withChecksum := func(body string) []byte { return []byte(body + "\nsha256 " + sha(body) + "\n") }
	edited := func(edit func(r *journalRecord)) []byte {
		r := validJournal()
		edit(r)
		return encodeJournal(r)
	}
	good := encodeJournal(validJournal())
	tests := []struct {
		name string
		data []byte
		want string
	}{
		{"empty", nil, "no checksum line"},
		{"cut short", good[:len(good)-10], "checksum does not match"},
		{"no final newline", good[:len(good)-1], "checksum does not match"},
		{"changed byte", bytes.Replace(good, []byte("main.go"), []byte("main.gp"), 1), "checksum does not match"},
		{"not JSON", withChecksum("{"), "not valid JSON"},
		{"unknown field", withChecksum(`{"version":1,"id":"` + strings.Repeat("ab", 16) + `","entries":[],"extra":1}`), "unknown field"},
		{"trailing data", withChecksum(`{"version":1} {}`), "data after"},
		{"version", edited(func(r *journalRecord) { r.Version = 2 }), "version 2"},
		{"short id", edited(func(r *journalRecord) { r.ID = "abc" }), "not 32 hexadecimal"},
		{"upper-case id", edited(func(r *journalRecord) { r.ID = strings.Repeat("AB", 16) }), "not 32 hexadecimal"},
		{"id with a slash", edited(func(r *journalRecord) { r.ID = strings.Repeat("a", 30) + "/b" }), "not 32 hexadecimal"},
		{"no entries", edited(func(r *journalRecord) { r.Entries = nil }), "no entries"},
		{"relative dir", edited(func(r *journalRecord) { r.Entries[0].Dir = "srv/app" }), "not an absolute clean path"},
		{"dir with ..", edited(func(r *journalRecord) { r.Entries[0].Dir = "/srv/app/../../etc" }), "not an absolute clean path"},
		{"dir with NUL", edited(func(r *journalRecord) { r.Entries[0].Dir = "/srv\x00" }), "not an absolute clean path"},
		{"name with a slash", edited(func(r *journalRecord) { r.Entries[0].Name = "../../etc/passwd" }), "not a plain file name"},
		{"name ..", edited(func(r *journalRecord) { r.Entries[0].Name = ".." }), "not a plain file name"},
		{"empty name", edited(func(r *journalRecord) { r.Entries[0].Name = "" }), "not a plain file name"},
		{"long name", edited(func(r *journalRecord) { r.Entries[0].Name = strings.Repeat("n", 256) }), "not a plain file name"},
		{"unknown action", edited(func(r *journalRecord) { r.Entries[0].Action = "chmod" }), `action "chmod"`},
		{"modify without new", edited(func(r *journalRecord) { r.Entries[0].New = "" }), "old and the new"},
		{"bad hash", edited(func(r *journalRecord) { r.Entries[0].Old = strings.Repeat("z", 64) }), "old and the new"},
		{"create with old", edited(func(r *journalRecord) { r.Entries[1].Old = sha("x") }), "new SHA-256 only"},
		{"delete with new", edited(func(r *journalRecord) { r.Entries[2].New = sha("x") }), "old SHA-256 only"},
		{"made for a modify", edited(func(r *journalRecord) { r.Entries[0].Made = []string{"/srv/app"} }), "only a create"},
		{"made elsewhere", edited(func(r *journalRecord) { r.Entries[1].Made = []string{"/etc", "/srv/app/new/sub"} }), "not on the way"},
		{"made not ending at dir", edited(func(r *journalRecord) { r.Entries[1].Made = []string{"/srv/app/new"} }), "not on the way"},
		{"made root", edited(func(r *journalRecord) {
			r.Entries[1].Dir, r.Entries[1].Made = "/x", []string{"/", "/x"}
		}), "not on the way"},
		{"twice", edited(func(r *journalRecord) { r.Entries[2].Name = "main.go" }), "listed twice"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseJournal(tt.data)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("parseJournal error = %v, want it to contain %q", err, tt.want)
			}
		})
	}
}

// FuzzParseJournal: the parser never panics, and what it accepts is a
// valid record that names only plain names in clean absolute
// directories and encodes back to a file that parses the same.
func FuzzParseJournal(f *testing.F) {
	f.Add(encodeJournal(validJournal()), false)
	r := validJournal()
	r.Entries = r.Entries[:1]
	f.Add(encodeJournal(r), false)
	f.Add([]byte(`{"version":1,"id":"`+strings.Repeat("0", 32)+`","entries":[{"dir":"/","name":"x","action":"delete","old":"`+sha("")+`"}]}`), true)
	f.Add([]byte(`{"version":1,"entries":[{"dir":"/a/../b","name":"..","action":"create"}]}`), true)
	f.Add([]byte("\nsha256 \n"), false)
	f.Fuzz(func(t *testing.T, data []byte, addSum bool) {
		if addSum {
			// Most inputs fail the checksum: give the JSON its sum, so the
			// decoder and the checks are what is fuzzed.
			data = fmt.Appendf(data, "\nsha256 %s\n", sha(string(data)))
		}
		rec, err := parseJournal(data)
		if err != nil {
			return
		}
		if err := rec.validate(); err != nil {
			t.Fatalf("accepted an invalid record: %v", err)
		}
		for i, e := range rec.Entries {
			if !filepath.IsAbs(e.Dir) || filepath.Clean(e.Dir) != e.Dir || strings.Contains(e.Name, "/") || e.Name == ".." {
				t.Fatalf("accepted entry %+v", e)
			}
			for _, h := range []string{rec.staged(i), rec.backup(i)} {
				if strings.Contains(h, "/") || len(h) > 255 || !strings.HasPrefix(h, ".") {
					t.Fatalf("hidden name %q of entry %+v", h, e)
				}
			}
		}
		again, err := parseJournal(encodeJournal(rec))
		if err != nil || !reflect.DeepEqual(again, rec) {
			t.Fatalf("re-encoded record parses as %+v, %v; want %+v", again, err, rec)
		}
	})
}

// writeJournal writes rec into the journal directory of state, as a
// commit would, under suffix.
func writeJournal(t *testing.T, state string, rec *journalRecord, suffix string) string {
	t.Helper()
	dir := filepath.Join(state, journalDirName)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, rec.ID+suffix)
	if err := os.WriteFile(p, encodeJournal(rec), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// plantedModify sets up dir/name as a commit killed after renaming it in
// would leave it: the patch's content under the name, a backup with
// the old content under the derived name. It returns the journal and the
// backup's path.
func plantedModify(t *testing.T, dir, name, old, new string) (*journalRecord, string) {
	t.Helper()
	rec := &journalRecord{Version: journalVersion, ID: newJournalID(), Entries: []journalEntry{
		{Dir: dir, Name: name, Action: actModify, Old: sha(old), New: sha(new)},
	}}
	tbFile(t, dir, name, new)
	return rec, tbFile(t, dir, rec.backup(0), old)
}

// TestJournalRefused: a journal that does not parse, that names a file
// the host policy does not let the tools write, or one of the agent's
// own files, is never followed: it is set aside and logged, and no file
// changes.
func TestJournalRefused(t *testing.T) {
	root := t.TempDir()
	work, outside := filepath.Join(root, "work"), filepath.Join(root, "outside")
	state := filepath.Join(root, "state")
	pol, err := policy.Parse([]byte("paths:\n  allow: [\""+work+"\"]\n"), policy.Env{Cwd: work, Tools: toolNames(), Shell: "/bin/sh"})
	if err != nil {
		t.Fatal(err)
	}
	var journals []string
	// Outside the allowed paths: followed, it would put "evil" in place.
	rec, _ := plantedModify(t, outside, "victim", "evil", "precious")
	journals = append(journals, writeJournal(t, state, rec, journalPending))
	// The agent's own state directory.
	tbFile(t, state, "keep", "x")
	own := &journalRecord{Version: journalVersion, ID: newJournalID(), Entries: []journalEntry{
		{Dir: state, Name: "keep", Action: actCreate, New: sha("x")},
	}}
	journals = append(journals, writeJournal(t, state, own, journalPending))
	// Damaged.
	bad := writeJournal(t, state, validJournal(), journalCommitted)
	data, _ := os.ReadFile(bad)
	if err := os.WriteFile(bad, data[:len(data)-5], 0o600); err != nil {
		t.Fatal(err)
	}
	journals = append(journals, bad)
	// Under another journal's name.
	stolen := validJournal()
	renamed := filepath.Join(state, journalDirName, newJournalID()+journalPending)
	if err := os.WriteFile(renamed, encodeJournal(stolen), 0o600); err != nil {
		t.Fatal(err)
	}
	journals = append(journals, renamed)
	tbFile(t, work, "f", "f")

	beforeWork, beforeOutside := treeState(t, work), treeState(t, outside)
	var log strings.Builder
	ct := &crashTree{root: work, state: state}
	recoverWith(t, ct, &log, pol)
	for _, j := range journals {
		if _, err := os.Stat(j + journalBad); err != nil {
			t.Errorf("%s not set aside: %v", filepath.Base(j), err)
		}
	}
	sameTree(t, work, beforeWork)
	sameTree(t, outside, beforeOutside)
	if got := tbRead(t, filepath.Join(state, "keep")); got != "x" {
		t.Errorf("the state directory's file = %q", got)
	}
	for _, want := range []string{"which the tools may not write", "checksum does not match", "does not match its file name", "set aside"} {
		if !strings.Contains(log.String(), want) {
			t.Errorf("log does not say %q:\n%s", want, log.String())
		}
	}
	// Set aside, they are not looked at again.
	log.Reset()
	recoverWith(t, ct, &log, pol)
	if log.Len() > 0 {
		t.Errorf("journals set aside were looked at again:\n%s", log.String())
	}
}

// TestJournalNoLinks: recovery reaches a journal's files without
// following symbolic links: a directory swapped for a link after the
// crash refuses the journal instead of redirecting it.
func TestJournalNoLinks(t *testing.T) {
	root := t.TempDir()
	work, elsewhere := filepath.Join(root, "work"), filepath.Join(root, "elsewhere")
	state := filepath.Join(root, "state")
	rec, _ := plantedModify(t, filepath.Join(work, "d"), "f", "old", "new")
	// The same names, elsewhere, reached through a link in place of d.
	tbFile(t, elsewhere, "f", "new")
	tbFile(t, elsewhere, rec.backup(0), "old")
	if err := os.Rename(filepath.Join(work, "d"), filepath.Join(work, "d.moved")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(elsewhere, filepath.Join(work, "d")); err != nil {
		t.Fatal(err)
	}
	j := writeJournal(t, state, rec, journalPending)
	var log strings.Builder
	recoverIn(t, &crashTree{root: work, state: state}, &log)
	if got := tbRead(t, filepath.Join(elsewhere, "f")); got != "new" {
		t.Errorf("the file behind the link became %q", got)
	}
	if _, err := os.Stat(j + journalBad); err != nil {
		t.Errorf("journal not set aside (%v); log:\n%s", err, log.String())
	}
}

// TestJournalLiveCommitLeftAlone: the journal of a commit in progress
// (its file flocked) is not recovered, so that a patch running in this
// process or another is never undone under it.
func TestJournalLiveCommitLeftAlone(t *testing.T) {
	tb := tbNew(t)
	rec, backup := plantedModify(t, tb.cfg.Cwd, "f", "old", "new")
	p := writeJournal(t, tb.cfg.StateDir, rec, journalPending)
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := safefs.LockNB(f); !ok {
		t.Fatal(err)
	}
	tb.journals.recover()
	if got := tbRead(t, filepath.Join(tb.cfg.Cwd, "f")); got != "new" {
		t.Errorf("a live commit was rolled back: f = %q", got)
	}
	if _, err := os.Stat(backup); err != nil {
		t.Errorf("a live commit's backup was removed: %v", err)
	}
	// Once the commit's process is gone (its lock with it), it is.
	f.Close()
	tb.journals.recover()
	if got := tbRead(t, filepath.Join(tb.cfg.Cwd, "f")); got != "old" {
		t.Errorf("f = %q after recovery, want the old content", got)
	}
	tbOnly(t, tb.cfg.Cwd, "f")
	if _, err := os.Stat(p); !os.IsNotExist(err) {
		t.Errorf("journal still there: %v", err)
	}
}

// TestJournalRecoveredBeforePatch: a journal found while the agent runs
// is recovered before the next patch touches the files.
func TestJournalRecoveredBeforePatch(t *testing.T) {
	tb := tbNew(t)
	rec, _ := plantedModify(t, tb.cfg.Cwd, "f", "old\n", "new\n")
	writeJournal(t, tb.cfg.StateDir, rec, journalPending)
	r := patchCall(t, tb, "--- a/f\n+++ b/f\n@@ -1 +1 @@\n-old\n+older\n", false)
	if r.IsError {
		t.Fatalf("patch of the recovered file: %s", tbText(t, r))
	}
	if got := tbRead(t, filepath.Join(tb.cfg.Cwd, "f")); got != "older\n" {
		t.Errorf("f = %q", got)
	}
	tbOnly(t, tb.cfg.Cwd, "f")
}

// TestPatchRefusedWithoutJournal: a patch whose journal cannot be
// written is refused, changing nothing.
func TestPatchRefusedWithoutJournal(t *testing.T) {
	tb := tbNew(t)
	p := tbFile(t, tb.cfg.Cwd, "f", "old\n")
	// The journal directory is replaced by a file once the agent runs.
	dir := filepath.Join(tb.cfg.StateDir, journalDirName)
	if err := os.Remove(dir); err != nil {
		t.Fatal(err)
	}
	tbFile(t, tb.cfg.StateDir, journalDirName, "not a directory")
	r := patchCall(t, tb, "--- a/f\n+++ b/f\n@@ -1 +1 @@\n-old\n+new\n", false)
	if text := tbText(t, r); !r.IsError || !strings.HasPrefix(text, "the patch was not applied; nothing was changed: cannot write the journal") ||
		!strings.HasSuffix(text, "make "+dir+" a writable directory") {
		t.Errorf("result: %s", text)
	}
	if got := tbRead(t, p); got != "old\n" {
		t.Errorf("f = %q", got)
	}
	tbOnly(t, tb.cfg.Cwd, "f")
}
