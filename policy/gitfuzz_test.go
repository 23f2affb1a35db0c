package policy

import (
	"slices"
	"strings"
	"testing"
)

// FuzzParseGitConfigList: git's configuration listing either parses into
// settings that print back as the same bytes, or is refused; it never
// panics.
func FuzzParseGitConfigList(f *testing.F) {
	for _, s := range []string{
		"local\x00file:.git/config\x00core.bare\nfalse\x00",
		"global\x00file:/h/.gitconfig\x00x.flag\x00command\x00command line:\x00a.B.c\nv\nw\x00",
		"system\x00file:/etc/gitconfig\x00credential.https://h.helper\ngcloud.sh\x00",
		"", "\x00", "local\x00o\x00k\x00", "a\x00b\x00c.d",
	} {
		f.Add([]byte(s))
	}
	g, err := NewGitRules([]string{"global:alias.*"}, nil)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		entries, err := ParseGitConfigList(data)
		if err != nil {
			return
		}
		if got := gitList(entries...); string(got) != string(data) {
			t.Fatalf("%q parses to %+v, which prints as %q", data, entries, got)
		}
		if err := g.CheckConfig(entries); err == nil {
			for _, e := range entries {
				if strings.HasPrefix(e.Key, "alias.") && e.Scope != "global" || strings.HasPrefix(e.Key, "filter.") {
					t.Fatalf("%+v allowed", e)
				}
			}
		}
	})
}

// FuzzGitCheckArgs: the guard's reading of a git command line never
// panics, forwards only words of the line, in order, and refuses nothing
// the checker allows when it reads the same words before they run.
func FuzzGitCheckArgs(f *testing.F) {
	for _, s := range []string{
		"status", "-C sub -c color.ui=never log --oneline", "rebase -ixid main", "--git-dir=x --bare fetch --upload-p=id",
		"clone -qcalias.x=!id a b", "-c", "--config-env", "grep -nO TODO", "submodule --quiet foreach id", "-- x",
		"-C x push", "config alias.x y", "for-each-repo --config=x push", "bisect view tig", "credential-x get",
	} {
		f.Add(s)
	}
	g, err := NewGitRules(nil, []string{"git push *"})
	if err != nil {
		f.Fatal(err)
	}
	p := mustParse(f, `bash: {allow: ["git *"], deny: ["git push *"]}`)
	f.Fuzz(func(t *testing.T, line string) {
		args := strings.Fields(line)
		inv, err := g.CheckArgs(args)
		if err == nil {
			rest := args
			for _, r := range inv.Repo {
				i := slices.Index(rest, r)
				if i < 0 {
					t.Fatalf("%q: forwards %q, not the words of the line in order", args, inv.Repo)
				}
				rest = rest[i+1:]
			}
			return
		}
		// Words the shell leaves as they are mean the same to the checker.
		plain := func(r rune) bool { return !strings.ContainsRune("abcdefghijklmnopqrstuvwxyzACOPSX0123456789-=._/", r) }
		if len(args) == 0 || strings.ContainsFunc(strings.Join(args, ""), plain) {
			return
		}
		if p.CheckCommand("git "+strings.Join(args, " "), nil) == nil {
			t.Fatalf("the checker allows git %q, which the guard refuses: %v", args, err)
		}
	})
}

// FuzzGitAlias: an alias's value splits into words without a panic, as
// strings.Fields does when it holds no quotes or backslashes, and
// checking what it runs ends.
func FuzzGitAlias(f *testing.F) {
	for _, s := range []string{"push", `log --format="%h %s"`, "a 'b c' d\\ e", `x "y`, "!sh", "p", "-C x p"} {
		f.Add(s)
	}
	g, err := NewGitRules([]string{"global:alias.*"}, []string{"git push *"})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, value string) {
		words, ok := splitGitCmdline(value)
		ascii := !strings.ContainsFunc(value, func(r rune) bool { return r >= 0x80 })
		if ascii && !strings.ContainsAny(value, `'"\\`) && (!ok || !slices.Equal(words, strings.Fields(value))) {
			t.Fatalf("%q splits into %q (%v), not %q", value, words, ok, strings.Fields(value))
		}
		entries := []GitConfigEntry{{Scope: "global", Key: "alias.p", Value: value}, {Scope: "global", Key: "alias.q", Value: "p " + value}}
		err := g.CheckAlias([]string{"q"}, entries, func(string) bool { return false })
		if err == nil && ok && len(words) > 0 && words[0] == "push" {
			t.Fatalf("alias q = p %q runs git push, allowed", value)
		}
	})
}
