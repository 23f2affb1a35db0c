package policy

import (
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// TestCallersArchives runs testdata/callers: each archive's policy.yaml
// either loads and its cases say which entry each caller gets ("ok ISS
// SUB => callers.NAME", "no ISS SUB": no entry), or it is refused and
// every line of its error file is in the error ("!TEXT": is not).
// ISS and SUB may be Go-quoted strings.
func TestCallersArchives(t *testing.T) {
	for _, file := range archives(t, "callers") {
		t.Run(filepath.Base(file), func(t *testing.T) {
			a := readArchive(t, file)
			p, err := Parse([]byte(a.files["policy.yaml"]), archiveEnv(t, a))
			if want, ok := a.files["error"]; ok {
				if err == nil {
					t.Fatal("the policy loads; want it refused")
				}
				for _, line := range strings.Split(strings.TrimSpace(want), "\n") {
					if not, neg := strings.CutPrefix(line, "!"); neg {
						if strings.Contains(err.Error(), not) {
							t.Errorf("error %q mentions %q", err, not)
						}
					} else if !strings.Contains(err.Error(), line) {
						t.Errorf("error %q lacks %q", err, line)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for n, line := range strings.Split(a.files["cases"], "\n") {
				if line = strings.TrimSpace(line); line == "" {
					continue
				}
				pos := file + ":cases:" + strconv.Itoa(n+1)
				verdict, rest, _ := strings.Cut(line, " ")
				who, entry, _ := strings.Cut(rest, " => ")
				f := strings.Fields(who)
				if len(f) != 2 || (verdict != "ok" && verdict != "no") {
					t.Fatalf("%s: want ok|no ISS SUB [=> ENTRY], got %q", pos, line)
				}
				c := Caller{Issuer: unquoteCase(t, pos, f[0]), Subject: unquoteCase(t, pos, f[1])}
				cp, err := p.ForCaller(c)
				switch {
				case verdict == "no" && err == nil:
					t.Errorf("%s: %q of %q gets %s, want no entry", pos, c.Subject, c.Issuer, cp.narrowName)
				case verdict == "ok" && err != nil:
					t.Errorf("%s: %v", pos, err)
				case verdict == "ok" && cp.narrowName != entry:
					t.Errorf("%s: %q of %q gets %q, want %s", pos, c.Subject, c.Issuer, cp.narrowName, entry)
				}
			}
		})
	}
}

func unquoteCase(t *testing.T, pos, s string) string {
	t.Helper()
	if !strings.HasPrefix(s, `"`) {
		return s
	}
	u, err := strconv.Unquote(s)
	if err != nil {
		t.Fatalf("%s: %s: %v", pos, s, err)
	}
	return u
}

// TestCallersSummaryImpliedIssuer: the summary says the issuer an entry
// without iss is held to.
func TestCallersSummaryImpliedIssuer(t *testing.T) {
	p := mustParse(t, "callers:\n  - name: d\n    match: {sub: [\"token:deploy\"]}\n")
	want := "callers: d (iss fleetmcp:api-token (implied by sub), sub token:deploy): the host-wide rules"
	if s := strings.Join(p.Summary(), "\n"); !strings.Contains(s, want) {
		t.Errorf("summary %q lacks %q", s, want)
	}
}

func TestGlobMayMatchPrefix(t *testing.T) {
	for _, tc := range []struct {
		pattern, prefix string
		want            bool
	}{
		{"*", "https://", true},
		{"https://*", "https://", true},
		{"https://login.example.com", "https://", true},
		{"http*", "https://", true},
		{"fleetmcp:*", "https://", false},
		{"fleetmcp:api-token", "http://", false},
		{"?ttps://x", "https://", true},
		{"h?tp://x", "https://", false},
		{"*:*", "https://", true},
		{"a*b", "ab", true},
		{"ab", "abc", false},
		{"abc", "ab", true},
		{"", "", true},
		{"", "a", false},
		{"**a", "xa", true},
		{"é*", "h", false},
		{"?é", "h", true},
		{"*é", "https://", true},
	} {
		if got := globMayMatchPrefix(tc.pattern, tc.prefix); got != tc.want {
			t.Errorf("globMayMatchPrefix(%q, %q) = %v, want %v", tc.pattern, tc.prefix, got, tc.want)
		}
	}
}

func TestEntryIssuers(t *testing.T) {
	for _, tc := range []struct {
		name string
		m    callerMatch
		want []string
		err  string
	}{
		{"groups only", callerMatch{Groups: entries{"sre"}}, nil, ""},
		{"every subject", callerMatch{Sub: entries{"*"}}, nil, ""},
		{"every subject of one issuer", callerMatch{Iss: entries{"https://id"}, Sub: entries{"*"}}, []string{"https://id"}, ""},
		{"api token", callerMatch{Sub: entries{"token:deploy"}}, []string{protocol.IssuerAPIToken}, ""},
		{"api tokens", callerMatch{Sub: entries{"token:*", "token:ci"}}, []string{protocol.IssuerAPIToken}, ""},
		{"said", callerMatch{Iss: entries{"https://id"}, Sub: entries{"token:deploy"}}, []string{"https://id"}, ""},
		{"said own", callerMatch{Iss: entries{"fleetmcp:*"}, Sub: entries{"token:deploy"}}, []string{"fleetmcp:*"}, ""},
		{"a user", callerMatch{Sub: entries{"deploy"}}, providerIssuers(), ""},
		{"users", callerMatch{Sub: entries{"u-*", "alice"}}, providerIssuers(), ""},
		{"case", callerMatch{Sub: entries{"Token:deploy"}}, providerIssuers(), ""},
		{"local", callerMatch{Sub: entries{"local"}}, nil, `sub "local" without iss could be`},
		{"local glob", callerMatch{Sub: entries{"lo*"}}, nil, `sub "lo*" without iss could be`},
		{"token glob", callerMatch{Sub: entries{"*deploy"}}, nil, `sub "*deploy" without iss could be`},
		{"one of each", callerMatch{Sub: entries{"token:deploy", "deploy"}}, nil, `sub "token:deploy, deploy" without iss could be`},
		{"star issuer", callerMatch{Iss: entries{"*"}, Sub: entries{"token:deploy"}}, nil, `iss "*" matches both`},
		{"question issuer", callerMatch{Iss: entries{"?leetmcp:api-token"}, Sub: entries{"x"}}, []string{"?leetmcp:api-token"}, ""},
		{"one of each", callerMatch{Iss: entries{"fleetmcp:api-token", "https://id"}, Sub: entries{"token:x"}}, nil, `iss "fleetmcp:api-token, https://id" matches both`},
		{"h-star issuer", callerMatch{Iss: entries{"*t*"}, Sub: entries{"x"}}, nil, `iss "*t*" matches both`},
	} {
		got, err := entryIssuers(tc.m)
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%s: %v, want an error mentioning %q", tc.name, err, tc.err)
		case tc.err == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.err == "" && strings.Join(got, ",") != strings.Join(tc.want, ","):
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}

// FuzzGlobMayMatchPrefix: whenever a string with the (ASCII) prefix matches the
// pattern, globMayMatchPrefix says one may; and when the pattern itself
// begins with the prefix, it always may.
func FuzzGlobMayMatchPrefix(f *testing.F) {
	f.Add("*", "https://", "x")
	f.Add("?leetmcp:api-token", "fleetmcp:", "api-token")
	f.Add("h*s://", "https://", "")
	f.Add("é?*", "h", "ü")
	f.Fuzz(func(t *testing.T, pattern, prefix, rest string) {
		if !isASCII(prefix) {
			return // the prefixes asked about are schemes
		}
		if Glob(pattern, prefix+rest) && !globMayMatchPrefix(pattern, prefix) {
			t.Fatalf("%q matches %q, but globMayMatchPrefix(%q, %q) is false", pattern, prefix+rest, pattern, prefix)
		}
		if strings.HasPrefix(pattern, prefix) && !globMayMatchPrefix(pattern, prefix) {
			t.Fatalf("globMayMatchPrefix(%q, %q) is false, and the pattern begins with it", pattern, prefix)
		}
	})
}

// FuzzCallerIssuers: whatever callers section loads, no entry that names
// a subject matches that subject for two kinds of caller: an API token,
// the local caller, an identity provider's user.
func FuzzCallerIssuers(f *testing.F) {
	f.Add("callers:\n  - match: {sub: ['token:deploy']}\n", "token:deploy", "login.example.com")
	f.Add("callers:\n  - match: {iss: ['https://*'], sub: ['token:*']}\n", "token:x", "a")
	f.Add("callers:\n  - match: {iss: ['*'], sub: ['*']}\n", "deploy", "a")
	f.Add("callers:\n  - match: {iss: ['*:*'], sub: ['?oken:*']}\n", "token:deploy", "x")
	f.Add(callersPolicy, "local", "id.example")
	f.Add("callers:\n  - match: {sub: [alice, 'u-*']}\n", "alice", "id.example")
	f.Add("callers:\n  - match: {sub: ['l?cal']}\n", "local", "id.example")
	f.Fuzz(func(t *testing.T, text, sub, host string) {
		p, err := Parse([]byte(text), testEnv())
		if err != nil {
			return
		}
		callers := []Caller{
			{Issuer: protocol.IssuerAPIToken, Subject: sub},
			{Issuer: "https://" + host, Subject: sub},
			{Issuer: "http://" + host, Subject: sub},
			{Issuer: protocol.IssuerLocal, Subject: sub},
		}
		// The kinds of caller: API tokens, the local caller, identity
		// providers' users (https and http alike).
		kind := []int{0, 2, 2, 1}
		for _, r := range p.callers {
			if len(r.match.Sub) == 0 || containsEntry(r.match.Sub, "*") {
				continue
			}
			for i, a := range callers {
				for j, b := range callers[i+1:] {
					if kind[i] != kind[i+1+j] && r.matches(a) && r.matches(b) {
						t.Fatalf("entry %s matches %q from %q and from %q", r.name, sub, a.Issuer, b.Issuer)
					}
				}
			}
		}
	})
}

func containsEntry(l entries, s string) bool {
	for _, e := range l {
		if e == s {
			return true
		}
	}
	return false
}
