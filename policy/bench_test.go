package policy

import "testing"

// benchPolicy is a workspace-like policy with allow and deny rules.
const benchPolicy = `
bash:
  allow: ["ls *", "cat *", "grep *", "git *", "go *", "make *", "echo *", "tail *", "head *", "wc *", "find *", "sudo *", "timeout *",
          "flock *", "ssh *"]
  deny: ["git push *", "git -c *", "find *-delete*", "find *-exec*"]
paths:
  allow: ["/srv/app/**"]
  deny: ["**/.env", "*.pem", "**/.ssh/**"]
`

// BenchmarkCheckCommand measures the command check on typical lines.
func BenchmarkCheckCommand(b *testing.B) {
	p := mustParse(b, benchPolicy)
	for _, bc := range []struct{ name, line string }{
		{"simple", "git status"},
		{"pipeline", "go test ./... 2>&1 | tail -n 50"},
		{"list", "make build && ls -la bin/ && git diff --stat HEAD~1 | head -20 > /srv/app/diff.txt"},
		{"loop", `for f in $(ls *.go); do grep -n "TODO" "$f" | wc -l; done`},
		{"wrapped", "sudo timeout 30 git fetch origin && git log --oneline -10"},
		{"refused", "echo $(rm -rf /)"},
		{"arith", `for f in *.go; do echo "$f" $(( 1 + 2 )) ${a[0]}; done`},
		{"launcher", "timeout 60 flock /tmp/build.lock ssh build-host 'make -C /srv/app test | tail -n 20'"},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_ = p.CheckCommand(bc.line, nil)
			}
		})
	}
	// With sh as the agent's shell a line is parsed and checked twice.
	env := testEnv()
	env.Shell = "/bin/sh"
	sh := mustParseEnv(b, benchPolicy, env)
	b.Run("sh-list", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = sh.CheckCommand("make build && ls -la bin/ && git diff --stat HEAD~1 | head -20 > /srv/app/diff.txt", nil)
		}
	})
}

// BenchmarkCheckPath measures a path check against allow and deny rules.
func BenchmarkCheckPath(b *testing.B) {
	p := mustParse(b, benchPolicy)
	b.ReportAllocs()
	for b.Loop() {
		_ = p.CheckPath(Read, "/srv/app/internal/server/handler.go", "/srv/app/internal/server/handler.go")
	}
}
