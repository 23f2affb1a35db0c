//go:build unix

package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fleetmcp/fleetmcp/gateway/access"
)

// fleet-gateway --new_api_token NAME --admin prints the tokens file's
// entry and the fleetctl login command for the gateway (its address and
// CA pin filled in); once the entry is loaded, that command, run as
// printed with the token on stdin, saves a profile fleetctl then works
// with alone.
func TestAdminTokenLoginAsPrinted(t *testing.T) {
	boot, bootLine, err := access.NewAPIToken("boot")
	if err != nil {
		t.Fatal(err)
	}
	tokensFile := filepath.Join(t.TempDir(), "api-tokens.yaml")
	writeFile(t, tokensFile, "tokens:\n  "+bootLine+"\n")
	gw := launchGatewayProcess(t, boot, "--api_tokens", tokensFile)

	cmd := exec.Command(gatewayBinary(t), "--new_api_token", "ops", "--admin", "--data_dir", gw.DataDir, "--api_listen", gw.APIAddr)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("--new_api_token --admin: %v\n%s", err, out)
	}
	m := regexp.MustCompile(`(?m)^\s+(fmcp_\S+)$[\s\S]*^\s+(- \{name: "ops".*admin: true\})$[\s\S]*^\s+(fleetctl login .*)$`).FindStringSubmatch(string(out))
	if m == nil {
		t.Fatalf("--new_api_token --admin printed no token, admin entry and login command:\n%s", out)
	}
	if !strings.Contains(m[3], "--gateway https://"+gw.APIAddr+" ") || !strings.Contains(m[3], "--ca_pin "+gatewayCAPin(t, gw)+" ") || strings.Contains(m[3], m[1]) {
		t.Fatalf("login command %q: want the fleet API's address and CA pin, and no token", m[3])
	}
	writeFile(t, tokensFile, "tokens:\n  "+bootLine+"\n  "+m[2]+"\n")
	if err := gw.Cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}

	profilePath := filepath.Join(t.TempDir(), "fleetctl.json")
	fields := strings.Fields(m[3])
	var login []byte
	waitFor(t, 30*time.Second, "fleetctl login as printed", func() bool {
		c := exec.Command(fleetctlBinary(t), fields[1:]...)
		c.Env, c.Stdin = cleanEnv(profilePath), strings.NewReader(m[1]+"\n")
		login, err = c.CombinedOutput()
		return err == nil
	})
	if fi, err := os.Stat(profilePath); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("profile after login: %v %v\n%s", fi, err, login)
	}
	c := exec.Command(fleetctlBinary(t), "token", "list")
	c.Env = cleanEnv(profilePath)
	if b, err := c.CombinedOutput(); err != nil {
		t.Fatalf("fleetctl with the saved profile alone: %v\n%s", err, b)
	}
}
