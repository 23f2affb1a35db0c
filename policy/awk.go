package policy

import (
	"fmt"
	"slices"
	"strings"
)

// An awk program can run commands (system(), print | "cmd", "cmd" |
// getline), write files (print > "file") and read them (getline <
// "file", which for gawk may be a network connection, /inet/...). The
// checker reads awk programs with a small lexer, enough to find those
// constructs whatever the program around them, and checks them: a
// literal command as a script for /bin/sh, a literal file against the
// write rules. What it cannot tell (a command built at run time, a
// program it cannot lex) is refused.

// awkText is a command or file name an awk program gives: known when it
// is a lone string literal.
type awkText struct {
	text  string
	known bool
}

// awkProgram is what scanAwk found in an awk program.
type awkProgram struct {
	commands []awkText // system(), pipes to and from commands
	writes   []awkText // print > file, print >> file
	reads    []awkText // getline < file
	// dynamic is set for constructs that call what only the running
	// program knows: an indirect call (@f()), which may be system.
	dynamic string
	// includes are @include and @load directives: code the checker
	// cannot see (@load loads a shared library).
	includes []string
	load     bool
	// environ is set when the program names ENVIRON, through which gawk
	// sets the environment of the commands it runs (LD_PRELOAD, PATH).
	environ bool
}

// awkTok is one token of an awk program.
type awkTok struct {
	kind byte // 'i' name, 'n' number, 's' string, 'r' regexp, 'l' newline, 'o' operator
	text string
	// known is false for a string whose escapes the lexer does not model.
	known bool
	// control is set on a ")" that closes the condition of if, while, for
	// or switch: a statement, which may be a regular expression, follows.
	control bool
}

// awkKeyword reports whether s is a word after which "/" starts a
// regular expression.
func awkKeyword(s string) bool {
	switch s {
	case "print", "printf", "return", "in", "do", "else", "case", "delete", "exit", "if", "while", "for",
		"function", "func", "BEGIN", "END", "BEGINFILE", "ENDFILE", "switch", "default":
		return true
	}
	return false
}

// awkLexer splits an awk program into tokens.
type awkLexer struct {
	src    string
	toks   []awkTok
	parens []bool // for each open "(": whether it starts a condition
}

// lexAwk splits an awk program into tokens.
func lexAwk(src string) ([]awkTok, error) {
	l := &awkLexer{src: src}
	for i := 0; i < len(src); {
		n, err := l.token(i)
		if err != nil {
			return nil, err
		}
		i += n
	}
	return l.toks, nil
}

func (l *awkLexer) last() *awkTok {
	if len(l.toks) == 0 {
		return nil
	}
	return &l.toks[len(l.toks)-1]
}

// token reads the token (or blank, or comment) at src[i] and returns its
// length.
func (l *awkLexer) token(i int) (int, error) {
	src := l.src
	ch := src[i]
	switch {
	case ch == ' ' || ch == '\t' || ch == '\r' || ch == '\f' || ch == '\v':
		return 1, nil
	case strings.HasPrefix(src[i:], "\\\n"):
		return 2, nil
	case strings.HasPrefix(src[i:], "\\\r\n"):
		return 3, nil
	case ch == '\n':
		if t := l.last(); t == nil || t.kind != 'l' {
			l.toks = append(l.toks, awkTok{kind: 'l', text: "\n"})
		}
		return 1, nil
	case ch == '#':
		if j := strings.IndexByte(src[i:], '\n'); j >= 0 {
			return j, nil
		}
		return len(src) - i, nil
	case ch == '"':
		text, known, n, err := awkString(src[i:])
		if err != nil {
			return 0, err
		}
		l.toks = append(l.toks, awkTok{kind: 's', text: text, known: known})
		return n, nil
	case ch == '/':
		return l.slash(i)
	case nameByte(ch) && (ch < '0' || ch > '9'):
		j := i
		for j < len(src) && nameByte(src[j]) {
			j++
		}
		l.toks = append(l.toks, awkTok{kind: 'i', text: src[i:j]})
		return j - i, nil
	case ch >= '0' && ch <= '9' || ch == '.' && i+1 < len(src) && src[i+1] >= '0' && src[i+1] <= '9':
		j := i
		for j < len(src) && (nameByte(src[j]) || src[j] == '.' ||
			(src[j] == '+' || src[j] == '-') && (src[j-1] == 'e' || src[j-1] == 'E')) {
			j++
		}
		l.toks = append(l.toks, awkTok{kind: 'n', text: src[i:j]})
		return j - i, nil
	}
	return l.operator(i)
}

