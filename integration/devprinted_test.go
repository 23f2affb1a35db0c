package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
)

// devGateway is a fleet-gateway --dev process and what it printed.
type devGateway struct {
	cmd  *exec.Cmd
	out  *syncBuffer
	done chan struct{}
}

// cleanEnv is this process's environment without FLEET_* variables, and
// with FLEET_PROFILE set to profilePath.
func cleanEnv(profilePath string, more ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "FLEET_") {
			env = append(env, kv)
		}
	}
	return append(append(env, "FLEET_PROFILE="+profilePath), more...)
}

// startDevGateway runs fleet-gateway with args and waits for its whole
// banner.
func startDevGateway(t *testing.T, env []string, args ...string) *devGateway {
	t.Helper()
	g := &devGateway{out: &syncBuffer{}, done: make(chan struct{})}
	g.cmd = exec.Command(gatewayBinary(t), args...)
	g.cmd.Env, g.cmd.Stdout, g.cmd.Stderr = env, g.out, testWriter{t}
	if err := g.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = g.cmd.Wait(); close(g.done) }()
	t.Cleanup(g.stop)
	waitFor(t, 60*time.Second, "the --dev banner", func() bool {
		return strings.Contains(g.out.String(), "fleetctl token create prints the command that joins a host.")
	})
	return g
}

func (g *devGateway) stop() {
	_ = g.cmd.Process.Signal(os.Interrupt)
	select {
	case <-g.done:
	case <-time.After(20 * time.Second):
		_ = g.cmd.Process.Kill()
		<-g.done
	}
}

// What fleet-gateway --dev and fleetctl print works as printed, with the
// real binaries: the banner's export line and the profile it saves reach
// the gateway with fleetctl; the join command fleetctl token create
// prints joins a host with the token pasted on stdin; the dev host has
// its OS and architecture; and the banner's join token, unused, is
// revoked when the gateway stops.
func TestDevPrintedCommandsWork(t *testing.T) {
	dir := t.TempDir()
	profilePath := filepath.Join(dir, "config", "fleetctl.json")
	args := []string{"--dev", "--dev_join_token", "--listen", fmt.Sprintf("127.0.0.1:%d", freePort(t)),
		"--nats_listen", fmt.Sprintf("127.0.0.1:%d", freePort(t)), "--api_listen", fmt.Sprintf("127.0.0.1:%d", freePort(t)),
		"--data_dir", filepath.Join(dir, "data"), "--agent_name", "dev-1", "--log_level", "warn"}
	gw := startDevGateway(t, cleanEnv(profilePath), args...)
	out := gw.out.String()

	fleetctl := func(env []string, args ...string) string {
		t.Helper()
		cmd := exec.Command(fleetctlBinary(t), args...)
		cmd.Env = env
		b, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("fleetctl %s: %v\n%s", strings.Join(args, " "), err, b)
		}
		return string(b)
	}
	export := regexp.MustCompile(`(?m)^  export (FLEET_GATEWAY=\S+) (FLEET_CA_PIN=\S+)$`).FindStringSubmatch(out)
	if export == nil {
		t.Fatalf("no export line in the banner:\n%s", out)
	}
	fleetctl(cleanEnv(filepath.Join(dir, "no-profile.json"), export[1], export[2]), "token", "list")
	list := fleetctl(cleanEnv(profilePath), "agent", "list")
	if !regexp.MustCompile(`(?m)^dev-1 +online +dev=true +` + runtime.GOOS + "/" + runtime.GOARCH + " ").MatchString(list) {
		t.Errorf("agent list does not show dev-1 online with its OS/arch:\n%s", list)
	}
	bannerToken := regexp.MustCompile(`token: +(fmcp1\.([a-z2-7]{10})\.\S+)`).FindStringSubmatch(out)
	if bannerToken == nil || !strings.Contains(out, "command: fleet-agent join ") {
		t.Fatalf("no join token and command in the banner:\n%s", out)
	}

	created := fleetctl(cleanEnv(profilePath), "token", "create", "--name", "joined-1")
	join := regexp.MustCompile(`(?m)^ +(fleet-agent join .*)$`).FindStringSubmatch(created)
	tok := regexp.MustCompile(`fmcp1\.[a-z2-7]{10}\.\S+`).FindString(created)
	if join == nil || tok == "" || strings.Contains(join[1], tok) {
		t.Fatalf("fleetctl token create printed no join command without the token:\n%s", created)
	}
	fields := strings.Fields(join[1])
	agent := exec.Command(agentBinary(t), append(fields[1:], "--state_dir", filepath.Join(dir, "agent"), "--cwd", dir, "--log_level", "warn")...)
	agent.Env, agent.Stdin, agent.Stderr = cleanEnv(profilePath), strings.NewReader(tok+"\n"), testWriter{t}
	if err := agent.Start(); err != nil {
		t.Fatal(err)
	}
	agentDone := make(chan struct{})
	go func() { _ = agent.Wait(); close(agentDone) }()
	defer func() {
		_ = agent.Process.Signal(os.Interrupt)
		select {
		case <-agentDone:
		case <-time.After(20 * time.Second):
			_ = agent.Process.Kill()
			<-agentDone
		}
	}()
	waitFor(t, 60*time.Second, "joined-1 online", func() bool {
		cmd := exec.Command(fleetctlBinary(t), "agent", "list")
		cmd.Env = cleanEnv(profilePath)
		b, _ := cmd.Output()
		return regexp.MustCompile(`(?m)^joined-1 +online `).Match(b)
	})
	_ = agent.Process.Signal(os.Interrupt)
	<-agentDone

	// The banner's token, never used, dies with the gateway.
	gw.stop()
	restart := slices.DeleteFunc(slices.Clone(args), func(a string) bool { return a == "--dev_join_token" })
	gw = startDevGateway(t, cleanEnv(profilePath), restart...)
	if strings.Contains(gw.out.String(), "token:") {
		t.Errorf("without --dev_join_token the banner shows a token:\n%s", gw.out.String())
	}
	tokens := fleetctl(cleanEnv(profilePath), "token", "list")
	if !regexp.MustCompile(`(?m)^` + bannerToken[2] + ` +revoked `).MatchString(tokens) {
		t.Errorf("the banner's token %s is not revoked after the gateway stopped:\n%s", bannerToken[2], tokens)
	}
}
