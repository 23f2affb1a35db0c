package agent

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/fleetmcp/fleetmcp/agent/safefs"
)

// A patch changes many files, and the agent may die (kill -9, a power
// cut) halfway through renaming them in. So that a patch stays all or
// nothing across that, its commit keeps a journal in the state
// directory: before the first file changes, a journal file lists every
// file the commit touches, what it does to it, and the SHA-256 of the
// content before and after. The names of the staged new contents and of
// the hidden backups of old ones are derived from the journal's ID, so
// the journal names no file other than the targets themselves. Once
// every file is renamed in, the journal is marked committed; once the
// backups are removed, it is deleted.
//
// A journal left behind by a process that died is recovered when the
// toolbox starts (and before each later patch): one not yet committed is
// rolled back (the caller was never told the patch applied, and every
// old version is still there under its backup name), a committed one is
// finished (its backups removed). Recovery checks every target with the
// same rules as the tools (host policy, the agent's own files, no
// symbolic link on the way), touches only the targets and the names
// derived for them, and leaves alone a file whose content is neither the
// patch's old nor its new one: someone changed it since, and it is
// logged, not clobbered. Every step is a rename or an unlink that can be
// done again, so a crash during recovery is recovered by the next one.
// A journal that does not parse, or names a file the rules refuse, is
// never followed: it is renamed aside (<id>.bad) and logged.

// journalDirName is the journals' directory in the state directory.
const journalDirName = "journal"

// journalVersion is the version of the journal format.
const journalVersion = 1

// maxJournalBytes bounds a journal file; a patch touching so many files
// that its journal would be larger is refused.
const maxJournalBytes = 16 << 20

// Suffixes of journal files: being written (never acted on), written
// and not committed (roll back), committed (finish), set aside.
const (
	journalWriting   = ".tmp"
	journalPending   = ".pending"
	journalCommitted = ".committed"
	journalBad       = ".bad"
)

// What a commit does to one file.
const (
	actModify = "modify"
	actCreate = "create"
	actDelete = "delete"
)

// journalEntry is one file a commit changes.
type journalEntry struct {
	// Dir is the file's directory, absolute, clean and free of symbolic
	// links when the commit checked it; Name is the file's name in it.
	Dir    string `json:"dir"`
	Name   string `json:"name"`
	Action string `json:"action"`
	// Old is the SHA-256 of the content before (modify, delete), New the
	// SHA-256 of the content after (modify, create).
	Old string `json:"old,omitempty"`
	New string `json:"new,omitempty"`
	// Made lists the directories a create makes on the way to Dir,
	// outermost first; the last is Dir.
	Made []string `json:"made,omitempty"`
}

// journalRecord is the content of a journal file.
type journalRecord struct {
	Version int            `json:"version"`
	ID      string         `json:"id"`
	Entries []journalEntry `json:"entries"`
}

func (e *journalEntry) path() string { return filepath.Join(e.Dir, e.Name) }

// staged is the hidden name of entry i's new content while it waits to
// be renamed in, backup the hidden second name of its old content.
func (r *journalRecord) staged(i int) string { return hiddenName(r.Entries[i].Name, "tmp", r.ID, i) }
func (r *journalRecord) backup(i int) string { return hiddenName(r.Entries[i].Name, "orig", r.ID, i) }

// hiddenName is the name of a commit's hidden file for name: like the
// temporary files of write (".name.tmp-...") but tied to the journal.
func hiddenName(name, kind, id string, i int) string {
	return "." + safefs.CutName(name, 100) + "." + kind + "-" + id + "-" + strconv.Itoa(i)
}

// newJournalID returns a random journal ID: 32 hexadecimal digits.
func newJournalID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails
	return hex.EncodeToString(b[:])
}

// encodeJournal returns the journal file for r: its JSON, then a line
// with the SHA-256 of the JSON, so that a damaged file is recognised.
func encodeJournal(r *journalRecord) []byte {
	data, _ := json.Marshal(r) // strings and ints only: cannot fail
	return fmt.Appendf(data, "\nsha256 %s\n", sha256Hex(data))
}

