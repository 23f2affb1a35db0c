package policy

import (
	"fmt"
	"slices"
	"strings"
)

// Programs read options in more spellings than a deny rule writes out:
// getopt_long takes any unambiguous prefix of a long option ("--rotat"
// for "--rotate", "--vacuum-s=1M" for "--vacuum-size=1M"), short options
// come in clusters ("-uo file" is "-u -o file"), and programs that parse
// like getopt_long_only or Go's flag package take "-name" for "--name".
// A deny rule that names an option matches all of them.

// patternOpts are the options a deny pattern names.
type patternOpts struct {
	longs  []string // long options, without their dashes: "rotate"
	shorts string   // single-letter options: "o" for "-o"
}

func (po patternOpts) empty() bool { return len(po.longs) == 0 && po.shorts == "" }

// patternOptions finds the options pattern p names: a "-" starting a
// word of the pattern (after a space or a "*"), followed by "-" and a
// name ("--rotate"), or by one letter or digit that ends the word ("-o",
// "-o*", "-o=...").
func patternOptions(p string) patternOpts {
	var po patternOpts
	for i := 1; i < len(p)-1; i++ {
		if p[i] != '-' || p[i-1] != ' ' && p[i-1] != '*' {
			continue
		}
		if p[i+1] == '-' {
			j := i + 2
			for j < len(p) && (nameByte(p[j]) || p[j] == '-') {
				j++
			}
			if j > i+2 && p[i+2] != '-' {
				po.longs = append(po.longs, p[i+2:j])
			}
			i = j - 1
			continue
		}
		if alnum(p[i+1]) && (i+2 == len(p) || strings.IndexByte(" *=", p[i+2]) >= 0) && strings.IndexByte(po.shorts, p[i+1]) < 0 {
			po.shorts += string(p[i+1])
		}
	}
	return po
}

func alnum(b byte) bool {
	return b >= '0' && b <= '9' || b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z'
}

// maxOptionReadings bounds the readings optionReadings tries; a line with
// more is taken to match.
const maxOptionReadings = 64

// optionReadings returns the words of a command read with each option
// spelling the pattern's options may hide behind spelled out: an
// abbreviation of a long option the pattern names as that option, a
// single-dash long option with two dashes, a cluster of short options
// split before each short option the pattern names. known, when not nil,
// are the command's own options: a word that is exactly one of them, or
// abbreviates one other than the pattern's, stays as it is. It returns
// nil when there is nothing to spell out, and all=true when there are too
// many readings to try.
func (po patternOpts) optionReadings(texts []string, known *optSpec) (readings [][]string, all bool) {
	var alts [][]string
	n := 1
	for i := 1; i < len(texts); i++ {
		sp := po.spellings(texts[i], known)
		if len(sp) == 0 {
			continue
		}
		if alts == nil {
			alts = make([][]string, len(texts))
		}
		alts[i] = sp
		if n *= len(sp) + 1; n > maxOptionReadings {
			return nil, true
		}
	}
	if n == 1 {
		return nil, false
	}
	readings = [][]string{texts}
	for i, as := range alts {
		var more [][]string
		for _, a := range as {
			for _, r := range readings {
				r = append([]string(nil), r...)
				r[i] = a
				more = append(more, r)
			}
		}
		readings = append(readings, more...)
	}
	return readings[1:], false
}

// spellings returns what word t may stand for, spelled as the pattern's
// options are.
func (po patternOpts) spellings(t string, known *optSpec) []string {
	if len(t) < 2 || t[0] != '-' {
		return nil
	}
	name, rest, eq := strings.Cut(t, "=")
	if eq {
		rest = "=" + rest
	}
	var out []string
	if strings.HasPrefix(name, "--") {
		name = name[2:]
		if name == "" || strings.IndexByte(name, dyn) >= 0 {
			return nil // an unknown part already matches whatever it may be
		}
		if known != nil {
			if full, _, _ := known.longName(name); full != "" && (full == name || !slices.Contains(po.longs, full)) {
				return nil // exactly, or only, another option
			}
		}
		for _, l := range po.longs {
			if l != name && strings.HasPrefix(l, name) {
				out = append(out, "--"+l+rest)
			}
		}
		return out
	}
	if slices.Contains(po.longs, name[1:]) && len(name) > 2 {
		out = append(out, "-"+t)
	}
	if po.shorts != "" && len(t) > 2 && t[1] != dyn {
		var b strings.Builder
		b.WriteString(t[:2])
		for j := 2; j < len(t); j++ {
			if strings.IndexByte(po.shorts, t[j]) >= 0 {
				b.WriteString(" -")
			}
			b.WriteByte(t[j])
		}
		if s := b.String(); s != t {
			out = append(out, s)
		}
	}
	return out
}

// denied checks the words of one command against the deny rules.
func (c *checker) denied(words []shWord, rules []cmdPattern) error { return denyMatch(words, rules) }

// denyMatch checks the words of one command against the deny rules.
func denyMatch(words []shWord, rules []cmdPattern) error {
	texts := make([]string, len(words))
	for i, w := range words {
		texts[i] = w.text
	}
	if words[0].literal() {
		texts[0] = commandName(words[0].text, true)
	} else {
		texts[0] = string(dyn)
	}
	var known *optSpec
	knownDone := false
	s := strings.Join(texts, " ")
	for i := range rules {
		if !rules[i].opts.empty() && !knownDone {
			known, knownDone = knownOptions(texts[0]), true
		}
		ok, reading := rules[i].denies(texts, known)
		switch {
		case !ok:
		case strings.Contains(s, string(dyn)):
			return &Denial{"bash.deny", fmt.Sprintf("command %s could match bash.deny %q, depending on values only known when it runs", shown(joinSrc(words)), rules[i].text)}
		case reading != "" && !strings.HasPrefix(reading, "with "):
			return &Denial{"bash.deny", fmt.Sprintf("command %s matches bash.deny %q when its options are spelled out as the program reads them (%s)", shown(joinSrc(words)), rules[i].text, shown(reading))}
		case reading != "":
			return &Denial{"bash.deny", fmt.Sprintf("command %s may match bash.deny %q: it has %s", shown(joinSrc(words)), rules[i].text, reading)}
		default:
			return &Denial{"bash.deny", fmt.Sprintf("command %s matches bash.deny %q", shown(joinSrc(words)), rules[i].text)}
		}
	}
	return nil
}
