package agent

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fleetmcp/fleetmcp/agent/safefs"
	"github.com/fleetmcp/fleetmcp/protocol"
)

// bundleSource is where bundles come from: the gateways, over the
// agent's own subjects.
type bundleSource interface {
	manifest(ctx context.Context, id string) (*protocol.SignedManifest, error)
	// blob returns n bytes of the file with digest sha from off.
	blob(ctx context.Context, sha string, off, n int64) ([]byte, error)
}

// natsBundles asks the gateways on nc.
type natsBundles struct {
	nc      *nats.Conn
	host    string
	timeout time.Duration // per request
}

// request sends data to subject and returns the reply's data, or the
// gateway's APIError. A request that gets no answer is tried once more.
func (b *natsBundles) request(ctx context.Context, subject string, data []byte) ([]byte, error) {
	var msg *nats.Msg
	var err error
	for range 2 {
		rctx, cancel := context.WithTimeout(ctx, b.timeout)
		msg, err = b.nc.RequestWithContext(rctx, subject, data)
		cancel()
		if err == nil || ctx.Err() != nil || !(errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout)) {
			break
		}
	}
	if err != nil {
		if errors.Is(err, nats.ErrNoResponders) {
			return nil, errors.New("no gateway answers the agent's bundle requests; the install is retried when the gateway pokes the host again or at the next periodic check")
		}
		return nil, err
	}
	if msg.Header.Get(protocol.SkillsErrorHeader) != "" {
		var e protocol.APIError
		if json.Unmarshal(msg.Data, &e) != nil || e.Message == "" {
			return nil, fmt.Errorf("the gateway answered with an error it did not explain: %s", protocol.Excerpt(string(msg.Data)))
		}
		return nil, fmt.Errorf("the gateway refused: %w", &e)
	}
	return msg.Data, nil
}

func (b *natsBundles) manifest(ctx context.Context, id string) (*protocol.SignedManifest, error) {
	req, _ := json.Marshal(protocol.SkillManifestRequest{BundleID: id})
	data, err := b.request(ctx, protocol.SkillsManifestSubject(b.host), req)
	if err != nil {
		return nil, fmt.Errorf("fetch the manifest of %s: %w", id, err)
	}
	var m protocol.SignedManifest
	if err := json.Unmarshal(data, &m); err != nil {
		var e protocol.APIError
		if json.Unmarshal(data, &e) == nil && e.Message != "" {
			return nil, fmt.Errorf("fetch the manifest of %s: the gateway refused: %w", id, &e)
		}
		return nil, fmt.Errorf("fetch the manifest of %s: the answer is not a signed manifest: %w", id, err)
	}
	return &m, nil
}

func (b *natsBundles) blob(ctx context.Context, sha string, off, n int64) ([]byte, error) {
	req, _ := json.Marshal(protocol.SkillBlobRequest{SHA256: sha, Offset: off, Length: n})
	return b.request(ctx, protocol.SkillsBlobSubject(b.host), req)
}

// permanentError is an install failure that trying again cannot mend
// (a bad signature, a wrong digest): the agent does not retry the same
// bundle until the desired state changes.
type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

func permanent(format string, args ...any) error {
	return &permanentError{fmt.Errorf(format, args...)}
}

// checkManifest verifies a signed manifest for bundle id of skill name.
func checkManifest(sm *protocol.SignedManifest, keys []string, name, id string) error {
	if err := protocol.VerifyBytes(keys, protocol.PurposeManifest, sm.Manifest.CanonicalBytes(), sm.Signature); err != nil {
		return permanent("manifest of %s: %w", id, err)
	}
	if got := sm.Manifest.BundleID(); got != id || sm.BundleID != id {
		return permanent("the gateway sent the manifest of bundle %s when %s was asked for", protocol.Excerpt(got), id)
	}
	if sm.Manifest.Name != name {
		return permanent("bundle %s is the skill %s, not %q", id, protocol.Excerpt(sm.Manifest.Name), name)
	}
	if err := sm.Manifest.Validate(); err != nil {
		return permanent("bundle %s breaks the bundle rules: %w", id, err)
	}
	return nil
}

