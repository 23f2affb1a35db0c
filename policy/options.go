package policy

import (
	"slices"
	"strings"
)

// optSpec describes a command's options.
type optSpec struct {
	flags    string   // short options without a value
	valued   string   // short options with a value, attached or the next word
	attached string   // short options whose value can only be attached
	long     []string // long options without a value (or with an attached =value)
	longVal  []string // long options with a value (--name=v or --name v)
	numeric  bool     // "-10" is an option (nice)
	plus     bool     // "+x" is an option too (shells)
	dash     bool     // "-" alone is an option (env's old spelling of -i)
	permute  bool     // options may follow operands, as GNU getopt allows
	// lenient takes an option it does not know for one without a value
	// rather than refusing it, and a word only known at run time for an
	// operand unless it may be an option. It suits programs whose every
	// option matters only if it runs something: an option misread as a
	// flag leaves its value to be read as an option too, which can only
	// find more.
	lenient bool
}

// longName resolves name, a long option as written without its dashes,
// the way getopt_long does: an exact name wins, otherwise the one name it
// is a prefix of. When it is a prefix of several, getopt refuses it as
// ambiguous; they are returned as cands, and full is "".
func (s *optSpec) longName(name string) (full string, valued bool, cands []string) {
	if slices.Contains(s.long, name) {
		return name, false, nil
	}
	if slices.Contains(s.longVal, name) {
		return name, true, nil
	}
	for _, l := range [][]string{s.long, s.longVal} {
		for _, n := range l {
			if strings.HasPrefix(n, name) {
				cands = append(cands, n)
			}
		}
	}
	if len(cands) == 1 {
		return cands[0], slices.Contains(s.longVal, cands[0]), nil
	}
	return "", false, cands
}

// optVal is the value an option was given.
type optVal struct {
	name string // the short option's letter, or the long option's name
	val  shWord
}

// parsedOpts is what parseOpts found.
type parsedOpts struct {
	short string   // the short options seen
	long  []string // the long options seen
	vals  []optVal // the values options were given, in order
	rest  []shWord // what follows the options
}

// has reports whether the short option short (a letter, or "") or the
// long option long (or "") was given.
func (p *parsedOpts) has(short, long string) bool {
	return short != "" && strings.Contains(p.short, short) || long != "" && slices.Contains(p.long, long)
}

// values returns the values given to the short option short or the long
// option long.
func (p *parsedOpts) values(short, long string) []shWord {
	var vs []shWord
	for _, v := range p.vals {
		if v.name != "" && (v.name == short || v.name == long) {
			vs = append(vs, v.val)
		}
	}
	return vs
}

// parseOpts splits args into options and what follows them. An option it
// does not know, or one only known at run time, is an error: where the
// wrapped command starts would be a guess.
func (c *checker) parseOpts(cmd string, args []shWord, spec optSpec) (parsedOpts, error) {
	var p parsedOpts
	for i := 0; i < len(args); i++ {
		w := args[i]
		if !w.literal() && (!spec.lenient || w.splits || w.text[0] == dyn) {
			return p, c.refuse("%s %s: the word is only known when the line runs and may be an option of %s, so what %s runs or sets cannot be found; write it out, or end the options with -- before it", cmd, shown(w.src), cmd, cmd)
		}
		t := w.text
		switch {
		case t == "--":
			p.rest = append(p.rest, args[i+1:]...)
			return p, nil
		case t == "-" && spec.dash:
		case len(t) < 2 || t[0] != '-' && !(spec.plus && t[0] == '+'):
			if !spec.permute {
				p.rest = append(p.rest, args[i:]...)
				return p, nil
			}
			p.rest = append(p.rest, w)
		case strings.HasPrefix(t, "--"):
			skip, err := c.longOpt(cmd, args[i:], spec, &p)
			if err != nil {
				return p, err
			}
			i += skip
		case spec.numeric && strings.Trim(t[1:], "0123456789") == "":
		default:
			skip, err := c.shortOpts(cmd, args[i:], spec, &p)
			if err != nil {
				return p, err
			}
			i += skip
		}
	}
	return p, nil
}

