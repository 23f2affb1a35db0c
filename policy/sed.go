package policy

import (
	"fmt"
	"path"
	"strings"
)

// A sed script can run commands (GNU's e command, and the e flag of s,
// which runs the pattern space) and write files (w, W and the w flag of
// s); -i edits its files in place. The checker parses sed scripts as GNU
// sed does, leniently enough to take in what BSD sed accepts, and checks
// what they run and write. A script it cannot parse is refused.

// sedScript is what parseSed found in a sed script.
type sedScript struct {
	commands []string // the commands of "e COMMAND"
	// execs is set for a command that runs the pattern space (e alone,
	// s///e): text the script builds while it runs.
	execs  bool
	writes []string // the files of w, W and s///w
}

// sedParser reads one sed script.
type sedParser struct {
	s   string
	i   int
	out sedScript
}

func (p *sedParser) more() bool { return p.i < len(p.s) }

func (p *sedParser) peek() byte {
	if p.i < len(p.s) {
		return p.s[p.i]
	}
	return 0
}

func (p *sedParser) blanks() {
	for p.more() && (p.peek() == ' ' || p.peek() == '\t') {
		p.i++
	}
}

// toEOL returns the rest of the line, which it consumes with its newline.
func (p *sedParser) toEOL() string {
	j := strings.IndexByte(p.s[p.i:], '\n')
	if j < 0 {
		j = len(p.s) - p.i
	}
	t := p.s[p.i : p.i+j]
	p.i += j
	return t
}

// parseSed parses a sed script.
func parseSed(script string) (sedScript, error) {
	p := &sedParser{s: script}
	depth := 0
	for {
		for p.more() && strings.IndexByte(" \t\n;", p.peek()) >= 0 {
			p.i++
		}
		if !p.more() {
			break
		}
		if p.peek() == '#' {
			p.toEOL()
			continue
		}
		if err := p.addresses(); err != nil {
			return p.out, err
		}
		if !p.more() {
			return p.out, fmt.Errorf("an address without a command")
		}
		cmd := p.s[p.i]
		p.i++
		switch cmd {
		case '{':
			depth++
			continue
		case '}':
			if depth--; depth < 0 {
				return p.out, fmt.Errorf("an unexpected }")
			}
		default:
			if err := p.command(cmd); err != nil {
				return p.out, err
			}
		}
		p.blanks()
		switch p.peek() {
		case 0, ';', '\n', '}', '#':
		default:
			return p.out, fmt.Errorf("unexpected %q after command %c", p.peek(), cmd)
		}
	}
	if depth != 0 {
		return p.out, fmt.Errorf("a { is not closed")
	}
	return p.out, nil
}

// addresses reads a command's addresses and its "!"s.
func (p *sedParser) addresses() error {
	if _, err := p.address(false); err != nil {
		return err
	}
	p.blanks()
	if p.peek() == ',' {
		p.i++
		p.blanks()
		ok, err := p.address(true)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("a , without a second address")
		}
	}
	p.blanks()
	for p.peek() == '!' {
		p.i++
		p.blanks()
	}
	return nil
}

// address reads one address, if there is one; second allows the forms
// only a second address takes (+N, ~N).
func (p *sedParser) address(second bool) (bool, error) {
	digits := func() {
		for p.more() && p.peek() >= '0' && p.peek() <= '9' {
			p.i++
		}
	}
	switch c := p.peek(); {
	case c >= '0' && c <= '9':
		digits()
		if p.peek() == '~' {
			p.i++
			digits()
		}
	case c == '$':
		p.i++
	case second && (c == '+' || c == '~'):
		p.i++
		digits()
	case c == '/' || c == '\\':
		if c == '\\' {
			p.i++
		}
		if _, err := p.delimited(true); err != nil {
			return false, err
		}
		for p.peek() == 'I' || p.peek() == 'M' {
			p.i++
		}
	default:
		return false, nil
	}
	return true, nil
}

