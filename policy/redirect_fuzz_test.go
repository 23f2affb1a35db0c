package policy

import (
	"slices"
	"strings"
	"testing"

	"mvdan.cc/sh/v3/expand"
	"mvdan.cc/sh/v3/syntax"
)

// FuzzRedirects: for a line the checker allows under path rules for
// reading and writing, every redirection in it, read simply from the same
// syntax tree, was accounted for: a file named outright was handed to the
// files callback exactly as written (relative ones joined to the working
// directory, nothing cleaned) with what the redirection does; none names
// /dev/tcp or /dev/udp; none is only known at run time.
func FuzzRedirects(f *testing.F) {
	for _, s := range []string{
		"echo hi > /srv/app/out/x", "cat < a/self/../../x", "cat <> //srv/./app/../x", "exec 3</etc/passwd; echo >&3",
		"echo hi > \"$F\"", "cat < /dev/tcp/h/80", "cat <&3 >&-", "ls > >(cat) 2>/dev/null", "echo x >& out", "cat 0<x {fd}<y",
		"cat <<EOF > /x\nEOF", "echo > ~/x", "echo > /dev/fd/3", "cd /; cat < x", "echo > {a,b}", "echo > /srv/app/*",
	} {
		f.Add(s)
	}
	const paths = `paths: {read: {allow: ["/srv/app/**"]}, write: {allow: ["/srv/app/out/**"]}}`
	// With bash rules, and with path rules alone (redirections only).
	policies := []*Policy{mustParse(f, "bash: {deny: [\"rm *\"]}\n"+paths), mustParse(f, paths)}
	f.Fuzz(func(t *testing.T, line string) {
		for _, p := range policies {
			judgeRedirects(t, p, line)
		}
	})
}

// judgeRedirects checks the redirections of line if p allows it.
func judgeRedirects(t *testing.T, p *Policy, line string) {
	seen := map[string][]Op{}
	files := func(path string, ops ...Op) error {
		seen[path] = append(seen[path], ops...)
		return nil
	}
	if p.CheckCommand(line, files) != nil {
		return
	}
	file, err := syntax.NewParser(syntax.Variant(syntax.LangBash)).Parse(strings.NewReader(line), "")
	if err != nil {
		t.Fatalf("checker passed %q, which does not parse: %v", line, err)
	}
	syntax.Walk(file, func(n syntax.Node) bool {
		if st, ok := n.(*syntax.Stmt); ok {
			for _, r := range st.Redirs {
				judgeRedirect(t, line, r, seen)
			}
		}
		return true
	})
}

// judgeRedirect checks one redirection of a line the checker allowed.
func judgeRedirect(t *testing.T, line string, r *syntax.Redirect, seen map[string][]Op) {
	ops := redirOps(r.Op)
	if ops == nil || r.Word == nil {
		return
	}
	if len(r.Word.Parts) == 1 {
		if _, ok := r.Word.Parts[0].(*syntax.ProcSubst); ok {
			return
		}
	}
	lit, tilde := r.Word.Parts[0].(*syntax.Lit)
	tilde = tilde && strings.HasPrefix(lit.Value, "~")
	word, braces := oneBraceWord(r.Word)
	var fields []string
	var err error
	if braces == 1 && plainWord(word) {
		fields, err = expand.Fields(&expand.Config{}, word)
	}
	if braces != 1 || err != nil || len(fields) != 1 || tilde {
		if r.Op == syntax.DplIn {
			return // bash never opens a file there
		}
		t.Fatalf("checker passed %q, whose redirection to %q is only known when it runs", line, r.Word.Lit())
	}
	target := fields[0]
	switch {
	case (r.Op == syntax.DplIn || r.Op == syntax.DplOut) && isDescriptor(target):
		return
	case strings.HasPrefix(target, "/dev/tcp/") || strings.HasPrefix(target, "/dev/udp/"):
		t.Fatalf("checker passed %q, which opens %q", line, target)
	case specialFile(target) != notSpecial:
		return
	case !strings.HasPrefix(target, "/"):
		target = "/srv/app/" + target
	}
	for _, op := range ops {
		if !slices.Contains(seen[target], op) {
			t.Fatalf("checker passed %q without asking about %s %q (asked about %v)", line, op, target, seen)
		}
	}
}

// oneBraceWord returns what brace expansion makes of w when that is one
// word, and how many words bash keeps (2 standing for more than one).
func oneBraceWord(w *syntax.Word) (*syntax.Word, int) {
	cp := &syntax.Word{Parts: append([]syntax.WordPart(nil), w.Parts...)}
	if !syntax.SplitBraces(cp) {
		return w, 1
	}
	var words []*syntax.Word
	for bw, err := range expand.BracesSeq(nil, cp) {
		if err != nil {
			return w, 2
		}
		if !plainWord(bw) {
			return w, 2
		}
		if lit, err := expand.Literal(&expand.Config{}, bw); err == nil && lit == "" && !slices.ContainsFunc(bw.Parts, isQuote) {
			continue // bash drops empty words that are not quoted
		}
		if len(words) == 1 {
			return w, 2
		}
		words = append(words, bw)
	}
	if len(words) == 0 {
		return w, 0
	}
	return words[0], 1
}

func isQuote(p syntax.WordPart) bool {
	switch p.(type) {
	case *syntax.SglQuoted, *syntax.DblQuoted:
		return true
	}
	return false
}
