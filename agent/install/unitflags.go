package install

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// UnitPaths are where the agent's systemd unit is looked for, in the
// order systemd prefers them: install's, then the package's.
var UnitPaths = []string{"/etc/systemd/system/fleet-agent.service", "/usr/lib/systemd/system/fleet-agent.service", "/lib/systemd/system/fleet-agent.service"}

// dropInDir holds the administrator's drop-ins of the agent's unit.
const dropInDir = "/etc/systemd/system/fleet-agent.service.d"

// ServiceArgs are the agent's arguments as systemd runs the service.
type ServiceArgs struct {
	// Args follow the executable in ExecStart, $VARs expanded from the
	// environment files.
	Args []string
	// Unit, DropIns and EnvFiles are the files read.
	Unit     string
	DropIns  []string
	EnvFiles []string
	// Unread are environment files that could not be read (not root):
	// their variables are taken as empty.
	Unread []error
}

// ReadServiceArgs reads unit (and the drop-ins in dropInDir, which
// change its ExecStart= and EnvironmentFile=) and returns the arguments
// the service's ExecStart gives the agent. root is prepended to every
// path read (tests; "/" on the machine).
func ReadServiceArgs(root, unit string) (*ServiceArgs, error) {
	sa := &ServiceArgs{Unit: unit}
	data, err := os.ReadFile(filepath.Join(root, unit))
	if err != nil {
		return nil, err
	}
	execStart, envFiles := "", []string(nil)
	apply := func(name string, data []byte) error {
		settings, err := ParseUnitService(data)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		for _, kv := range settings {
			switch kv[0] {
			case "ExecStart":
				execStart = kv[1] // one for Type=exec; "" resets
			case "EnvironmentFile":
				if kv[1] == "" {
					envFiles = nil
				} else {
					envFiles = append(envFiles, kv[1])
				}
			}
		}
		return nil
	}
	if err := apply(unit, data); err != nil {
		return nil, err
	}
	dropIns, _ := filepath.Glob(filepath.Join(root, dropInDir, "*.conf"))
	slices.Sort(dropIns)
	for _, d := range dropIns {
		data, err := os.ReadFile(d)
		if err != nil {
			return nil, err
		}
		if err := apply(d, data); err != nil {
			return nil, err
		}
		sa.DropIns = append(sa.DropIns, strings.TrimPrefix(d, filepath.Clean(root)))
	}
	if execStart == "" {
		return nil, fmt.Errorf("%s has no ExecStart=", unit)
	}
	env := map[string]string{}
	for _, f := range envFiles {
		optional := strings.HasPrefix(f, "-")
		f = strings.TrimPrefix(f, "-")
		data, err := os.ReadFile(filepath.Join(root, f))
		switch {
		case errors.Is(err, fs.ErrNotExist) && optional:
			continue
		case errors.Is(err, fs.ErrPermission):
			sa.Unread = append(sa.Unread, err)
			continue
		case err != nil:
			return nil, err
		}
		vars, err := ParseEnvFile(data)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		for k, v := range vars {
			env[k] = v
		}
		sa.EnvFiles = append(sa.EnvFiles, f)
	}
	words, err := SplitExecStart(execStart, env)
	if err != nil {
		return nil, fmt.Errorf("%s: ExecStart: %w", unit, err)
	}
	sa.Args = words[1:]
	return sa, nil
}