// delimited reads text up to a delimiter, the character at p.i: a
// regular expression (regex) or a replacement. A backslash escapes the
// next character. In a regular expression, a delimiter inside brackets
// ends the text for GNU sed and not for BSD sed, so it is refused.
func (p *sedParser) delimited(regex bool) (string, error) {
	if !p.more() {
		return "", fmt.Errorf("a missing delimiter")
	}
	delim := p.s[p.i]
	if delim == '\n' || delim == '\\' {
		return "", fmt.Errorf("a newline or backslash as a delimiter")
	}
	start := p.i + 1
	inBracket := false
	for j := start; j < len(p.s); j++ {
		switch c := p.s[j]; {
		case c == '\\':
			j++
		case c == '\n' && delim != '\n':
			return "", fmt.Errorf("a newline inside %c...%c", delim, delim)
		case c == delim && inBracket:
			return "", fmt.Errorf("a delimiter %c inside brackets, where seds disagree on whether it ends the text", delim)
		case c == delim:
			p.i = j + 1
			return p.s[start:j], nil
		case c == '[' && !inBracket && regex:
			inBracket = true
			if j+1 < len(p.s) && p.s[j+1] == '^' {
				j++
			}
			if j+1 < len(p.s) && p.s[j+1] == ']' {
				j++
			}
		case c == ']':
			inBracket = false
		}
	}
	return "", fmt.Errorf("an unterminated %c...%c", delim, delim)
}

// command reads the arguments of command cmd.
func (p *sedParser) command(cmd byte) error {
	switch cmd {
	case '=', 'd', 'D', 'g', 'G', 'h', 'H', 'n', 'N', 'p', 'P', 'x', 'z', 'F':
	case 'l', 'L', 'q', 'Q':
		p.blanks()
		for p.more() && p.peek() >= '0' && p.peek() <= '9' {
			p.i++
		}
	case ':', 'b', 't', 'T', 'v':
		// A label ends at a newline or, for GNU sed, a semicolon: read
		// the shorter, which finds more commands.
		for p.more() && p.peek() != '\n' && p.peek() != ';' {
			p.i++
		}
	case 'a', 'i', 'c':
		p.text()
	case 'r', 'R':
		p.toEOL()
	case 'w', 'W':
		p.blanks()
		p.out.writes = append(p.out.writes, p.toEOL())
	case 'e':
		p.blanks()
		if c := p.toEOL(); strings.TrimSpace(c) != "" {
			p.out.commands = append(p.out.commands, c)
		} else {
			p.out.execs = true
		}
	case 's':
		return p.substitute()
	case 'y':
		if _, err := p.delimited(false); err != nil {
			return err
		}
		p.i--
		if _, err := p.delimited(false); err != nil {
			return err
		}
	default:
		return fmt.Errorf("unknown command %q", cmd)
	}
	return nil
}

// text reads the text of a, i and c: the rest of the line, and the lines
// after a line that ends in a backslash.
func (p *sedParser) text() {
	p.blanks()
	if p.peek() == '\\' {
		p.i++
		p.blanks()
		if p.peek() == '\n' {
			p.i++
		}
	}
	for p.more() {
		switch p.peek() {
		case '\\':
			p.i += 2
			continue
		case '\n':
			return
		}
		p.i++
	}
	p.i = min(p.i, len(p.s))
}

// substitute reads s/REGEXP/REPLACEMENT/FLAGS.
func (p *sedParser) substitute() error {
	if _, err := p.delimited(true); err != nil {
		return err
	}
	p.i-- // the delimiter that ended the regular expression starts the replacement
	if _, err := p.delimited(false); err != nil {
		return err
	}
	for p.more() {
		switch c := p.peek(); {
		case c == 'g' || c == 'p' || c == 'i' || c == 'I' || c == 'm' || c == 'M' || c >= '0' && c <= '9':
			p.i++
		case c == 'e':
			p.out.execs = true
			p.i++
		case c == 'w':
			p.i++
			p.blanks()
			p.out.writes = append(p.out.writes, p.toEOL())
			return nil
		default:
			return nil
		}
	}
	return nil
}

func sedSpec() optSpec {
	return optSpec{flags: "nsuzbErahV", valued: "efl", attached: "iI", permute: true,
		long: names(`quiet silent debug follow-symlinks in-place binary posix regexp-extended separate sandbox
			unbuffered null-data zero-terminated help version`),
		longVal: names(`expression file line-length`)}
}