// longOpt reads one long option, args[0], and returns how many following
// words are its value. Like getopt_long it takes an unambiguous prefix for
// the option it abbreviates.
func (c *checker) longOpt(cmd string, args []shWord, spec optSpec, p *parsedOpts) (int, error) {
	w := args[0]
	name, v, eq := strings.Cut(w.text[2:], "=")
	full, valued, cands := spec.longName(name)
	names := []string{full}
	switch {
	case strings.IndexByte(name, dyn) >= 0:
		return 0, c.refuse("%s option %s is only known when the line runs, so what %s runs or sets cannot be found", cmd, shown(w.src), cmd)
	case len(cands) > 1 && !spec.lenient:
		return 0, c.refuse("%s option %s abbreviates more than one option (--%s), so it cannot be told which it is", cmd, shown(w.src), strings.Join(cands, ", --"))
	case len(cands) > 1:
		// getopt refuses it; taken for each, it can only find more.
		names = cands
	case full == "" && !spec.lenient:
		return 0, c.refuse("%s option %s is not one the checker knows, so where the command it runs starts cannot be told", cmd, shown(w.src))
	case full == "":
		names = []string{name}
	}
	skip := 0
	for _, n := range names {
		switch {
		case eq:
			p.vals = append(p.vals, optVal{n, shWord{text: v, src: w.src}})
		case valued:
			skip = nextValue(spec, args)
			if len(args) > 1 {
				if err := c.splitValue(cmd, w, args[1]); err != nil {
					return 0, err
				}
				p.vals = append(p.vals, optVal{n, args[1]})
			}
		}
		p.long = append(p.long, n)
	}
	return skip, nil
}

// shortOpts reads one cluster of short options, such as "-ec" or "-k5",
// args[0], and returns how many following words are their values.
func (c *checker) shortOpts(cmd string, args []shWord, spec optSpec, p *parsedOpts) (int, error) {
	w := args[0]
	t := w.text
	for j := 1; j < len(t); j++ {
		ch := t[j]
		switch {
		case strings.IndexByte(spec.flags, ch) >= 0:
			p.short += string(ch)
		case strings.IndexByte(spec.valued, ch) >= 0 && j == len(t)-1:
			p.short += string(ch)
			if len(args) > 1 {
				if err := c.splitValue(cmd, w, args[1]); err != nil {
					return 0, err
				}
				p.vals = append(p.vals, optVal{string(ch), args[1]})
			}
			return nextValue(spec, args), nil
		case strings.IndexByte(spec.valued, ch) >= 0 || strings.IndexByte(spec.attached, ch) >= 0:
			p.short += string(ch)
			p.vals = append(p.vals, optVal{string(ch), shWord{text: t[j+1:], src: w.src}})
			return 0, nil
		case spec.lenient && ch != dyn:
			p.short += string(ch)
		case ch == dyn:
			return 0, c.refuse("%s option %s is only known when the line runs, so what %s runs or sets cannot be found", cmd, shown(w.src), cmd)
		default:
			return 0, c.refuse("%s option %s (in %s) is not one the checker knows, so where the command it runs starts cannot be told", cmd, string(t[0])+string(ch), shown(w.src))
		}
	}
	return 0, nil
}

// splitValue refuses v, the value of option opt given as the next word,
// when the shell may split it into several words: those after the first
// would be read as options or as the command to run.
func (c *checker) splitValue(cmd string, opt, v shWord) error {
	if !v.splits {
		return nil
	}
	return c.refuse("%s %s %s: the value is only known when the line runs and may split into several words, which %s would read as options or a command; quote it", cmd, shown(opt.src), shown(v.src), cmd)
}

// nextValue returns how many words the value of the option args[0] takes
// from those after it: one. A lenient spec reads a value that looks like
// an option as an option too: where the table takes a flag for an option
// with a value (programs differ), the next word is one.
func nextValue(spec optSpec, args []shWord) int {
	if spec.lenient && len(args) > 1 && len(args[1].text) > 1 && args[1].text[0] == '-' {
		return 0
	}
	return 1
}
