package natsauth

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/fleetmcp/fleetmcp/gateway/internal/gwtest"
)

// TestLiveAgentConns: the servers' list of live connections gives every
// connection made with an agent credential, with the host it was issued
// for and its key, across pages; the gateway's own users and a user
// minted with the gateway signing key that names itself after a host are
// not taken for hosts.
func TestLiveAgentConns(t *testing.T) {
	emb, a, _, connect := startTestEmbedded(t)
	a.connzPage = 2
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var want []LiveConn
	for i := range 5 {
		host := fmt.Sprintf("host-%d", i)
		kp, _ := nkeys.CreateUser()
		pub, _ := kp.PublicKey()
		seed, _ := kp.Seed()
		token, err := a.AgentJWT(host, pub, time.Now().Add(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		connect(nats.UserJWTAndSeed(token, string(seed)))
		want = append(want, LiveConn{Host: host, Key: pub})
	}
	// A user minted with the gateway signing key in the data directory,
	// named after a host.
	data, err := os.ReadFile(filepath.Join(emb.cfg.DataDir, natsDir, gatewaySignerKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	signer, err := nkeys.FromSeed(bytes.TrimSpace(data))
	if err != nil {
		t.Fatal(err)
	}
	rogue, _ := nkeys.CreateUser()
	uc := jwt.NewUserClaims(publicKey(rogue))
	uc.Name = "host-1"
	uc.IssuerAccount = a.accountPub
	uc.UserPermissionLimits = jwt.UserPermissionLimits{}
	rogueJWT, err := uc.Encode(signer)
	if err != nil {
		t.Fatal(err)
	}
	rogueSeed, _ := rogue.Seed()
	connect(nats.UserJWTAndSeed(rogueJWT, string(rogueSeed)))

	got, err := a.LiveKeys(ctx, func(LiveConn) bool { return true })
	if err != nil {
		t.Fatal(err)
	}
	for i := range got {
		got[i].Server = ""
	}
	cmp := func(a, b LiveConn) int { return bytes.Compare([]byte(a.Host+a.Key), []byte(b.Host+b.Key)) }
	slices.SortFunc(got, cmp)
	if !slices.Equal(got, want) {
		t.Errorf("live agent connections:\n got %+v\nwant %+v", got, want)
	}
}

// FuzzDecodeConnz: any answer to a connz request either is refused with
// an error or decodes into a list from which only connections whose JWT
// the agent signing key signed, for the fleet account and the connected
// key, are taken.
func FuzzDecodeConnz(f *testing.F) {
	account, _ := nkeys.CreateAccount()
	signer, _ := nkeys.CreateAccount()
	accountPub, _ := account.PublicKey()
	a := &Authority{accountPub: accountPub, agentSigner: signer}
	user, _ := nkeys.CreateUser()
	userPub, _ := user.PublicKey()
	token, err := a.AgentJWT("web-1", userPub, time.Now().Add(time.Hour))
	if err != nil {
		f.Fatal(err)
	}
	f.Add([]byte(fmt.Sprintf(`{"server":{"id":"S1"},"data":{"total":1,"connections":[{"cid":1,"authorized_user":%q,"jwt":%q}]}}`, userPub, token)))
	f.Add([]byte(`{"server":{"id":"S1"},"data":{"connections":[null,{"jwt":"x.y.z"}]}}`))
	f.Add([]byte(`{"error":{"code":500,"description":"no"}}`))
	f.Add([]byte(`{"server":{"id":"S1"}}`))
	f.Add([]byte(`not json`))
	f.Fuzz(func(t *testing.T, data []byte) {
		page, err := decodeConnz(data)
		if err != nil {
			return
		}
		if page.Server == nil || page.Data == nil {
			t.Fatalf("decoded without a server or a list: %s", data)
		}
		for _, c := range a.liveConnsOf(page) {
			uc, err := jwt.DecodeUserClaims(tokenOf(page, c.Key))
			if err != nil || uc.Issuer != publicKey(signer) || uc.IssuerAccount != accountPub || uc.Name != c.Host {
				t.Errorf("took %+v from %s", c, data)
			}
		}
	})
}

// tokenOf returns the JWT page lists for key.
func tokenOf(page *server.ServerAPIConnzResponse, key string) string {
	for _, ci := range page.Data.Conns {
		if ci != nil && ci.AuthorizedUser == key {
			return ci.JWT
		}
	}
	return ""
}

// startTestEmbedded starts an embedded server in a new data directory,
// with the gateway's users connected in process, and returns it, its
// authority, the gateway user's connection and a function that connects
// in process with opts (closed at the test's end).
func startTestEmbedded(t *testing.T) (*Embedded, *Authority, *nats.Conn, func(...nats.Option) *nats.Conn) {
	t.Helper()
	log := slog.New(slog.DiscardHandler)
	emb, err := OpenEmbedded(EmbeddedConfig{DataDir: t.TempDir(), MaxCall: time.Minute, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	if err := emb.Start(nil, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(emb.Shutdown)
	connect := func(opts ...nats.Option) *nats.Conn {
		t.Helper()
		nc, err := nats.Connect("", append(opts, emb.InProcess())...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	gwUser, err := emb.GatewayUser()
	if err != nil {
		t.Fatal(err)
	}
	nc := connect(gwUser)
	sysUser, err := emb.SystemUser()
	if err != nil {
		t.Fatal(err)
	}
	a, err := emb.Authority(connect(sysUser), time.Hour, time.Now, log)
	if err != nil {
		t.Fatal(err)
	}
	return emb, a, nc, connect
}

// waitUntil waits (up to 20 s) until cond holds.
func waitUntil(t *testing.T, what string, cond func() bool) {
	gwtest.WaitUntil(t, 20*time.Second, what, cond)
}