// ParseUnitService returns the settings of the [Service] section of a
// unit file, in order, as key and value (continuation lines joined).
func ParseUnitService(data []byte) ([][2]string, error) {
	var out [][2]string
	section := ""
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	pending := ""
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if pending != "" {
			line, pending = pending+" "+line, ""
		}
		if strings.HasSuffix(line, `\`) {
			pending = strings.TrimSuffix(line, `\`)
			continue
		}
		switch {
		case line == "" || line[0] == '#' || line[0] == ';':
		case line[0] == '[':
			if !strings.HasSuffix(line, "]") {
				return nil, fmt.Errorf("line %d: a section header without ]", n)
			}
			section = line[1 : len(line)-1]
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok {
				return nil, fmt.Errorf("line %d: not KEY=VALUE", n)
			}
			if section == "Service" {
				out = append(out, [2]string{strings.TrimSpace(k), strings.TrimSpace(v)})
			}
		}
	}
	return out, sc.Err()
}

// ParseEnvFile reads a systemd EnvironmentFile: KEY=VALUE lines, comments
// (# or ;), values bare or in double quotes (with \\ \" \$ \` escapes)
// or single quotes.
func ParseEnvFile(data []byte) (map[string]string, error) {
	out := map[string]string{}
	for n, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' || line[0] == ';' {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		k = strings.TrimSpace(k)
		if !ok || k == "" || strings.ContainsAny(k, " \t\"'$") {
			return nil, fmt.Errorf("line %d: not KEY=VALUE", n+1)
		}
		v = strings.TrimSpace(v)
		switch {
		case len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"':
			var b strings.Builder
			in := v[1 : len(v)-1]
			for i := 0; i < len(in); i++ {
				if in[i] == '\\' && i+1 < len(in) {
					i++
				}
				b.WriteByte(in[i])
			}
			v = b.String()
		case len(v) >= 2 && v[0] == '\'' && v[len(v)-1] == '\'':
			v = v[1 : len(v)-1]
		}
		out[k] = v
	}
	return out, nil
}

// SplitExecStart splits an ExecStart= value into words as systemd does
// for the forms units use: its prefixes (-@+!:) dropped, words split at
// whitespace, double- and single-quoted words (C escapes in double
// quotes), "%%" and "$$" for "%" and "$", a whole word $VAR split at
// whitespace and ${VAR} as one word, from env. Other specifiers or
// variables inside words are refused, not guessed.
func SplitExecStart(line string, env map[string]string) ([]string, error) {
	line = strings.TrimLeft(strings.TrimSpace(line), "-@+!:")
	var words []string
	for i := 0; i < len(line); {
		if line[i] == ' ' || line[i] == '\t' {
			i++
			continue
		}
		var w strings.Builder
		quoted := false
		for i < len(line) && line[i] != ' ' && line[i] != '\t' {
			c := line[i]
			switch {
			case c == '"' || c == '\'':
				quoted = true
				end := i + 1
				for ; end < len(line) && line[end] != c; end++ {
					if c == '"' && line[end] == '\\' {
						end++
					}
				}
				if end >= len(line) {
					return nil, errors.New("an unterminated quote")
				}
				for j := i + 1; j < end; j++ {
					if c == '"' && line[j] == '\\' {
						j++
						switch line[j] {
						case 't':
							w.WriteByte('\t')
						case 'n':
							w.WriteByte('\n')
						default:
							w.WriteByte(line[j])
						}
						continue
					}
					w.WriteByte(line[j])
				}
				i = end + 1
			case c == '\\' && i+1 < len(line):
				w.WriteByte(line[i+1])
				i += 2
			default:
				w.WriteByte(c)
				i++
			}
		}
		word := w.String()
		if !quoted {
			if name, ok := strings.CutPrefix(word, "$"); ok && validVar(name) {
				words = append(words, strings.Fields(env[name])...)
				continue
			}
		}
		if name, ok := strings.CutPrefix(word, "${"); ok && strings.HasSuffix(name, "}") && validVar(name[:len(name)-1]) {
			words = append(words, env[name[:len(name)-1]])
			continue
		}
		var plain strings.Builder
		for j := 0; j < len(word); j++ {
			if c := word[j]; c == '%' || c == '$' {
				if j+1 >= len(word) || word[j+1] != c {
					return nil, fmt.Errorf("word %q: a specifier or variable inside a word is not understood here", word)
				}
				j++
			}
			plain.WriteByte(word[j])
		}
		words = append(words, plain.String())
	}
	if len(words) == 0 || !strings.HasPrefix(words[0], "/") {
		return nil, fmt.Errorf("%q: want an absolute executable first", line)
	}
	return words, nil
}

func validVar(name string) bool {
	if name == "" || name[0] >= '0' && name[0] <= '9' {
		return false
	}
	return strings.Trim(name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_") == ""
}