// sedRuns returns what a sed command runs and checks the files it
// writes: those its script names, and with -i the files it edits.
func (c *checker) sedRuns(name string, args []shWord) ([]runs, error) {
	p, err := c.parseOpts(name, args, sedSpec())
	if err != nil {
		return nil, err
	}
	scripts, rs, given := c.sedScripts(p)
	files := p.rest
	inPlace := p.has("i", "in-place") || p.has("I", "")
	if !given && len(files) > 0 {
		scripts = append(scripts, files[0])
		files = files[1:]
		if inPlace && len(p.values("i", "")) > 0 && p.values("i", "")[0].text == "" && len(files) > 0 {
			// BSD sed: a bare -i takes the next word as its suffix, and
			// the script follows it.
			switch _, err := parseSed(files[0].text); {
			case !files[0].literal():
				rs = append(rs, hiddenRun("may run a sed script only known when the line runs (BSD sed -i takes the next word for its suffix)"))
			case err == nil:
				scripts = append(scripts, files[0])
			}
		}
	}
	// GNU sed --sandbox refuses e, w and r before it runs anything.
	for _, s := range scripts {
		if p.has("", "sandbox") {
			break
		}
		more, err := c.sedScriptRuns(s)
		if err != nil {
			return nil, err
		}
		rs = append(rs, more...)
	}
	if inPlace {
		if err := c.sedInPlace(p, files); err != nil {
			return nil, err
		}
	}
	return rs, nil
}

// sedScripts returns the scripts given with -e (joined by newlines, as
// GNU sed joins them), with -f when read from a literal here-document,
// and, for BSD sed, after -l; what the other -f files run; and whether
// -e or -f was given at all.
func (c *checker) sedScripts(p parsedOpts) (scripts []shWord, rs []runs, given bool) {
	var exprs []string
	literal := true
	for _, v := range p.vals {
		switch v.name {
		case "e", "expression":
			given = true
			exprs = append(exprs, v.val.text)
			literal = literal && v.val.literal()
		case "f", "file":
			given = true
			switch {
			case stdinName(v.val.text) && c.stdin.known:
				scripts = append(scripts, shWord{text: c.stdin.text, src: "standard input"})
			case v.val.literal() && !c.readsStdin(v.val.text):
				rs = append(rs, hiddenRun("runs the sed script in file "+shown(v.val.src)+", which the checker does not read; give it with -e"))
			default:
				rs = append(rs, runs{unknown: "runs a sed script from standard input or a file only known when the line runs"})
			}
		case "l":
			if !isNumber(v.val) {
				// BSD sed's -l takes no value: the word is its script.
				scripts = append(scripts, v.val)
			}
		}
	}
	if len(exprs) > 0 {
		e := shWord{text: strings.Join(exprs, "\n"), src: "-e"}
		if !literal {
			e.text = string(dyn)
		}
		scripts = append(scripts, e)
	}
	return scripts, rs, given
}

// sedScriptRuns checks one sed script.
func (c *checker) sedScriptRuns(s shWord) ([]runs, error) {
	if !s.literal() {
		return []runs{hiddenRun("runs a sed script only known when the line runs")}, nil
	}
	sc, err := parseSed(s.text)
	if err != nil {
		return []runs{{unknown: "runs a sed script the checker cannot parse (" + err.Error() + ")"}}, nil
	}
	var rs []runs
	for _, cmd := range sc.commands {
		rs = append(rs, runs{script: cmd, isScript: true, lang: langSh, via: "the e command of its script"})
	}
	if sc.execs {
		rs = append(rs, runs{unknown: "runs the pattern space as a command (e, s///e), which the script builds while it runs"})
	}
	for _, w := range sc.writes {
		if err := c.writesNamed("sed w", shWord{text: w, src: w}); err != nil {
			return nil, err
		}
	}
	return rs, nil
}

// sedInPlace checks the files sed -i edits, and the backup copies a
// suffix names (a "*" in it stands for the file's name; without a "/" the
// copy goes beside the file).
func (c *checker) sedInPlace(p parsedOpts, files []shWord) error {
	suffixes := append(p.values("i", "in-place"), p.values("I", "")...)
	for _, f := range files {
		if err := c.writesNamed("sed -i", f); err != nil {
			return err
		}
		if !f.literal() {
			continue
		}
		for _, s := range suffixes {
			if s.text == "" {
				continue
			}
			if !s.literal() {
				return c.writesNamed("sed -i", s)
			}
			b := f.text + s.text
			if strings.Contains(s.text, "*") {
				b = strings.ReplaceAll(s.text, "*", path.Base(f.text))
				if !strings.Contains(b, "/") {
					b = path.Join(path.Dir(f.text), b)
				}
			}
			if err := c.writesNamed("sed -i", shWord{text: b, src: s.src}); err != nil {
				return err
			}
		}
	}
	return nil
}
