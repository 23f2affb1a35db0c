package integration

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/fleetmcp/fleetmcp/agent"
)

// The files under deploy/ that install and run the binaries (units,
// packages, containers) are checked against the binaries and the tree:
// no container engine or systemd runs here, so what they would refuse is
// found by reading the files the way they do.

// unitSettings reads a systemd unit's Key=value lines (continuations
// joined), every value of a repeated key in order.
func unitSettings(t *testing.T, path string) map[string][]string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	text := strings.ReplaceAll(string(data), "\\\n", " ")
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' || line[0] == ';' || line[0] == '[' {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			t.Fatalf("%s: line %q is not Key=value", path, line)
		}
		out[k] = append(out[k], v)
	}
	return out
}

// envValue is the value of name in an EnvironmentFile; with commented,
// also of its first commented-out example ("#NAME=...").
func envValue(t *testing.T, path, name string, commented bool) (string, bool) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if commented {
			line = strings.TrimPrefix(line, "#")
		}
		if v, ok := strings.CutPrefix(line, name+"="); ok {
			return v, true
		}
	}
	return "", false
}

// flagsParse runs bin with args and --version: it exits 0 only when every
// flag in args is one the binary has and its value parses.
func flagsParse(t *testing.T, bin string, args []string) {
	t.Helper()
	out, err := exec.Command(bin, append(slices.Clone(args), "--version")...).CombinedOutput()
	if err != nil {
		// The last line says what was wrong; the usage before it, not.
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		t.Errorf("%s %s: %v: %s", filepath.Base(bin), strings.Join(args, " "), err, lines[len(lines)-1])
	}
}

// TestSystemdUnits: each unit runs the packaged binary as its sysusers.d
// user with flags the binary has, keeps its state in its
// StateDirectory=, names no host or labels (those come from enrolment),
// and the gateway's is sandboxed.
func TestSystemdUnits(t *testing.T) {
	for _, u := range []struct {
		name, bin, user, stateFlag, flagsVar, env string
		commentedFlags                            bool
	}{
		{"fleet-gateway", gatewayBinary(t), "fleetmcp", "--data_dir", "FLEET_GATEWAY_FLAGS", "../deploy/gateway/gateway.env", true},
		{"fleet-agent", agentBinary(t), "fleetmcp-agent", "--state_dir", "FLEET_AGENT_FLAGS", "../deploy/systemd/fleet-agent.env", false},
	} {
		t.Run(u.name, func(t *testing.T) {
			s := unitSettings(t, "../deploy/systemd/"+u.name+".service")
			if got := s["User"]; len(got) != 1 || got[0] != u.user {
				t.Errorf("User=%v, want %s", got, u.user)
			}
			sysusers, _ := os.ReadFile("../deploy/systemd/" + u.name + ".sysusers")
			if !regexp.MustCompile(`(?m)^u ` + regexp.QuoteMeta(u.user) + ` `).Match(sysusers) {
				t.Errorf("%s.sysusers does not create user %s", u.name, u.user)
			}
			exec := strings.Fields(strings.Join(s["ExecStart"], " "))
			if len(exec) < 3 || exec[0] != "/usr/bin/"+u.name {
				t.Fatalf("ExecStart=%v, want /usr/bin/%s ...", exec, u.name)
			}
			i := slices.Index(exec, u.stateFlag)
			state := strings.Fields(s["StateDirectory"][0])[0]
			if i < 0 || i+1 >= len(exec) || exec[i+1] != "/var/lib/"+state {
				t.Errorf("ExecStart=%v: want %s /var/lib/%s (StateDirectory=%s)", exec, u.stateFlag, state, state)
			}
			if !slices.Contains(s["EnvironmentFile"], "/etc/fleetmcp/"+strings.TrimPrefix(u.name, "fleet-")+".env") {
				t.Errorf("EnvironmentFile=%v", s["EnvironmentFile"])
			}
			if len(s["Environment"]) == 0 || !strings.HasPrefix(s["Environment"][0], "HOME=/var/lib/") {
				t.Errorf("Environment=%v, want HOME set", s["Environment"])
			}
			if r := s["Restart"]; len(r) != 1 || r[0] != "always" {
				t.Errorf("Restart=%v", r)
			}
			if u.name == "fleet-agent" {
				// A revoked agent exits with agent.ExitRevoked, for good.
				if r := s["RestartPreventExitStatus"]; len(r) != 1 || r[0] != strconv.Itoa(agent.ExitRevoked) {
					t.Errorf("RestartPreventExitStatus=%v, want %d", r, agent.ExitRevoked)
				}
			}
			// The flags of the unit and of its environment file's example.
			flags, ok := envValue(t, u.env, u.flagsVar, u.commentedFlags)
			if !ok {
				t.Fatalf("%s has no %s", u.env, u.flagsVar)
			}
			args := slices.DeleteFunc(slices.Clone(exec[1:]), func(a string) bool { return a == "$"+u.flagsVar })
			if len(args) == len(exec)-1 {
				t.Errorf("ExecStart does not pass $%s", u.flagsVar)
			}
			args = append(args, strings.Fields(flags)...)
			for _, a := range args {
				if a == "--name" || strings.HasPrefix(a, "--name=") || strings.HasPrefix(a, "--label") {
					t.Errorf("the unit or %s names the host or labels (%s): they come from enrolment", u.env, a)
				}
			}
			flagsParse(t, u.bin, args)
		})
	}
	s := unitSettings(t, "../deploy/systemd/fleet-gateway.service")
	for k, want := range map[string]string{
		"NoNewPrivileges": "yes", "ProtectSystem": "strict", "PrivateTmp": "yes", "CapabilityBoundingSet": "",
		"RestrictAddressFamilies": "AF_INET AF_INET6 AF_UNIX", "SystemCallArchitectures": "native", "ProtectHome": "yes",
	} {
		if got := s[k]; len(got) != 1 || got[0] != want {
			t.Errorf("fleet-gateway.service %s=%q, want %q", k, got, want)
		}
	}
	if f := s["SystemCallFilter"]; len(f) == 0 || f[0] != "@system-service" {
		t.Errorf("fleet-gateway.service SystemCallFilter=%q", f)
	}
	agent := unitSettings(t, "../deploy/systemd/fleet-agent.service")
	if c := agent["ConditionPathExists"]; len(c) != 1 || c[0] != "/var/lib/fleetmcp-agent/identity/enrolment.json" {
		t.Errorf("fleet-agent.service starts before the host is enrolled: ConditionPathExists=%v", c)
	}
	drop := unitSettings(t, "../deploy/systemd/fleet-agent.service.d/locked-down.conf")
	if drop["ProtectSystem"] == nil || drop["NoNewPrivileges"] == nil || drop["SystemCallFilter"] == nil {
		t.Error("the locked-down drop-in lacks ProtectSystem, NoNewPrivileges or SystemCallFilter")
	}
}

