package gateway

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nkeys"
)

// The NATS keys are made once, private, and the same at every start; a
// file holding the wrong kind of key, or none, is refused with what it
// should hold.
func TestNATSKeys(t *testing.T) {
	dir := t.TempDir()
	first, err := loadOrCreateNATSKeys(dir)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(dir, natsDir))
	if err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("nats directory: %v, mode %v; want 0700", err, fi.Mode().Perm())
	}
	for _, f := range keyFiles {
		fi, err := os.Stat(filepath.Join(dir, natsDir, f.name))
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v, mode %v; want 0600", f.name, err, fi.Mode().Perm())
		}
	}
	again, err := loadOrCreateNATSKeys(dir)
	if err != nil {
		t.Fatal(err)
	}
	for i, pair := range [][2]nkeys.KeyPair{{first.operator, again.operator}, {first.system, again.system},
		{first.account, again.account}, {first.agentSigner, again.agentSigner}} {
		if publicKey(pair[0]) != publicKey(pair[1]) {
			t.Errorf("key %s changed across starts", keyFiles[i].name)
		}
	}
	if publicKey(first.account) == publicKey(first.agentSigner) || publicKey(first.system) == publicKey(first.account) {
		t.Error("two roles share a key")
	}

	// A key file others may read is made private again.
	path := filepath.Join(dir, natsDir, agentSignerKeyFile)
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := loadOrCreateNATSKeys(dir); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o600 {
		t.Errorf("a key file readable by others stayed mode %v", fi.Mode().Perm())
	}

	user, _ := nkeys.CreateUser()
	userSeed, _ := user.Seed()
	for _, tc := range []struct {
		name    string
		content []byte
		want    []string
	}{
		{"a user key as the operator", userSeed, []string{operatorKeyFile, "a user seed", "not the operator key", "an operator seed"}},
		{"no seed", []byte("hello\n"), []string{operatorKeyFile, "does not hold an nkey seed", "operator key"}},
		{"a public key", []byte(publicKey(first.operator)), []string{operatorKeyFile, "does not hold an nkey seed"}},
	} {
		bad := t.TempDir()
		if err := os.MkdirAll(filepath.Join(bad, natsDir), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(bad, natsDir, operatorKeyFile), tc.content, 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := loadOrCreateNATSKeys(bad)
		if err == nil {
			t.Errorf("%s: accepted", tc.name)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %q does not say %q", tc.name, err, w)
			}
		}
	}
}
