package signing

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
	path := filepath.Join(dir, Dir, KeyFile)
	k1, err := Open(path, true)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v %v", fi, err)
	}
	k2, err := Open(path, true)
	if err != nil || !slices.Equal(k1.Trusted(), k2.Trusted()) || len(k1.Trusted()) != 1 {
		t.Fatalf("reloaded key %v (%v), first %v", k2, err, k1.Trusted())
	}
	sig := k2.Sign(protocol.PurposeManifest, []byte("m"))
	if err := protocol.VerifyBytes(k1.Trusted(), protocol.PurposeManifest, []byte("m"), sig); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(filepath.Join(dir, "missing.key"), false); err == nil {
		t.Fatal("a configured key file that does not exist was accepted")
	}
	// Readable by others: made private again.
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(path, true); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file left %v", fi.Mode().Perm())
	}
	other := testSigningKey(t)
	prev := filepath.Join(dir, Dir, PreviousKeyFile)
	if err := os.WriteFile(prev, []byte("# rotated out\n"+other.Trusted()[0]+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	k3, err := Open(path, true)
	if err != nil || !slices.Equal(k3.Trusted(), []string{k1.Trusted()[0], other.Trusted()[0]}) {
		t.Fatalf("with a previous key: %v, %v", k3, err)
	}
	if err := os.WriteFile(prev, []byte("ed25519:nope\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(path, true); err == nil || !strings.Contains(err.Error(), "line 1") {
		t.Fatalf("a bad previous key: %v", err)
	}
	if err := os.WriteFile(path, []byte("not a key\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(path, true); err == nil || !strings.Contains(err.Error(), "copy it from another replica") {
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
	path := filepath.Join(dir, Dir, KeyFile)
	k, err := Open(path, true)
	if err != nil {
		t.Fatal(err)
	}
	old := k.CurrentKeyID()
	if _, err := Retire(path, time.Now()); err == nil || !strings.Contains(err.Error(), "no rotation is under way") {
		t.Errorf("retire without a rotation: %v", err)
	}
	rep, err := Rotate(path, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if rep.Serial != 1 || len(rep.Keys) != 2 || rep.Keys[1] != k.Trusted()[0] {
		t.Fatalf("rotation report %+v", rep)
	}
	if _, err := Rotate(path, time.Now()); err == nil || !strings.Contains(err.Error(), "under way already") {
		t.Errorf("a second rotation: %v", err)
	}
	if err := k.Reload(); err != nil {
		t.Fatal(err)
	}
	cur := k.CurrentKeyID()
	if cur == old || !slices.Equal(k.Trusted(), rep.Keys) || k.Serial() != 1 {
		t.Fatalf("after the rotation: signs with %s, trusted %v", cur, k.Trusted())
	}
	if env := k.EnvelopeSigner([]string{old}); env == nil || env.KeyID() != old {
		t.Error("a host that trusts only the old key is not signed for with it")
	}
	if env := k.EnvelopeSigner([]string{old, cur}); env == nil || env.KeyID() != cur {
		t.Error("a host that trusts both keys is not signed for with the new one")
	}
	// The chain moves an agent that trusts the old key on.
	chain, _ := k.Chain()
	st, err := protocol.KeyState{Keys: []string{rep.Keys[1]}}.Apply(&chain)
	if err != nil || st.Serial != 1 {
		t.Fatalf("an agent of the old key: %+v, %v", st, err)
	}

	if _, err := Retire(path, time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := k.Reload(); err != nil {
		t.Fatal(err)
	}
	if env := k.EnvelopeSigner([]string{old}); env != nil {
		t.Error("after the retirement the old key still signs")
	}
	if len(k.Trusted()) != 1 || k.Serial() != 2 {
		t.Errorf("after the retirement: trusted %v, serial %d", k.Trusted(), k.Serial())
	}
	chain, _ = k.Chain()
	if st, err = st.Apply(&chain); err != nil || st.Serial != 2 || len(st.Keys) != 1 {
		t.Fatalf("the agent after the retirement: %+v, %v", st, err)
	}

	// A gateway.key that is not the latest set's first key.
	if err := os.WriteFile(path, seedLine(ed25519.NewKeyFromSeed(make([]byte, 32))), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := k.Reload(); err == nil || !strings.Contains(err.Error(), "different rotations") {
		t.Errorf("a key from elsewhere: %v", err)
	}
	if k.CurrentKeyID() != cur {
		t.Error("a refused reload changed the keys in force")
	}
}

func testSigningKey(t *testing.T) *Keys {
	t.Helper()
	k, err := Open(t.TempDir()+"/gateway.key", true)
	if err != nil {
		t.Fatal(err)
	}
	return k
}
