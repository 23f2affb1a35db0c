package gateway

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// The signing key is made once (0600) and read back the same; a
// configured file must exist; a damaged file and a bad previous key are
// errors that say what to do; older keys stay trusted after the current.
func TestSigningKeyFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, signingDir, signingKeyFile)
	k1, err := loadOrCreateSigningKey(path, true)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v %v", fi, err)
	}
	k2, err := loadOrCreateSigningKey(path, true)
	if err != nil || !slices.Equal(k1.trusted, k2.trusted) || len(k1.trusted) != 1 {
		t.Fatalf("reloaded key %v (%v), first %v", k2, err, k1.trusted)
	}
	sig := k2.sign(protocol.PurposeManifest, []byte("m"))
	if err := protocol.VerifyBytes(k1.trusted, protocol.PurposeManifest, []byte("m"), sig); err != nil {
		t.Fatal(err)
	}
	if _, err := loadOrCreateSigningKey(filepath.Join(dir, "missing.key"), false); err == nil {
		t.Fatal("a configured key file that does not exist was accepted")
	}
	// Readable by others: made private again.
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := loadOrCreateSigningKey(path, true); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file left %v", fi.Mode().Perm())
	}
	other := testSigningKey(t)
	prev := filepath.Join(dir, signingDir, previousKeyFile)
	if err := os.WriteFile(prev, []byte("# rotated out\n"+other.trusted[0]+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	k3, err := loadOrCreateSigningKey(path, true)
	if err != nil || !slices.Equal(k3.trusted, []string{k1.trusted[0], other.trusted[0]}) {
		t.Fatalf("with a previous key: %v, %v", k3, err)
	}
	if err := os.WriteFile(prev, []byte("ed25519:nope\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := loadOrCreateSigningKey(path, true); err == nil || !strings.Contains(err.Error(), "line 1") {
		t.Fatalf("a bad previous key: %v", err)
	}
	if err := os.WriteFile(path, []byte("not a key\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := loadOrCreateSigningKey(path, true); err == nil || !strings.Contains(err.Error(), "copy it from another replica") {
		t.Fatalf("a damaged key: %v", err)
	}
}