// slash reads a "/": a regular expression where an operand is expected,
// a division (or /=) after one.
func (l *awkLexer) slash(i int) (int, error) {
	switch regexpAfter(l.last()) {
	case ambiguous:
		return 0, fmt.Errorf("cannot tell whether the / after %q divides or starts a regular expression", l.last().text)
	case yes:
		n, err := awkRegexp(l.src[i:])
		if err != nil {
			return 0, err
		}
		l.toks = append(l.toks, awkTok{kind: 'r', text: l.src[i : i+n]})
		return n, nil
	}
	op := "/"
	if strings.HasPrefix(l.src[i:], "/=") {
		op = "/="
	}
	l.toks = append(l.toks, awkTok{kind: 'o', text: op})
	return len(op), nil
}

// operator reads an operator, keeping track of the parentheses that hold
// a condition.
func (l *awkLexer) operator(i int) (int, error) {
	ch := l.src[i]
	op := string(ch)
	for _, o := range []string{"**=", "|&", "||", "&&", ">>", ">=", "<=", "==", "!=", "!~", "++", "--", "+=", "-=",
		"*=", "/=", "%=", "^=", "**", "::"} {
		if strings.HasPrefix(l.src[i:], o) {
			op = o
			break
		}
	}
	if strings.IndexByte("{}()[];,<>|!~?:+-*/%^=$@&", ch) < 0 || op == "&" {
		return 0, fmt.Errorf("unexpected character %q", ch)
	}
	tok := awkTok{kind: 'o', text: op}
	switch op {
	case "(":
		t := l.last()
		l.parens = append(l.parens, t != nil && t.kind == 'i' &&
			(t.text == "if" || t.text == "while" || t.text == "for" || t.text == "switch"))
	case ")":
		if n := len(l.parens); n > 0 {
			tok.control = l.parens[n-1]
			l.parens = l.parens[:n-1]
		}
	}
	l.toks = append(l.toks, tok)
	return len(op), nil
}

type tristate int

const (
	no tristate = iota
	yes
	ambiguous
)

// regexpAfter says whether a "/" after token prev starts a regular
// expression (where an operand is expected) or divides (after one).
// After ++, -- and getline it may be either.
func regexpAfter(prev *awkTok) tristate {
	if prev == nil {
		return yes
	}
	switch prev.kind {
	case 'n', 's', 'r':
		return no
	case 'i':
		switch {
		case prev.text == "getline":
			return ambiguous
		case awkKeyword(prev.text):
			return yes
		}
		return no
	case 'o':
		switch prev.text {
		case ")":
			if prev.control {
				return yes // if (c) /re/: a statement starts
			}
			return no
		case "]":
			return no
		case "++", "--":
			return ambiguous
		}
	}
	return yes
}

// awkString reads a string literal at the start of s, returning its
// value, whether that value is certain, and its length.
func awkString(s string) (text string, known bool, n int, err error) {
	var b strings.Builder
	known = true
	for i := 1; i < len(s); i++ {
		switch s[i] {
		case '"':
			return b.String(), known, i + 1, nil
		case '\n':
			return "", false, 0, fmt.Errorf("a string runs past the end of its line")
		case '\\':
			i++
			if i == len(s) {
				return "", false, 0, fmt.Errorf("a string is not closed")
			}
			switch e := s[i]; {
			case e == '"' || e == '\\' || e == '/':
				b.WriteByte(e)
			case e == '\n':
			case strings.IndexByte("ntabfrv", e) >= 0:
				b.WriteByte("\n\t\a\b\f\r\v"[strings.IndexByte("ntabfrv", e)])
			case e >= '0' && e <= '7':
				v, j := 0, i
				for ; j < len(s) && j < i+3 && s[j] >= '0' && s[j] <= '7'; j++ {
					v = v*8 + int(s[j]-'0')
				}
				b.WriteByte(byte(v))
				i = j - 1
			default:
				known = false
				b.WriteByte(e)
			}
			continue
		}
		b.WriteByte(s[i])
	}
	return "", false, 0, fmt.Errorf("a string is not closed")
}