// parseJournal decodes and checks a journal file. It accepts only what
// encodeJournal writes for a valid record.
func parseJournal(data []byte) (*journalRecord, error) {
	if len(data) > maxJournalBytes {
		return nil, fmt.Errorf("journal is %d bytes, more than %d", len(data), maxJournalBytes)
	}
	body, trailer, ok := bytes.Cut(data, []byte("\nsha256 "))
	if !ok {
		return nil, errors.New("journal has no checksum line")
	}
	sum, ok := bytes.CutSuffix(trailer, []byte("\n"))
	if !ok || string(sum) != sha256Hex(body) {
		return nil, errors.New("journal checksum does not match its content (the file is damaged or was cut short)")
	}
	var r journalRecord
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return nil, fmt.Errorf("journal is not valid JSON: %w", err)
	}
	if dec.More() {
		return nil, errors.New("journal has data after its JSON object")
	}
	if err := r.validate(); err != nil {
		return nil, err
	}
	return &r, nil
}

// validate checks a record as the commit writes it.
func (r *journalRecord) validate() error {
	if r.Version != journalVersion {
		return fmt.Errorf("journal version %d is not %d", r.Version, journalVersion)
	}
	if !isJournalID(r.ID) {
		return fmt.Errorf("journal ID %q is not 32 hexadecimal digits", r.ID)
	}
	if len(r.Entries) == 0 {
		return errors.New("journal has no entries")
	}
	seen := make(map[string]bool, len(r.Entries))
	for i := range r.Entries {
		e := &r.Entries[i]
		if err := e.validate(); err != nil {
			return fmt.Errorf("journal entry %d: %w", i, err)
		}
		if seen[e.path()] {
			return fmt.Errorf("journal entry %d: %s is listed twice", i, e.path())
		}
		seen[e.path()] = true
	}
	return nil
}

func (e *journalEntry) validate() error {
	if !cleanAbs(e.Dir) {
		return fmt.Errorf("directory %q is not an absolute clean path", e.Dir)
	}
	if !plainName(e.Name) {
		return fmt.Errorf("name %q is not a plain file name", e.Name)
	}
	oldOK, newOK := isSHA256(e.Old), isSHA256(e.New)
	switch e.Action {
	case actModify:
		if !oldOK || !newOK {
			return errors.New("a modify needs the old and the new SHA-256")
		}
	case actCreate:
		if e.Old != "" || !newOK {
			return errors.New("a create needs the new SHA-256 only")
		}
	case actDelete:
		if !oldOK || e.New != "" {
			return errors.New("a delete needs the old SHA-256 only")
		}
	default:
		return fmt.Errorf("action %q is not modify, create or delete", e.Action)
	}
	if len(e.Made) > 0 && e.Action != actCreate {
		return errors.New("only a create makes directories")
	}
	for k, d := range e.Made {
		// Each made directory is the parent of the next; the last is Dir.
		want := e.Dir
		if k+1 < len(e.Made) {
			want = filepath.Dir(e.Made[k+1])
		}
		if !cleanAbs(d) || d != want || isRoot(d) {
			return fmt.Errorf("made directory %q is not on the way to %s", d, e.Dir)
		}
	}
	return nil
}

func cleanAbs(p string) bool {
	return p != "" && filepath.IsAbs(p) && filepath.Clean(p) == p && !strings.ContainsRune(p, 0)
}

func plainName(n string) bool {
	return n != "" && n != "." && n != ".." && len(n) <= 255 && !strings.ContainsAny(n, "/\x00")
}

func isJournalID(s string) bool { return len(s) == 32 && isLowerHex(s) }

func isSHA256(s string) bool { return len(s) == 64 && isLowerHex(s) }