// TestPackageConfigs: every file an nfpm configuration packages exists
// (globs match), the configuration files are marked as such, and the
// maintainer scripts it names are there.
func TestPackageConfigs(t *testing.T) {
	configs, _ := filepath.Glob("../deploy/release/nfpm-*.yaml")
	if len(configs) < 3 {
		t.Fatalf("nfpm configurations: %v", configs)
	}
	for _, c := range configs {
		data, err := os.ReadFile(c)
		if err != nil {
			t.Fatal(err)
		}
		var cfg struct {
			Name     string `yaml:"name"`
			Contents []struct {
				Src, Dst, Type string
			} `yaml:"contents"`
			Scripts map[string]string `yaml:"scripts"`
		}
		// The placeholders release.sh fills in are not YAML's business.
		if err := yaml.Unmarshal(data, &cfg); err != nil {
			t.Fatalf("%s: %v", c, err)
		}
		binaries := 0
		for _, e := range cfg.Contents {
			switch {
			case e.Src == "@BINARY@":
				binaries++
				if e.Dst != "/usr/bin/"+cfg.Name {
					t.Errorf("%s: the binary goes to %s", c, e.Dst)
				}
				continue
			case strings.HasPrefix(e.Dst, "/etc/") && e.Type != "config|noreplace":
				t.Errorf("%s: %s is not config|noreplace: an upgrade would replace the operator's", c, e.Dst)
			}
			matches, _ := filepath.Glob(filepath.Join("..", e.Src))
			if len(matches) == 0 {
				t.Errorf("%s: %s does not exist", c, e.Src)
			}
		}
		if binaries != 1 {
			t.Errorf("%s packages %d binaries", c, binaries)
		}
		for _, s := range cfg.Scripts {
			if fi, err := os.Stat(filepath.Join("..", s)); err != nil || fi.Mode()&0o111 == 0 {
				t.Errorf("%s: script %s: missing or not executable (%v)", c, s, err)
			}
		}
	}
}