// awkRegexp returns the length of the regular expression literal at the
// start of s. Awks disagree on whether a "/" inside brackets ends it;
// such a regular expression is refused.
func awkRegexp(s string) (int, error) {
	inBracket := false
	for i := 1; i < len(s); i++ {
		switch s[i] {
		case '\n':
			return 0, fmt.Errorf("a regular expression runs past the end of its line")
		case '\\':
			i++
		case '[':
			if !inBracket {
				inBracket = true
				if i+1 < len(s) && s[i+1] == '^' {
					i++
				}
				if i+1 < len(s) && s[i+1] == ']' {
					i++
				}
			}
		case ']':
			inBracket = false
		case '/':
			if inBracket {
				return 0, fmt.Errorf("a / inside brackets in a regular expression ends it in some awks and not in others")
			}
			return i + 1, nil
		}
	}
	return 0, fmt.Errorf("a regular expression is not closed")
}

// awkScan walks the tokens of an awk program.
type awkScan struct {
	toks    []awkTok
	closing map[int]int
	prog    awkProgram
}

func (s *awkScan) at(i int) awkTok {
	if i < 0 || i >= len(s.toks) {
		return awkTok{kind: 'l'} // the ends behave as a newline
	}
	return s.toks[i]
}

func (s *awkScan) isOp(i int, ops ...string) bool {
	t := s.at(i)
	return t.kind == 'o' && slices.Contains(ops, t.text)
}

// ends reports whether an expression ends before token i.
func (s *awkScan) ends(i int) bool { return s.at(i).kind == 'l' || s.isOp(i, ";", "}", ")") }

// lone returns the string literal at token i when it stands alone.
func (s *awkScan) lone(i int) awkText {
	if t := s.at(i); t.kind == 's' && s.ends(i+1) {
		return awkText{t.text, t.known}
	}
	return awkText{}
}

// scanAwk finds what an awk program runs, writes and reads.
func scanAwk(src string) (awkProgram, error) {
	toks, err := lexAwk(src)
	if err != nil {
		return awkProgram{}, err
	}
	s := &awkScan{toks: toks, closing: closingBrackets(toks)}
	printDepth := -1 // paren depth inside a print statement, or -1
	for i, t := range toks {
		switch {
		case t.kind == 'i' && t.text == "system":
			cmd := awkText{}
			if s.isOp(i+1, "(") && s.at(i+2).kind == 's' && s.isOp(i+3, ")") {
				cmd = awkText{s.at(i + 2).text, s.at(i + 2).known}
			}
			s.prog.commands = append(s.prog.commands, cmd)
		case t.kind == 'o' && (t.text == "|" || t.text == "|&"):
			printDepth = -1
			s.prog.commands = append(s.prog.commands, s.pipe(i))
		case t.kind == 'i' && t.text == "getline":
			if j := skipLvalue(toks, s.closing, i+1); s.isOp(j, "<") {
				s.prog.reads = append(s.prog.reads, s.lone(j+1))
			}
		case t.kind == 'o' && t.text == "@":
			s.directive(s.at(i + 1))
		case t.kind == 'i' && t.text == "ENVIRON":
			s.prog.environ = true
		case t.kind == 'i' && (t.text == "print" || t.text == "printf"):
			printDepth = 0
		case printDepth < 0:
		case t.kind == 'o' && (t.text == "(" || t.text == "["):
			printDepth++
		case t.kind == 'o' && (t.text == ")" || t.text == "]"):
			printDepth-- // below 0: the print statement has ended
		case t.kind == 'l' || s.isOp(i, ";", "}"):
			printDepth = -1
		case printDepth == 0 && t.kind == 'o' && (t.text == ">" || t.text == ">>"):
			s.prog.writes = append(s.prog.writes, s.lone(i+1))
			printDepth = -1
		}
	}
	return s.prog, nil
}

