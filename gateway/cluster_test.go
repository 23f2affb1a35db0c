package gateway

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fleetmcp/fleetmcp/gateway/natsauth"
	"github.com/fleetmcp/fleetmcp/gateway/signing"
)

func TestClusterConfigValidate(t *testing.T) {
	node := func(mod func(c *Config)) Config {
		c := Config{AuthDisabled: true, DataDir: "/var/lib/fleet", NATSListen: "127.0.0.1:4222", Name: "gw1",
			Cluster: ClusterConfig{Name: "fleet", Listen: "0.0.0.0:6222", Routes: []string{"nats-route://gw1:6222", "gw2:6222", "nats-route://gw3:6222"}}}
		if mod != nil {
			mod(&c)
		}
		return c
	}
	tests := []struct {
		name string
		cfg  Config
		want []string
	}{
		{"a node", node(nil), nil},
		{"operator's route certificates", node(func(c *Config) {
			c.Cluster.RouteCert, c.Cluster.RouteKey, c.Cluster.RouteCA = "r.pem", "r.key", "ca.pem"
		}), nil},
		{"route certificate without its CA", node(func(c *Config) { c.Cluster.RouteCert, c.Cluster.RouteKey = "r.pem", "r.key" }),
			[]string{"--nats_route_cert, --nats_route_key and --nats_route_ca go together"}},
		{"with an external cluster", node(func(c *Config) { c.NATSURLs = []string{"nats://n1:4222"} }), []string{"--nats_cluster", "--nats_url", "one or the other"}},
		{"one route", node(func(c *Config) { c.Cluster.Routes = []string{"gw2:6222"} }), []string{"--nats_routes names 1 route", "at least three nodes"}},
		{"a route with another scheme", node(func(c *Config) { c.Cluster.Routes[1] = "tls://gw2:6222" }), []string{`"tls://gw2:6222" has scheme tls`}},
		{"a route with a user", node(func(c *Config) { c.Cluster.Routes[1] = "nats-route://u:p@gw2:6222" }), []string{"carries a user", "TLS certificates"}},
		{"a route without a port", node(func(c *Config) { c.Cluster.Routes[1] = "nats-route://gw2" }), []string{"needs a host and a port"}},
		{"a route with a path", node(func(c *Config) { c.Cluster.Routes[1] = "nats-route://gw2:6222/x" }), []string{"path or query"}},
		{"no route listener", node(func(c *Config) { c.Cluster.Listen = "" }), []string{"--nats_cluster_listen", "host:port"}},
		{"no agent listener", node(func(c *Config) { c.NATSListen = "" }), []string{"give --nats_listen"}},
		{"a bad cluster name", node(func(c *Config) { c.Cluster.Name = "fleet.one" }), []string{`cluster name "fleet.one"`}},
		{"a bad gateway name", node(func(c *Config) { c.Name = "gw 1" }), []string{`gateway name "gw 1"`, "--name"}},
		{"a gateway name with a dot", node(func(c *Config) { c.Name = "gw.1" }), []string{`gateway name "gw.1"`}},
		{"routes without a cluster", Config{AuthDisabled: true, DataDir: "/d", Cluster: ClusterConfig{Routes: []string{"a:1", "b:2"}}}, []string{"give --nats_cluster NAME too"}},
		{"a name without a cluster", Config{AuthDisabled: true, DataDir: "/d", Name: "gw1"}, nil},
		{"wait too short", node(func(c *Config) { c.Cluster.Wait = time.Millisecond }), []string{"cluster wait 1ms"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.cfg
			c.setDefaults()
			err := c.validate()
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("validate = %v, want it accepted", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("validate accepted the config, want an error mentioning %q", tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

// A cluster node's defaults: a name from the hostname, replicas 3.
func TestClusterDefaults(t *testing.T) {
	c := Config{Cluster: ClusterConfig{Name: "fleet"}}
	c.setDefaults()
	if c.Name == "" || !nameRE.MatchString(c.Name) || c.Cluster.Wait != 2*time.Minute {
		t.Errorf("defaults: name %q, wait %s", c.Name, c.Cluster.Wait)
	}
	if replicasDefault(0, true) != 3 || replicasDefault(0, false) != 1 || replicasDefault(5, true) != 5 {
		t.Error("replicasDefault: 3 on a cluster, 1 alone, a setting as it is")
	}
}

// A replica's seed holds the fleet's keys and nothing else, with the
// secrets private; it refuses a directory that is not a gateway's and a
// target that is not empty.
func TestSeedReplica(t *testing.T) {
	from := t.TempDir()
	if _, err := natsauth.OpenEmbedded(natsauth.EmbeddedConfig{DataDir: from, Log: slog.New(slog.DiscardHandler)}); err != nil {
		t.Fatal(err)
	}
	if _, err := natsauth.LoadOrCreateCA(from); err != nil {
		t.Fatal(err)
	}
	if _, err := signing.Open(filepath.Join(from, signing.Dir, signing.KeyFile), true); err != nil {
		t.Fatal(err)
	}
	// A rotation under way travels with the seed: the replica signs
	// with the same keys and serves the same key sets.
	if _, err := signing.Rotate(filepath.Join(from, signing.Dir, signing.KeyFile), time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := checkDataFormat(from); err != nil {
		t.Fatal(err)
	}
	// What must not travel: the store and the lock.
	for _, f := range []string{"jetstream/x", dataLockFile} {
		p := filepath.Join(from, f)
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	to := filepath.Join(t.TempDir(), "gw2")
	files, err := SeedReplica(from, to)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{filepath.Join(signing.Dir, signing.KeyFile), filepath.Join(signing.Dir, signing.RetiringKeyFile),
		filepath.Join(signing.Dir, signing.KeySetsFile), filepath.Join(natsauth.TLSDir, natsauth.CAKeyFile), filepath.Join(natsauth.KeysDir, "agent-signer.nk")} {
		if !slices.Contains(files, want) {
			t.Errorf("seeded %v, not %s", files, want)
		}
	}
	for _, f := range files {
		a, _ := os.ReadFile(filepath.Join(from, f))
		b, err := os.ReadFile(filepath.Join(to, f))
		if err != nil || !bytes.Equal(a, b) {
			t.Errorf("%s: not copied as it is (%v)", f, err)
		}
		fi, _ := os.Stat(filepath.Join(to, f))
		public := f == filepath.Join(natsauth.TLSDir, natsauth.CACertFile) || f == filepath.Join(signing.Dir, signing.KeySetsFile) ||
			f == filepath.Join(natsauth.KeysDir, "account.pub") || f == filepath.Join(natsauth.KeysDir, "system.pub")
		if !public && fi.Mode().Perm() != 0o600 {
			t.Errorf("%s has mode %v", f, fi.Mode().Perm())
		}
	}
	for _, f := range []string{"jetstream", dataLockFile} {
		if _, err := os.Stat(filepath.Join(to, f)); err == nil {
			t.Errorf("%s was seeded", f)
		}
	}
	if fi, _ := os.Stat(to); fi.Mode().Perm() != 0o700 {
		t.Errorf("the seed directory has mode %v", fi.Mode().Perm())
	}
	// The seed's keys are the fleet's.
	if _, err := natsauth.OpenEmbedded(natsauth.EmbeddedConfig{DataDir: to, Log: slog.New(slog.DiscardHandler)}); err != nil {
		t.Fatal(err)
	}
	keyFiles := append(natsauth.KeyFiles(""), filepath.Join(natsauth.KeysDir, "account.pub"), filepath.Join(natsauth.KeysDir, "system.pub"))
	for _, f := range keyFiles {
		a, _ := os.ReadFile(filepath.Join(from, f))
		b, err := os.ReadFile(filepath.Join(to, f))
		if err != nil || len(a) == 0 || !bytes.Equal(a, b) {
			t.Errorf("the seed's NATS key %s is not the first gateway's (%v)", f, err)
		}
	}
	if _, err := SeedReplica(from, to); err == nil || !strings.Contains(err.Error(), "not empty") {
		t.Errorf("a second seed into the same directory: %v", err)
	}
	if _, err := SeedReplica(t.TempDir(), filepath.Join(t.TempDir(), "x")); err == nil || !strings.Contains(err.Error(), "start that gateway once first") {
		t.Errorf("a seed from an empty directory: %v", err)
	}
}
