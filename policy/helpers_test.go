package policy

import "testing"

// testEnv is the host the tests' policies are written for.
func testEnv() Env {
	return Env{Cwd: "/srv/app", Home: "/home/agent", Tools: testTools}
}

func mustParse(t testing.TB, text string) *Policy {
	t.Helper()
	p, err := Parse([]byte(text), testEnv())
	if err != nil {
		t.Fatalf("Parse(%q): %v", text, err)
	}
	return p
}
