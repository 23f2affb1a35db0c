package policy

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// FoldName puts names a case- and normalization-insensitive file system
// (APFS) takes for the same in one form, and keeps apart those it does
// not.
func TestFoldName(t *testing.T) {
	same := [][]string{
		{".ssh", ".SSH", ".Ssh", ".\u017Fsh", ".s\u017Fh"},                  // a long s
		{".kube", ".KUBE", ".\u212Aube"},                                    // the Kelvin sign
		{"café", "cafe\u0301", "CAFÉ", "CAFE\u0301"},                        // composed and decomposed
		{"Å", "A\u030A", "\u212B", "å", "a\u030a"},                          // the angstrom sign
		{"Ω", "\u2126", "ω"},                                                // the ohm sign
		{"straße", "STRASSE", "strasse", "STRAẞE"},                          // full case folding
		{"ﬁle", "file", "FILE"},                                             // a ligature
		{"ṩ", "s\u0323\u0307", "s\u0307\u0323", "S\u0323\u0307", "ṡ\u0323"}, // marks in canonical order
		{"한", "\u1112\u1161\u11AB"},                                         // Hangul syllable and jamo
		{"a;b", "a\u037Eb"},                                                 // the Greek question mark
		{"Σίσυφος", "ΣΊΣΥΦΟΣ", "σίσυφος"},
	}
	for _, group := range same {
		want := FoldName(group[0])
		for _, s := range group[1:] {
			if got := FoldName(s); got != want {
				t.Errorf("FoldName(%+q) = %+q, FoldName(%+q) = %+q: want the same", s, got, group[0], want)
			}
		}
	}
	for _, pair := range [][2]string{{"cafe", "café"}, {".ssh", ".sshx"}, {"e\u0301", "e\u0300"}, {"i", "ı"}, {"/a/b", "/a/c"}} {
		if FoldName(pair[0]) == FoldName(pair[1]) {
			t.Errorf("FoldName(%+q) = FoldName(%+q) = %+q: want them apart", pair[0], pair[1], FoldName(pair[0]))
		}
	}
	// Glob syntax and separators come through as they are.
	if got := FoldName("**/.SSH/*.[Pp]em{,x}"); got != "**/.SSH/*.[PP]EM{,X}" {
		t.Errorf("FoldName of a pattern = %q", got)
	}
	if got := FoldName("a\xffb"); !strings.Contains(got, "\xff") {
		t.Errorf("FoldName keeps invalid UTF-8 as it is: %q", got)
	}
}

// FuzzFoldName: folding is idempotent, keeps valid UTF-8 valid, and makes
// a name's upper and lower case the same.
func FuzzFoldName(f *testing.F) {
	for _, s := range []string{".ssh", "café", "cafe\u0301", "ß", "\u212A", "한국어", "ǅ", "ΐ", "\u0345", "a\u0301\u0323"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		k := FoldName(s)
		if again := FoldName(k); again != k {
			t.Fatalf("FoldName(%+q) = %+q, but FoldName of that is %+q", s, k, again)
		}
		if utf8.ValidString(s) && !utf8.ValidString(k) {
			t.Fatalf("FoldName(%+q) = %+q is not valid UTF-8", s, k)
		}
		if utf8.ValidString(s) && FoldName(strings.ToUpper(s)) != FoldName(strings.ToLower(s)) && !strings.ContainsRune(s, 'İ') && !strings.ContainsRune(s, 'ı') {
			t.Fatalf("%+q: upper and lower case fold apart: %+q, %+q", s, FoldName(strings.ToUpper(s)), FoldName(strings.ToLower(s)))
		}
	})
}

// With Env.FoldCase the path rules of the file tools compare names as
// the file system does.
func TestCheckPathFoldCase(t *testing.T) {
	env := Env{Cwd: "/Users/u/app", Home: "/Users/u", Tools: testTools, FoldCase: true}
	text := `paths: {allow: ["/Users/u/app"], deny: ["~/.ssh", "**/.env", "*.pem", "/Users/u/app/Vault/**"], write: {deny: ["**/.git"]}}`
	p := mustParseEnv(t, text, env)
	for _, tt := range []struct {
		op              Op
		given, resolved string
		rule            string // "" when allowed
	}{
		{Read, "/Users/u/.SSH/id_rsa", "/Users/u/.SSH/id_rsa", "paths.deny"},
		{Read, "/users/U/.ssh", "/users/U/.ssh", "paths.deny"},
		{Read, "/Users/u/app/x", "/Users/u/.Ssh/id_rsa", "paths.deny"},
		{Read, "/Users/u/app/.ENV", "/Users/u/app/.ENV", "paths.deny"},
		{Read, "/Users/u/app/k.PEM", "/Users/u/app/k.PEM", "paths.deny"},
		{Read, "/Users/u/app/vault/x", "/Users/u/app/vault/x", "paths.deny"},
		{Write, "/Users/u/app/.GIT/config", "/Users/u/app/.GIT/config", "paths.write.deny"},
		{Read, "/USERS/U/APP/main.go", "/USERS/U/APP/main.go", ""},
		{Read, "/Users/u/apps/x", "/Users/u/apps/x", "paths.allow"},
		{Write, "/Users/u/app/.gitignore", "/Users/u/app/.gitignore", ""},
	} {
		err := p.CheckPath(tt.op, tt.given, tt.resolved)
		var rule string
		if d, ok := err.(*Denial); ok {
			rule = d.Rule
		} else if err != nil {
			t.Fatalf("%s %s: %v", tt.op, tt.given, err)
		}
		if rule != tt.rule {
			t.Errorf("%s %s (%s): rule %q (%v), want %q", tt.op, tt.given, tt.resolved, rule, err, tt.rule)
		}
		if err != nil && !strings.Contains(err.Error(), tt.given) {
			t.Errorf("%s %s: the refusal %q does not name the path as given", tt.op, tt.given, err)
		}
	}
	// The same policy on a file system that tells case apart.
	env.FoldCase = false
	if err := mustParseEnv(t, text, env).CheckPath(Read, "/Users/u/app/.ENV", "/Users/u/app/.ENV"); err != nil {
		t.Errorf("without FoldCase, .ENV is not .env: %v", err)
	}
}