// pipe returns the command of the pipe at token i: on its left before
// getline ("cmd" | getline), on its right after print.
func (s *awkScan) pipe(i int) awkText {
	if next := s.at(i + 1); next.kind != 'i' || next.text != "getline" {
		return s.lone(i + 1)
	}
	if s.at(i-1).kind == 's' && (s.at(i-2).kind == 'l' || s.isOp(i-2, ";", "{", "}", "(", ",", "=", "&&", "||", "!", "?", ":")) {
		return awkText{s.at(i - 1).text, s.at(i - 1).known}
	}
	return awkText{}
}

// directive notes what follows an "@": @load, @include, @namespace, or an
// indirect call.
func (s *awkScan) directive(next awkTok) {
	switch {
	case next.kind == 'i' && next.text == "load":
		s.prog.load = true
	case next.kind == 'i' && (next.text == "include" || next.text == "nsinclude"):
		s.prog.includes = append(s.prog.includes, "@"+next.text)
	case next.kind == 'i' && next.text == "namespace":
	default:
		s.prog.dynamic = "calls a function named at run time (@" + next.text + "), which may be system"
	}
}

// skipLvalue returns the index after the variable getline may read into
// at toks[i]: a name, perhaps subscripted, or a field ($expr). closing
// maps each opening bracket to the index after its closing one.
func skipLvalue(toks []awkTok, closing map[int]int, i int) int {
	if i >= len(toks) {
		return i
	}
	switch t := toks[i]; {
	case t.kind == 'o' && t.text == "$":
		i++
		if i < len(toks) && (toks[i].kind == 'i' || toks[i].kind == 'n') {
			return i + 1
		}
		if j, ok := closing[i]; ok {
			return j
		}
	case t.kind == 'i' && !awkKeyword(t.text):
		i++
		if j, ok := closing[i]; ok && toks[i].text == "[" {
			return j
		}
	}
	return i
}

// closingBrackets maps the index of each "(" and "[" in toks to the index
// after the bracket that closes it (len(toks) when none does).
func closingBrackets(toks []awkTok) map[int]int {
	closing := map[int]int{}
	var open []int
	for i, t := range toks {
		switch {
		case t.kind != 'o':
		case t.text == "(" || t.text == "[":
			open = append(open, i)
		case (t.text == ")" || t.text == "]") && len(open) > 0:
			closing[open[len(open)-1]] = i + 1
			open = open[:len(open)-1]
		}
	}
	for _, i := range open {
		closing[i] = len(toks)
	}
	return closing
}

func awkSpec() optSpec {
	return optSpec{flags: "bcCghkMNnOPrsStVyIZ", valued: "eEfFilvW", attached: "dDLop",
		long: names(`bignum characters-as-bytes copyright csv debug dump-variables gen-pot help lint no-optimize
			non-decimal-data optimize posix pretty-print profile re-interval sandbox traditional trace
			use-lc-numeric version persist`),
		longVal: names(`assign exec field-separator file include load source`)}
}

