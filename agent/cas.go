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
	"path/filepath"
	"strings"

	"github.com/fleetmcp/fleetmcp/agent/safefs"
	"github.com/fleetmcp/fleetmcp/protocol"
)

// The expected_sha256 argument is the compare-and-swap guard of the tools
// that change files (write, edit, delete, move): when it is set and the
// file's current content hashes differently, or the file is gone, nothing
// changes. Callers hold the file's lock (toolbox.lockFile) from the
// check to the change, so mutations of one file on one agent are
// serialised and the check cannot go stale in between.

// expectedHash returns the normalised hash of an expected_sha256 argument
// ("" when none was given) or a failure saying what is wrong with it.
func expectedHash(tc *toolCall, arg string) (string, *protocol.Result) {
	if arg == "" {
		return "", nil
	}
	h := strings.ToLower(strings.TrimPrefix(arg, "sha256:"))
	if len(h) != sha256.Size*2 || strings.Trim(h, "0123456789abcdef") != "" {
		return "", toolFailure(tc, "expected_sha256 %q is not a SHA-256 hash; give the 64 hexadecimal digits that read returned as sha256", arg)
	}
	return h, nil
}

// sha256Hex returns the lowercase hexadecimal SHA-256 of data.
func sha256Hex(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

// currentSHA256 hashes the regular file at target, a resolved path the
// guard allowed, opened without following links. A missing file hashes as
// "" with a nil error. The agent's credentials are refused even under
// another name (a hard link): their hash is not to be learned either.
func (t *toolbox) currentSHA256(ctx context.Context, target string) (string, error) {
	d, err := safefs.OpenDir(filepath.Dir(target), false)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	defer d.Close()
	f, err := d.OpenRead(filepath.Base(target))
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "", err
	}
	if !safefs.OpenedRegular(fi) {
		return "", fmt.Errorf("%s is not a regular file", target)
	}
	if err := t.guard.checkOpened(target, fi); err != nil {
		return "", err
	}
	return hashReader(ctx, f)
}

// hashReader returns the SHA-256 of what r holds. It stops when ctx ends
// (a file can be large).
func hashReader(ctx context.Context, r io.Reader) (string, error) {
	h := sha256.New()
	if _, err := io.Copy(h, ctxReader{ctx, r}); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// ctxReader reads from r until ctx ends, then fails with ctx's error:
// a long read, or a decoder reading, stops within one read of it.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// ctxReaderAt is ctxReader with ReadAt, for decoders that read at
// offsets (TIFF) and would otherwise copy the whole input first.
type ctxReaderAt struct {
	ctxReader
	ra io.ReaderAt
}

func (c ctxReaderAt) ReadAt(p []byte, off int64) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.ra.ReadAt(p, off)
}

// ctxWriter writes to w until ctx ends, then fails with ctx's error.
type ctxWriter struct {
	ctx context.Context
	w   io.Writer
}

func (c ctxWriter) Write(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.w.Write(p)
}

// isCancelled reports whether err is a context's end.
func isCancelled(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

// checkExpected compares the file at target with want, the result of
// casArgs.expected. It returns nil when want is "" or matches, and the
// failure to answer with otherwise.
func (t *toolbox) checkExpected(ctx context.Context, tc *toolCall, path, target, want string) *protocol.Result {
	if want == "" {
		return nil
	}
	got, err := t.currentSHA256(ctx, target)
	if isCancelled(err) {
		return protocol.ErrorResult(tc.ID, protocol.CodeCancelled, path+": cancelled while checking expected_sha256; nothing was changed")
	}
	if err != nil {
		return pathFailure(tc, path, err)
	}
	if got == want {
		return nil
	}
	return casMismatch(tc, path, want, got)
}

// casMismatch is the failure for a file whose content is not the one the
// caller expected; current is "" when the file does not exist. The
// current hash is in the text and in the structured result
// (current_sha256), so the caller can re-read and retry.
func casMismatch(tc *toolCall, path, want, current string) *protocol.Result {
	var msg string
	if current == "" {
		msg = fmt.Sprintf("%s does not exist (expected sha256 %s); nothing was changed. Check the path, or leave out expected_sha256 to create it.", path, want)
	} else {
		msg = fmt.Sprintf("%s has changed: its sha256 is %s, not the expected %s; nothing was changed. Read the file again and redo the change against its current content.", path, current, want)
	}
	r := toolFailure(tc, "%s", msg)
	r.Structured, _ = json.Marshal(map[string]any{"path": path, "expected_sha256": want, "current_sha256": current, "exists": current != ""})
	return r
}
