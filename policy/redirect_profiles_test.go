package policy

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestDeployProfilesRedirects: every restricted example policy refuses
// network redirections and input redirections from the files it keeps
// from the read tool, and still allows the harmless ones.
func TestDeployProfilesRedirects(t *testing.T) {
	for _, pr := range []struct {
		file, cwd     string
		runs, refuses []string
	}{
		{file: "read-only.yaml", runs: []string{"wc -l < /etc/hosts", "grep x < /srv/app/main.go 2>/dev/null"},
			refuses: []string{"cat < /dev/tcp/example.com/80", "cat < /etc/shadow", "grep x < /srv/app/.env", "cat < ~/.ssh/id_rsa",
				"h=example.com; cat < /dev/tcp/$h/80", "cat < \"$F\"", "sort < /srv/app/tls/server.key"}},
		{file: "workspace.yaml", cwd: "/srv/app", runs: []string{"go test ./... < /dev/null", "grep -c x < main.go"},
			refuses: []string{"go test < /dev/tcp/10.0.0.1/22", "cat < ../other/x", "cat < .env", "echo x > /dev/udp/10.0.0.1/53",
				"cat < /etc/passwd"}},
		{file: "ci-runner.yaml", cwd: "/srv/ci/checkout", runs: []string{"make test < /dev/null > /srv/ci/logs/t.log 2>&1"},
			refuses: []string{"make test < /dev/tcp/10.0.0.1/80", "make test < /srv/ci/checkout/.env"}},
		{file: "diagnostics.yaml", runs: []string{"grep -c processor < /proc/cpuinfo"},
			refuses: []string{"cat < /dev/tcp/10.0.0.1/22", "cat < /etc/shadow", "grep x < /root/.bash_history"}},
	} {
		t.Run(pr.file, func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join("../deploy/policies", pr.file))
			if err != nil {
				t.Fatal(err)
			}
			env := testEnv()
			if pr.cwd != "" {
				env.Cwd = pr.cwd
			}
			p, err := Parse(data, env)
			if err != nil {
				t.Fatal(err)
			}
			for _, line := range pr.runs {
				if err := p.CheckCommand(line, nil); err != nil {
					t.Errorf("refuses %q: %v", line, err)
				}
			}
			for _, line := range pr.refuses {
				if err := p.CheckCommand(line, nil); err == nil || !strings.Contains(err.Error(), "redirection") {
					t.Errorf("%q: %v, want a refusal of its redirection", line, err)
				}
			}
		})
	}
}