// awkRuns returns what an awk program given on awk's command line (or in
// a literal here-document read with -f -) runs, and checks the files it
// writes.
func (c *checker) awkRuns(name string, args []shWord) ([]runs, error) {
	p, err := c.parseOpts(name, args, awkSpec())
	if err != nil {
		return nil, err
	}
	var rs []runs
	var texts []shWord
	fromFile := false
	for _, v := range p.vals {
		switch v.name {
		case "e", "source":
			texts = append(texts, v.val)
		case "f", "file", "E", "exec", "i", "include":
			fromFile = true
			switch {
			case stdinName(v.val.text) && c.stdin.known:
				texts = append(texts, shWord{text: c.stdin.text, src: "standard input"})
			case v.val.literal() && !c.readsStdin(v.val.text):
				rs = append(rs, hiddenRun("runs the awk program in file "+shown(v.val.src)+", which the checker does not read; give the program on the command line"))
			default:
				rs = append(rs, runs{unknown: "runs an awk program from standard input or a file only known when the line runs"})
			}
		case "l", "load":
			rs = append(rs, runs{unknown: "loads a shared library (-l " + shown(v.val.src) + ")"})
		case "D", "debug":
			rs = append(rs, hiddenRun("runs the awk debugger, which reads commands from standard input"))
		case "W":
			rs = append(rs, runs{unknown: "takes -W " + shown(v.val.src) + ", a long option the checker reads only as --name"})
		case "d", "dump-variables", "p", "pretty-print", "o", "profile":
			if err := c.awkOutputFile(v); err != nil {
				return nil, err
			}
		}
	}
	rest := p.rest
	if len(texts) == 0 && !fromFile {
		if len(rest) == 0 {
			return rs, nil // awk refuses to run without a program
		}
		texts, rest = rest[:1], rest[1:]
	}
	_ = rest // files and assignments: data
	for _, t := range texts {
		more, err := c.awkProgramRuns(t)
		if err != nil {
			return nil, err
		}
		rs = append(rs, more...)
	}
	return rs, nil
}

// awkOutputFile checks the file gawk's -d, -p and -o (and their long
// forms) write, awkvars.out or awkprof.out when not named.
func (c *checker) awkOutputFile(v optVal) error {
	f := v.val
	if f.text == "" {
		f = shWord{text: "awkprof.out", src: "awkprof.out"}
		if v.name == "d" || v.name == "dump-variables" {
			f = shWord{text: "awkvars.out", src: "awkvars.out"}
		}
	}
	return c.writesNamed("awk -"+v.name, f)
}

// awkProgramRuns checks one awk program text.
func (c *checker) awkProgramRuns(t shWord) ([]runs, error) {
	if !t.literal() {
		return []runs{hiddenRun("runs an awk program only known when the line runs; pass values with -v")}, nil
	}
	prog, err := scanAwk(t.text)
	if err != nil {
		return []runs{{unknown: "runs an awk program the checker cannot read (" + err.Error() + ")"}}, nil
	}
	var rs []runs
	if prog.environ && len(prog.commands) > 0 {
		return []runs{{unknown: "runs commands and names ENVIRON, through which it can set their environment (LD_PRELOAD, PATH)"}}, nil
	}
	for _, cmd := range prog.commands {
		if !cmd.known {
			rs = append(rs, runs{unknown: "runs a command (system(), a pipe) that the awk program builds when it runs"})
			continue
		}
		rs = append(rs, runs{script: cmd.text, isScript: true, lang: langSh, via: "system() or a pipe in its program"})
	}
	for _, w := range prog.writes {
		f := shWord{text: w.text, src: w.text}
		if !w.known {
			f = dynWord("an expression")
		}
		if strings.HasPrefix(w.text, "/inet") {
			rs = append(rs, runs{unknown: "opens a network connection (print > " + shown(w.text) + ")"})
			continue
		}
		if err := c.writesNamed("awk print >", f); err != nil {
			return nil, err
		}
	}
	for _, r := range prog.reads {
		switch {
		case !r.known:
			rs = append(rs, hiddenRun("reads with getline a file named when it runs, which may be a network connection (/inet/...)"))
		case strings.HasPrefix(r.text, "/inet"):
			rs = append(rs, runs{unknown: "opens a network connection (getline < " + shown(r.text) + ")"})
		}
	}
	if prog.dynamic != "" {
		rs = append(rs, runs{unknown: prog.dynamic})
	}
	if prog.load {
		rs = append(rs, runs{unknown: "loads a shared library (@load)"})
	}
	for _, inc := range prog.includes {
		rs = append(rs, hiddenRun("runs awk code from a file ("+inc+"), which the checker does not read"))
	}
	return rs, nil
}
