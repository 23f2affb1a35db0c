package gateway

import (
	"crypto/ed25519"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

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
	if err != nil || !slices.Equal(k1.trusted(), k2.trusted()) || len(k1.trusted()) != 1 {
		t.Fatalf("reloaded key %v (%v), first %v", k2, err, k1.trusted())
	}
	sig := k2.sign(protocol.PurposeManifest, []byte("m"))
	if err := protocol.VerifyBytes(k1.trusted(), protocol.PurposeManifest, []byte("m"), sig); err != nil {
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
	if err := os.WriteFile(prev, []byte("# rotated out\n"+other.trusted()[0]+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	k3, err := loadOrCreateSigningKey(path, true)
	if err != nil || !slices.Equal(k3.trusted(), []string{k1.trusted()[0], other.trusted()[0]}) {
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

// TestSigningKeyRotation: a rotation keeps the old key beside the new
// one and adds a key set of both, signed by both; the gateway then signs
// for each host with the newest key it trusts; retiring adds a set of
// the new key alone and forgets the old one. Directories whose files do
// not belong together are refused with what to do.
func TestSigningKeyRotation(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, signingDir, signingKeyFile)
	k, err := loadOrCreateSigningKey(path, true)
	if err != nil {
		t.Fatal(err)
	}
	old := k.currentKeyID()
	if _, err := RetireSigningKey(path, time.Now()); err == nil || !strings.Contains(err.Error(), "no rotation is under way") {
		t.Errorf("retire without a rotation: %v", err)
	}
	rep, err := RotateSigningKey(path, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if rep.Serial != 1 || len(rep.Keys) != 2 || rep.Keys[1] != k.trusted()[0] {
		t.Fatalf("rotation report %+v", rep)
	}
	if _, err := RotateSigningKey(path, time.Now()); err == nil || !strings.Contains(err.Error(), "under way already") {
		t.Errorf("a second rotation: %v", err)
	}
	if err := k.reload(); err != nil {
		t.Fatal(err)
	}
	cur := k.currentKeyID()
	if cur == old || !slices.Equal(k.trusted(), rep.Keys) || k.serial() != 1 {
		t.Fatalf("after the rotation: signs with %s, trusted %v", cur, k.trusted())
	}
	if env := k.envelopeSigner([]string{old}); env == nil || env.KeyID() != old {
		t.Error("a host that trusts only the old key is not signed for with it")
	}
	if env := k.envelopeSigner([]string{old, cur}); env == nil || env.KeyID() != cur {
		t.Error("a host that trusts both keys is not signed for with the new one")
	}
	// The chain moves an agent that trusts the old key on.
	chain, _ := k.chain()
	st, err := protocol.KeyState{Keys: []string{rep.Keys[1]}}.Apply(&chain)
	if err != nil || st.Serial != 1 {
		t.Fatalf("an agent of the old key: %+v, %v", st, err)
	}

	if _, err := RetireSigningKey(path, time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := k.reload(); err != nil {
		t.Fatal(err)
	}
	if env := k.envelopeSigner([]string{old}); env != nil {
		t.Error("after the retirement the old key still signs")
	}
	if len(k.trusted()) != 1 || k.serial() != 2 {
		t.Errorf("after the retirement: trusted %v, serial %d", k.trusted(), k.serial())
	}
	chain, _ = k.chain()
	if st, err = st.Apply(&chain); err != nil || st.Serial != 2 || len(st.Keys) != 1 {
		t.Fatalf("the agent after the retirement: %+v, %v", st, err)
	}

	// A gateway.key that is not the latest set's first key.
	if err := os.WriteFile(path, seedLine(ed25519.NewKeyFromSeed(make([]byte, 32))), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := k.reload(); err == nil || !strings.Contains(err.Error(), "different rotations") {
		t.Errorf("a key from elsewhere: %v", err)
	}
	if k.currentKeyID() != cur {
		t.Error("a refused reload changed the keys in force")
	}
}

func testSigningKey(t *testing.T) *signingKey {
	t.Helper()
	k, err := loadOrCreateSigningKey(t.TempDir()+"/gateway.key", true)
	if err != nil {
		t.Fatal(err)
	}
	return k
}
