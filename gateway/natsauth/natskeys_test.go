package natsauth

import (
	"log/slog"
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
	quiet := slog.New(slog.DiscardHandler)
	dir := t.TempDir()
	first, err := loadOrCreateNATSKeys(dir, quiet)
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
	again, err := loadOrCreateNATSKeys(dir, quiet)
	if err != nil {
		t.Fatal(err)
	}
	for i, pair := range [][2]nkeys.KeyPair{{first.operator, again.operator}, {first.agentSigner, again.agentSigner},
		{first.gatewaySigner, again.gatewaySigner}, {first.enrolSigner, again.enrolSigner}, {first.systemSigner, again.systemSigner}} {
		if publicKey(pair[0]) != publicKey(pair[1]) {
			t.Errorf("key %s changed across starts", keyFiles[i].name)
		}
	}
	if first.accountPub != again.accountPub || first.systemPub != again.systemPub {
		t.Error("an account's public key changed across starts")
	}
	seen := map[string]bool{first.accountPub: true, first.systemPub: true}
	for _, kp := range []nkeys.KeyPair{first.operator, first.agentSigner, first.gatewaySigner, first.enrolSigner, first.systemSigner} {
		if seen[publicKey(kp)] {
			t.Error("two roles share a key")
		}
		seen[publicKey(kp)] = true
	}
	// The accounts' own keys are not kept.
	for _, f := range []string{legacyAccountKeyFile, legacySystemKeyFile} {
		if _, err := os.Stat(filepath.Join(dir, natsDir, f)); err == nil {
			t.Errorf("%s is kept in the data directory", f)
		}
	}

	// A key file others may read is made private again.
	path := filepath.Join(dir, natsDir, agentSignerKeyFile)
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := loadOrCreateNATSKeys(dir, quiet); err != nil {
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
		_, err := loadOrCreateNATSKeys(bad, quiet)
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

// A data directory that holds the accounts' own keys (made before
// scoped signing keys) moves to them at its next start: the keys are
// removed, their public keys kept, and the signing keys derived from
// them, so that two nodes seeded with the same account keys derive the
// same ones.
func TestNATSKeysMoveFromAccountKeys(t *testing.T) {
	acct, _ := nkeys.CreateAccount()
	sys, _ := nkeys.CreateAccount()
	op, _ := nkeys.CreateOperator()
	var got []*natsKeys
	for range 2 {
		dir := t.TempDir()
		nd := filepath.Join(dir, natsDir)
		if err := os.MkdirAll(nd, 0o700); err != nil {
			t.Fatal(err)
		}
		for name, kp := range map[string]nkeys.KeyPair{legacyAccountKeyFile: acct, legacySystemKeyFile: sys, operatorKeyFile: op} {
			seed, _ := kp.Seed()
			if err := os.WriteFile(filepath.Join(nd, name), seed, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		var logged strings.Builder
		keys, err := loadOrCreateNATSKeys(dir, slog.New(slog.NewTextHandler(&logged, nil)))
		if err != nil {
			t.Fatal(err)
		}
		if keys.accountPub != publicKey(acct) || keys.systemPub != publicKey(sys) || publicKey(keys.operator) != publicKey(op) {
			t.Fatalf("the fleet's identity changed: account %s system %s", keys.accountPub, keys.systemPub)
		}
		for _, f := range []string{legacyAccountKeyFile, legacySystemKeyFile} {
			if _, err := os.Stat(filepath.Join(nd, f)); err == nil {
				t.Errorf("%s was kept", f)
			}
			if !strings.Contains(logged.String(), f) {
				t.Errorf("the log does not name the removed %s: %s", f, logged.String())
			}
		}
		got = append(got, keys)
	}
	for _, pair := range [][2]nkeys.KeyPair{{got[0].gatewaySigner, got[1].gatewaySigner}, {got[0].enrolSigner, got[1].enrolSigner},
		{got[0].systemSigner, got[1].systemSigner}} {
		if publicKey(pair[0]) != publicKey(pair[1]) {
			t.Error("two nodes with the same account keys derived different signing keys")
		}
	}

	// A stray account key that is not the fleet's is refused, not removed.
	dir := t.TempDir()
	if _, err := loadOrCreateNATSKeys(dir, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	seed, _ := acct.Seed()
	stray := filepath.Join(dir, natsDir, legacyAccountKeyFile)
	if err := os.WriteFile(stray, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := loadOrCreateNATSKeys(dir, slog.New(slog.DiscardHandler)); err == nil || !strings.Contains(err.Error(), accountPubFile) {
		t.Errorf("a stray account key: %v", err)
	}
	if _, err := os.Stat(stray); err != nil {
		t.Error("the stray account key was removed")
	}
}

func FuzzReadPubFile(f *testing.F) {
	acct, _ := nkeys.CreateAccount()
	f.Add([]byte(publicKey(acct) + "\n"))
	f.Add([]byte("SAAxxx"))
	f.Add([]byte(""))
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, data []byte) {
		path := filepath.Join(dir, "k.pub")
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		pub, err := readPubFile(path, "fleet account")
		if err == nil && !nkeys.IsValidPublicAccountKey(pub) {
			t.Fatalf("took %q", pub)
		}
	})
}