// stage writes bundle m of skill name into a new staging folder, every
// file checked against its size and digest, with its mode, synced to
// disk; then renames it to its version folder, after the manifest. Files
// whose digest a version on disk has are copied from it (and checked)
// instead of fetched.
func (s *skillStore) stage(ctx context.Context, src bundleSource, m *protocol.Manifest) error {
	name, v := m.Name, shortID(m.BundleID())
	dir := s.versionsDir(name)
	if err := s.ownDirs(name, true); err != nil {
		return err
	}
	staging := filepath.Join(dir, stagingPrefix+v+"-"+randomSuffix())
	if err := os.Mkdir(staging, 0o755); err != nil {
		return fmt.Errorf("make a staging folder: %w", err)
	}
	done := false
	defer func() {
		if !done {
			os.RemoveAll(staging)
		}
	}()
	local := s.localFiles(name)
	dirs := map[string]bool{staging: true}
	for _, f := range m.Files {
		if err := ctx.Err(); err != nil {
			return err
		}
		p := filepath.Join(staging, filepath.FromSlash(f.Path))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return fmt.Errorf("stage %s: %w", f.Path, err)
		}
		for d := filepath.Dir(p); d != staging; d = filepath.Dir(d) {
			dirs[d] = true
		}
		if err := writeBundleFile(ctx, src, p, f, local[f.SHA256]); err != nil {
			return err
		}
	}
	for d := range dirs {
		safefs.SyncDir(d)
	}
	data, _ := json.Marshal(m)
	if err := safefs.WriteStateFile(filepath.Join(dir, v+".json"), data); err != nil {
		return fmt.Errorf("keep the manifest: %w", err)
	}
	if err := os.Rename(staging, filepath.Join(dir, v)); err != nil {
		return fmt.Errorf("move the staged version into place: %w", err)
	}
	done = true
	safefs.SyncDir(dir)
	return nil
}

// localFiles maps the digests of the files of name's versions on disk to
// one of their paths.
func (s *skillStore) localFiles(name string) map[string]string {
	out := make(map[string]string)
	if s.legacy != nil {
		out = s.legacy.localFiles(name)
	}
	for _, v := range s.versions(name) {
		m, err := s.readManifest(name, v)
		if err != nil {
			continue
		}
		for _, f := range m.Files {
			out[f.SHA256] = filepath.Join(s.versionsDir(name), v, filepath.FromSlash(f.Path))
		}
	}
	return out
}

// writeBundleFile creates p with f's contents, copied from the file at
// local when it has them, else fetched, and checks its size and digest.
func writeBundleFile(ctx context.Context, src bundleSource, p string, f protocol.BundleFile, local string) error {
	if local != "" {
		if err := copyChecked(local, p, f); err == nil {
			return nil
		}
		os.Remove(p) // a local copy that no longer matches: fetch it
	}
	out, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("stage %s: %w", f.Path, err)
	}
	defer out.Close()
	h := sha256.New()
	for off := int64(0); off < f.Size; {
		n := min(f.Size-off, protocol.MaxBlobChunk)
		data, err := src.blob(ctx, f.SHA256, off, n)
		if err != nil {
			return fmt.Errorf("fetch %s: %w", f.Path, err)
		}
		if int64(len(data)) != n {
			return permanent("%s: the gateway sent %d bytes at offset %d where %d were asked for: the file is not the size the manifest says (%d bytes)",
				f.Path, len(data), off, n, f.Size)
		}
		h.Write(data)
		if _, err := out.Write(data); err != nil {
			return fmt.Errorf("stage %s: %w", f.Path, err)
		}
		off += n
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != f.SHA256 {
		return permanent("%s: the fetched file has SHA-256 %s, not %s as the signed manifest says", f.Path, got, f.SHA256)
	}
	return finishFile(out, f)
}

// copyChecked copies the file at from to p, checking it against f.
func copyChecked(from, p string, f protocol.BundleFile) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	defer out.Close()
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(out, h), io.LimitReader(in, f.Size+1))
	if err != nil {
		return err
	}
	if n != f.Size || hex.EncodeToString(h.Sum(nil)) != f.SHA256 {
		return errors.New("the local copy changed")
	}
	return finishFile(out, f)
}

// finishFile gives a staged file its mode and syncs it.
func finishFile(out *os.File, f protocol.BundleFile) error {
	if err := out.Chmod(fs.FileMode(f.Mode)); err != nil && !windowsModes() {
		return fmt.Errorf("stage %s: %w", f.Path, err)
	}
	if err := out.Sync(); err != nil {
		return fmt.Errorf("stage %s: %w", f.Path, err)
	}
	return nil
}

// windowsModes reports whether file modes are Windows' (no executable
// bit to keep or check).
func windowsModes() bool { return runtime.GOOS == "windows" }

// rolloutUnsupported says why this system takes no rollouts, or "".
func rolloutUnsupported() string {
	if runtime.GOOS == "windows" {
		return "skill rollouts are not supported on Windows hosts yet: the served folder is a symbolic link swapped atomically, " +
			"which Windows allows only with extra privileges; copy the skill's folder into the skills folder by hand"
	}
	return ""
}
