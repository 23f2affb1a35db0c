package integration

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"

	"github.com/fleetmcp/fleetmcp/gateway"
)

// Helpers for NATS servers configured the way deploy/nats tells
// operators to: the include fleet-gateway nats-setup writes, and for a
// cluster the node configuration deploy/nats/cluster-node.conf.

// natsSetup writes a nats-setup into dir/setup once and returns its
// directory.
func NATSSetup(t *testing.T, dir string) string {
	t.Helper()
	setup := filepath.Join(dir, "setup")
	if _, err := os.Stat(setup); err == nil {
		return setup
	}
	if _, err := gateway.NATSSetup(setup, 0); err != nil {
		t.Fatal(err)
	}
	return setup
}

// readPub returns the subject of the JWT in file of the setup.
func ReadPub(t *testing.T, setup, file string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(setup, file))
	if err != nil {
		t.Fatal(err)
	}
	c, err := jwt.Decode(strings.TrimSpace(string(data)))
	if err != nil {
		t.Fatal(err)
	}
	return c.Claims().Subject
}

// clusterNodeConf writes the configuration of node name of a cluster into
// dir/name: deploy/nats/cluster-node.conf with this machine's loopback
// ports (clients on client, routes on route, routes to the ports in
// routes), the TLS files of dir/tls and the include of dir/setup. Every
// substitution must find its target, so the test follows the example.
func ClusterNodeConf(t *testing.T, dir, name string, client, route int, routes []int) string {
	t.Helper()
	setup := NATSSetup(t, dir)
	tlsDir := LoopbackTLS(t, dir)
	nodeDir := filepath.Join(dir, name)
	if err := os.MkdirAll(nodeDir, 0o700); err != nil {
		t.Fatal(err)
	}
	include, err := os.ReadFile(filepath.Join(setup, gateway.NATSSetupFiles.ServerConfig))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(nodeDir, gateway.NATSSetupFiles.ServerConfig), include, 0o600); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(ModuleRoot(t), "deploy", "nats", "cluster-node.conf"))
	if err != nil {
		t.Fatal(err)
	}
	text := string(data)
	var list []string
	for _, p := range routes {
		list = append(list, fmt.Sprintf("nats-route://127.0.0.1:%d", p))
	}
	for _, r := range []struct{ re, with string }{
		{`server_name: \$NODE_NAME`, "server_name: " + name},
		{`listen: 0\.0\.0\.0:4222`, fmt.Sprintf("listen: 127.0.0.1:%d", client)},
		{`listen: 0\.0\.0\.0:6222`, fmt.Sprintf("listen: 127.0.0.1:%d", route)},
		{`routes: \[[^\]]*\]`, "routes: [\n    " + strings.Join(list, "\n    ") + "\n  ]"},
		{`/etc/nats/tls/`, tlsDir + "/"},
		{`/var/lib/nats/`, nodeDir + "/"},
		{`include fleet-auth\.conf`, "include " + gateway.NATSSetupFiles.ServerConfig},
	} {
		re := regexp.MustCompile(r.re)
		if !re.MatchString(text) {
			t.Fatalf("deploy/nats/cluster-node.conf has no %s", r.re)
		}
		text = re.ReplaceAllLiteralString(text, r.with)
	}
	conf := filepath.Join(nodeDir, "node.conf")
	if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return conf
}

// testTLS writes a CA and a server certificate for the loopback
// addresses into dir/tls once (ca.pem, server.pem, server-key.pem), and
// returns that directory.
func LoopbackTLS(t *testing.T, dir string) string {
	t.Helper()
	tlsDir := filepath.Join(dir, "tls")
	if _, err := os.Stat(filepath.Join(tlsDir, "ca.pem")); err == nil {
		return tlsDir
	}
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test cluster CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "node"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		DNSNames:    []string{"localhost"}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalECPrivateKey(key)
	if err := os.MkdirAll(tlsDir, 0o700); err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string]*pem.Block{
		"ca.pem": {Type: "CERTIFICATE", Bytes: caDER}, "server.pem": {Type: "CERTIFICATE", Bytes: der},
		"server-key.pem": {Type: "EC PRIVATE KEY", Bytes: keyDER},
	} {
		if err := os.WriteFile(filepath.Join(tlsDir, name), pem.EncodeToMemory(b), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return tlsDir
}

// startNode starts a server from conf in this process and stops it with
// the test.
func StartNode(t *testing.T, conf string) *server.Server {
	t.Helper()
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
	t.Cleanup(func() {
		ns.Shutdown()
		ns.WaitForShutdown()
	})
	if !ns.ReadyForConnections(20 * time.Second) {
		t.Fatalf("server %s not ready", conf)
	}
	return ns
}

// Connections counts ns's clients whose name starts with prefix.
func Connections(ns *server.Server, prefix string) int {
	cz, err := ns.Connz(&server.ConnzOptions{Limit: 10000})
	if err != nil {
		return 0
	}
	n := 0
	for _, c := range cz.Conns {
		if strings.HasPrefix(c.Name, prefix) {
			n++
		}
	}
	return n
}
