package natsauth

import (
	"crypto/x509"
	"encoding/pem"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// The fleet CA is made once (its key private), keeps its pin across
// starts, and issues server certificates that verify against it alone
// for the names they were issued for.
func TestFleetCA(t *testing.T) {
	dir := t.TempDir()
	ca, err := LoadOrCreateCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(CAKeyPath(dir)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("CA key: %v, mode %v; want 0600", err, fi.Mode().Perm())
	}
	if !ca.cert.IsCA || ca.cert.NotAfter.Before(time.Now().Add(9*365*24*time.Hour)) {
		t.Errorf("CA: IsCA %v, valid until %s; want a CA valid for 10 years", ca.cert.IsCA, ca.cert.NotAfter)
	}
	again, err := LoadOrCreateCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	if again.Pin() != ca.Pin() || !protocol.ValidCAPin(ca.Pin()) {
		t.Errorf("pin %s, then %s", ca.Pin(), again.Pin())
	}
	block, _ := pem.Decode(ca.pem)
	if c, err := x509.ParseCertificate(block.Bytes); err != nil || protocol.CAPin(c) != ca.Pin() {
		t.Errorf("the PEM agents get is not the CA (%v)", err)
	}

	leaf, err := ca.issueLeaf([]string{"localhost", "127.0.0.1", "gw.example"}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.cert)
	for _, name := range []string{"localhost", "127.0.0.1", "gw.example"} {
		if _, err := leaf.Leaf.Verify(x509.VerifyOptions{Roots: roots, DNSName: name}); err != nil {
			t.Errorf("the leaf does not verify for %s: %v", name, err)
		}
	}
	if _, err := leaf.Leaf.Verify(x509.VerifyOptions{Roots: roots, DNSName: "evil.example"}); err == nil {
		t.Error("the leaf verifies for a name it was not issued for")
	}
	other, _, _ := newCA(time.Now())
	otherRoots := x509.NewCertPool()
	otherRoots.AddCert(other.cert)
	if _, err := leaf.Leaf.Verify(x509.VerifyOptions{Roots: otherRoots, DNSName: "localhost"}); err == nil {
		t.Error("the leaf verifies against another CA")
	}
	if leaf.Leaf.NotAfter.After(ca.cert.NotAfter) {
		t.Error("the leaf outlives its CA")
	}
}

func TestFleetCADamaged(t *testing.T) {
	dir := t.TempDir()
	if _, err := LoadOrCreateCA(dir); err != nil {
		t.Fatal(err)
	}
	key := CAKeyPath(dir)
	if err := os.Remove(key); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadOrCreateCA(dir); err == nil || !strings.Contains(err.Error(), "only one of") {
		t.Errorf("a CA without its key: %v; want it refused", err)
	}
	if err := os.WriteFile(key, []byte("junk"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadOrCreateCA(dir); err == nil || !strings.Contains(err.Error(), "damaged") || !strings.Contains(err.Error(), "enrol again") {
		t.Errorf("a damaged CA key: %v; want it refused with what to do", err)
	}
	// Another CA's key beside the certificate.
	_, otherKey, _ := newCA(time.Now())
	if err := os.WriteFile(key, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: otherKey}), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadOrCreateCA(dir); err == nil || !strings.Contains(err.Error(), "not the certificate's") {
		t.Errorf("another CA's key: %v; want it refused", err)
	}
}

// A listener on every interface is reached by the machine's name and
// addresses; loopback names are always there, advertised ones too.
func TestLeafNames(t *testing.T) {
	host, _ := os.Hostname()
	all := LeafNames("0.0.0.0", []string{"gw.example"})
	for _, want := range []string{"localhost", "127.0.0.1", "::1", "gw.example", host} {
		if !slices.Contains(all, want) {
			t.Errorf("names for 0.0.0.0 %v lack %s", all, want)
		}
	}
	one := LeafNames("10.1.2.3", nil)
	if !slices.Contains(one, "10.1.2.3") || slices.Contains(one, host) {
		t.Errorf("names for 10.1.2.3: %v", one)
	}
}
