package natsauth

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// fakeKeys are revoked keys the test sets.
type fakeKeys struct {
	mu   sync.Mutex
	keys []RevokedKey
}

func (f *fakeKeys) RevokedKeys(context.Context) ([]RevokedKey, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]RevokedKey(nil), f.keys...), nil
}

func (f *fakeKeys) add(pub string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.keys = append(f.keys, RevokedKey{Pub: pub, RevokedAt: time.Now(), Expires: time.Now().Add(time.Hour)})
}

// heldSource is an accountSource whose first signature waits until
// released: its push then lands after another replica's.
type heldSource struct {
	accountSource
	once    sync.Once
	waiting chan struct{}
	release chan struct{}
}

func (h *heldSource) sign(ac *jwt.AccountClaims) (string, error) {
	h.once.Do(func() {
		close(h.waiting)
		<-h.release
	})
	return h.accountSource.sign(ac)
}

// Two replicas revoking at the same moment: replica A reads the records
// and the servers' account, replica B revokes another key and pushes, and
// only then does A's push (without B's key) land. A reads the records
// again after its push and pushes the union: B's revocation is not lost.
func TestReconcileConvergesWhenPushesCross(t *testing.T) {
	dir := t.TempDir()
	setup := filepath.Join(dir, "setup")
	res, err := Setup(setup, 0)
	if err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(setup, "server.conf")
	text := "include " + SetupFiles.ServerConfig + "\nresolver: {type: full, dir: \"" + filepath.Join(dir, "jwt") + "\"}\nport: -1\n"
	if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(conf)
	if err != nil {
		t.Fatal(err)
	}
	opts.NoSigs, opts.NoLog = true, true
	ns, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	ns.Start()
	defer ns.Shutdown()
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("server not ready")
	}
	sys, err := nats.Connect(ns.ClientURL(), nats.UserCredentials(filepath.Join(setup, SetupFiles.SystemCreds)))
	if err != nil {
		t.Fatal(err)
	}
	defer sys.Close()
	signer, err := readSeedFile(filepath.Join(setup, SetupFiles.OperatorSigningKey), nkeys.PrefixByteOperator, "operator signing key")
	if err != nil {
		t.Fatal(err)
	}
	records := &fakeKeys{}
	newAuthority := func(src accountSource) *Authority {
		return &Authority{log: slog.New(slog.DiscardHandler), accountPub: res.Account, ttl: time.Hour, src: src, now: time.Now, sys: sys, records: records}
	}
	ext := &externalAccount{accountPub: res.Account, operatorSigner: signer}
	held := &heldSource{accountSource: ext, waiting: make(chan struct{}), release: make(chan struct{})}
	a, b := newAuthority(held), newAuthority(ext)

	records.add("UKEY0")
	done := make(chan error, 1)
	go func() { done <- a.Reconcile(context.Background()) }()
	<-held.waiting // A has read {UKEY0} and the servers' account, and is about to push
	records.add("UKEY1")
	if err := b.Reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	close(held.release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	ac, err := lookupAccount(context.Background(), sys, res.Account)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"UKEY0", "UKEY1"} {
		if _, ok := ac.Revocations[k]; !ok {
			t.Errorf("the servers' account JWT lacks %s after the crossing pushes: %v", k, ac.Revocations)
		}
	}
}