func isLowerHex(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// patchJournals is the directory of commit journals and what recovers
// them.
type patchJournals struct {
	dir   string
	guard *guard
	log   *slog.Logger
	// lock locks files against the agent's other mutations (lockFiles).
	lock func(paths ...string) (func(), error)
	// hook, for tests, runs before each entry a recovery handles.
	hook func(entry int)
	// mu serialises recoveries within the process; flocks on the
	// journal files keep out other processes and live commits.
	mu sync.Mutex
	// opening is held from the creation of a journal file to its flock,
	// and by a recovery from its open of a journal file to its flock, so
	// that no recovery takes a journal being created for a stale one. (A
	// recovery in another process on the same state directory could, in
	// that instant; the commit then fails before changing anything.)
	opening sync.Mutex
}

// newPatchJournals makes the journal directory in stateDir.
func newPatchJournals(stateDir string, g *guard, log *slog.Logger, lock func(...string) (func(), error)) (*patchJournals, error) {
	dir := filepath.Join(stateDir, journalDirName)
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, fmt.Errorf("create the patch journal directory: %w", err)
	}
	if fi, err := os.Lstat(dir); err != nil || !fi.IsDir() {
		return nil, fmt.Errorf("patch journal directory %s is not a directory (%w); remove what is there", dir, err)
	}
	return &patchJournals{dir: dir, guard: g, log: log, lock: lock}, nil
}

// liveJournal is the journal of a commit in progress. Its file stays
// open and flocked until the commit ends, so that no recovery takes it
// for the leftover of a dead process.
type liveJournal struct {
	j    *patchJournals
	rec  *journalRecord
	f    *os.File
	name string // the file's current name in j.dir
}

// begin writes r durably as a pending journal.
func (j *patchJournals) begin(r *journalRecord) (*liveJournal, error) {
	data := encodeJournal(r)
	if len(data) > maxJournalBytes {
		return nil, fmt.Errorf("the patch touches too many files to journal (%d); patch fewer files at a time", len(r.Entries))
	}
	name := r.ID + journalWriting
	j.opening.Lock()
	f, err := os.OpenFile(filepath.Join(j.dir, name), os.O_RDWR|os.O_CREATE|os.O_EXCL|safefs.NoFollow, 0o600)
	if err == nil {
		var locked bool
		if locked, err = safefs.LockNB(f); !locked {
			f.Close()
			os.Remove(filepath.Join(j.dir, name))
			err = fmt.Errorf("lock %s: %w", filepath.Join(j.dir, name), err)
		}
	}
	j.opening.Unlock()
	if err != nil {
		return nil, j.unwritable(err)
	}
	lj := &liveJournal{j: j, rec: r, f: f, name: name}
	if err := lj.write(data); err != nil {
		lj.end()
		return nil, j.unwritable(err)
	}
	return lj, nil
}

// unwritable describes a journal that could not be written.
func (j *patchJournals) unwritable(err error) error {
	return fmt.Errorf("cannot write the journal that keeps a patch all or nothing across a crash (%w); the agent's operator must make %s a writable directory", err, j.dir)
}

func (lj *liveJournal) write(data []byte) error {
	if _, err := lj.f.Write(data); err != nil {
		return err
	}
	if err := lj.f.Sync(); err != nil {
		return err
	}
	return lj.rename(lj.rec.ID + journalPending)
}

// rename renames the journal file and makes that durable.
func (lj *liveJournal) rename(to string) error {
	if err := os.Rename(filepath.Join(lj.j.dir, lj.name), filepath.Join(lj.j.dir, to)); err != nil {
		return err
	}
	lj.name = to
	safefs.SyncDir(lj.j.dir)
	return nil
}

// commit records that every file has its new content.
func (lj *liveJournal) commit() error {
	return lj.rename(lj.rec.ID + journalCommitted)
}

// end deletes the journal: the commit is over, one way or the other.
func (lj *liveJournal) end() {
	if err := os.Remove(filepath.Join(lj.j.dir, lj.name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		lj.j.log.Warn("patch journal not removed; it is recovered at the next start", "journal", filepath.Join(lj.j.dir, lj.name), "err", err)
	}
	lj.f.Close()
}

// journalFile splits a journal file name into its ID and suffix.
func journalFile(name string) (id, suffix string, ok bool) {
	id, suffix, ok = strings.Cut(name, ".")
	suffix = "." + suffix
	ok = ok && isJournalID(id) && slices.Contains([]string{journalWriting, journalPending, journalCommitted}, suffix)
	return id, suffix, ok
}

// readJournal reads at most maxJournalBytes+1 bytes of f.
func readJournal(f *os.File) ([]byte, error) {
	return io.ReadAll(io.LimitReader(f, maxJournalBytes+1))
}