// TestContainerFiles: the Dockerfiles pin their base images, run as a
// user other than root, copy files that exist and stamp the version
// where --version reads it; compose.yaml parses, runs the cluster node
// configuration of deploy/nats with the nats-server release of go.mod,
// and gives the gateways flags they have.
func TestContainerFiles(t *testing.T) {
	for _, name := range []string{"gateway", "agent"} {
		path := "../deploy/container/Dockerfile." + name
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		text := strings.ReplaceAll(string(data), "\\\n", " ")
		var user string
		for _, line := range strings.Split(text, "\n") {
			f := strings.Fields(line)
			if len(f) < 2 || strings.HasPrefix(f[0], "#") {
				continue
			}
			switch strings.ToUpper(f[0]) {
			case "FROM":
				img := strings.ReplaceAll(f[1], "${GO_VERSION}", "1")
				if !strings.Contains(img, ":") || strings.HasSuffix(img, ":latest") {
					t.Errorf("%s: FROM %s is not pinned to a tag", path, f[1])
				}
				user = ""
			case "USER":
				user = f[1]
			case "COPY":
				var src []string
				from := false
				for _, a := range f[1 : len(f)-1] {
					if strings.HasPrefix(a, "--from=") {
						from = true
					}
					if !strings.HasPrefix(a, "--") {
						src = append(src, a)
					}
				}
				for _, s := range src {
					if _, err := os.Stat(filepath.Join("..", s)); !from && err != nil {
						t.Errorf("%s: COPY %s: %v", path, s, err)
					}
				}
			}
		}
		if user == "" || user == "root" || strings.HasPrefix(user, "0") {
			t.Errorf("%s: the image runs as %q, want a non-root user", path, user)
		}
		for _, v := range []string{"version", "commit", "date"} {
			if !strings.Contains(text, "-X github.com/fleetmcp/fleetmcp/cmd/internal/version."+v+"=") {
				t.Errorf("%s does not stamp version.%s", path, v)
			}
		}
		if !strings.Contains(text, "./cmd/fleet-"+name) {
			t.Errorf("%s does not build ./cmd/fleet-%s", path, name)
		}
	}

	data, err := os.ReadFile("../deploy/container/compose.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var compose struct {
		Services map[string]struct {
			Image       string            `yaml:"image"`
			Command     []string          `yaml:"command"`
			Environment map[string]string `yaml:"environment"`
			Volumes     []string          `yaml:"volumes"`
			Build       *struct{ Context, Dockerfile string }
		} `yaml:"services"`
	}
	if err := yaml.Unmarshal(data, &compose); err != nil {
		t.Fatalf("compose.yaml: %v", err)
	}
	gomod, _ := os.ReadFile("../go.mod")
	natsVersion := regexp.MustCompile(`github.com/nats-io/nats-server/v2 v(\S+)`).FindSubmatch(gomod)
	node, _ := os.ReadFile("../deploy/nats/cluster-node.conf")
	gitignore, _ := os.ReadFile("../deploy/container/.gitignore")
	for _, n := range []string{"n1", "n2", "n3"} {
		s, ok := compose.Services[n]
		if !ok {
			t.Fatalf("compose.yaml has no NATS node %s", n)
		}
		if natsVersion == nil || s.Image != "nats:"+string(natsVersion[1]) {
			t.Errorf("%s: image %s, want the nats-server of go.mod (%s)", n, s.Image, natsVersion)
		}
		if s.Environment["NODE_NAME"] != n || !strings.Contains(string(node), "nats-route://"+n+":6222") {
			t.Errorf("%s: NODE_NAME %q, or cluster-node.conf has no route to it", n, s.Environment["NODE_NAME"])
		}
		if !slices.Contains(s.Volumes, "../nats/cluster-node.conf:/etc/nats/node.conf:ro") {
			t.Errorf("%s does not run deploy/nats/cluster-node.conf: %v", n, s.Volumes)
		}
	}
	gw := gatewayBinary(t)
	for _, n := range []string{"gateway-a", "gateway-b"} {
		s, ok := compose.Services[n]
		if !ok {
			t.Fatalf("compose.yaml has no gateway replica %s", n)
		}
		if s.Build == nil || s.Build.Dockerfile != "deploy/container/Dockerfile.gateway" {
			t.Errorf("%s: build %+v", n, s.Build)
		} else if _, err := os.Stat(filepath.Join("../deploy/container", s.Build.Context, s.Build.Dockerfile)); err != nil {
			t.Errorf("%s: %v", n, err)
		}
		for _, v := range s.Volumes {
			src, _, _ := strings.Cut(v, ":")
			if !strings.HasPrefix(src, ".") {
				continue // a named volume
			}
			// Made per deployment (and kept out of git), or in the tree.
			top := "/" + strings.Split(strings.TrimPrefix(src, "./"), "/")[0]
			if !strings.Contains(string(gitignore), top) {
				if _, err := os.Stat(filepath.Join("../deploy/container", src)); err != nil {
					t.Errorf("%s mounts %s: neither in the tree nor made per deployment (.gitignore)", n, src)
				}
			}
		}
		args := slices.Clone(s.Command)
		for i, a := range args {
			args[i] = regexp.MustCompile(`\$\{[A-Z_]+(:\?[^}]*)?\}`).ReplaceAllString(a, "fleet.example.com")
		}
		flagsParse(t, gw, append([]string{"--data_dir", "/var/lib/fleetmcp"}, args...))
	}
}
