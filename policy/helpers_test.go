package policy

import "testing"

// testEnv is the host the tests' policies are written for: an agent that
// runs git through its git guard.
func testEnv() Env {
	return Env{Cwd: "/srv/app", Home: "/home/agent", Tools: testTools, GitGuarded: true}
}

func mustParse(t testing.TB, text string) *Policy {
	t.Helper()
	return mustParseEnv(t, text, testEnv())
}

func mustParseEnv(t testing.TB, text string, env Env) *Policy {
	t.Helper()
	p, err := Parse([]byte(text), env)
	if err != nil {
		t.Fatalf("Parse(%q): %v", text, err)
	}
	return p
}
