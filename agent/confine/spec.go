package confine

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Flag, as its first argument, makes the agent's executable the helper
// that confines one command: PROGRAM Flag SPEC COMMAND [ARGS...], SPEC a
// Spec in JSON (see Run).
const Flag = "--fleet-confine"

// maxSpec bounds a Spec's JSON: a few hundred paths.
const maxSpec = 256 << 10

// Spec is what the helper keeps a command from, and with which kernel
// mechanism.
type Spec struct {
	Paths
	// ABI is the Landlock ABI the agent found: the helper handles the
	// rights of that version, and refuses to run the command when the
	// kernel offers less.
	ABI int `json:"abi"`
}

// specJSON is Spec on the command line.
type specJSON struct {
	Protected []string `json:"protected"`
	ReadOnly  []string `json:"read_only,omitempty"`
	ReadFiles []string `json:"read_files,omitempty"`
	ABI       int      `json:"abi"`
}

// Encode returns s as the helper takes it.
func (s Spec) Encode() (string, error) {
	data, err := json.Marshal(specJSON{Protected: s.Protected, ReadOnly: s.ReadOnly, ReadFiles: s.ReadFiles, ABI: s.ABI})
	if err != nil {
		return "", fmt.Errorf("confine: encode: %w", err)
	}
	return string(data), nil
}

// ParseSpec parses the helper's SPEC argument.
func ParseSpec(text string) (Spec, error) {
	if len(text) > maxSpec {
		return Spec{}, fmt.Errorf("confine: spec of %d bytes, more than %d", len(text), maxSpec)
	}
	dec := json.NewDecoder(strings.NewReader(text))
	dec.DisallowUnknownFields()
	var j specJSON
	if err := dec.Decode(&j); err != nil {
		return Spec{}, fmt.Errorf("confine: spec is not the JSON object the agent writes: %w", err)
	}
	if dec.More() {
		return Spec{}, errors.New("confine: spec has data after its JSON object")
	}
	if j.ABI < 1 {
		return Spec{}, fmt.Errorf("confine: spec names Landlock ABI %d; the helper runs only when the agent found ABI 1 or later", j.ABI)
	}
	if len(j.Protected) == 0 {
		return Spec{}, errors.New("confine: spec protects no path; it must name the agent's state directory")
	}
	for _, p := range slices.Concat(j.Protected, j.ReadOnly, j.ReadFiles) {
		if !filepath.IsAbs(p) || strings.ContainsRune(p, 0) {
			return Spec{}, fmt.Errorf("confine: spec path %q is not an absolute path", p)
		}
	}
	return Spec{Paths: Paths{Protected: j.Protected, ReadOnly: j.ReadOnly, ReadFiles: j.ReadFiles}, ABI: j.ABI}, nil
}

// Command returns argv run through the helper exe under s.
func (s Spec) Command(exe string, argv []string) ([]string, error) {
	spec, err := s.Encode()
	if err != nil {
		return nil, err
	}
	return append([]string{exe, Flag, spec}, argv...), nil
}

// Run runs the helper when args, a program's arguments with its name
// first (os.Args), ask for it, and reports whether they did. Every
// program the agent names as its helper calls it first thing in main:
//
//	if code, ok := confine.Run(os.Args); ok {
//		os.Exit(code)
//	}
//
// The helper restricts itself as the spec says and replaces itself with
// the command; it returns only when it could not, having said why on
// standard error, with exit status 126: a command is never run
// unconfined by the helper.
func Run(args []string) (int, bool) {
	if len(args) < 2 || args[1] != Flag {
		return 0, false
	}
	if len(args) < 4 {
		fmt.Fprintln(os.Stderr, "fleet-agent confine: usage: PROGRAM "+Flag+" SPEC COMMAND [ARGS...]")
		return 126, true
	}
	err := confineAndExec(args[2], args[3:], os.Environ())
	fmt.Fprintf(os.Stderr, "fleet-agent: the command was not run: %v\n", err)
	return 126, true
}

// confineAndExec restricts the process as spec says and execs argv.
func confineAndExec(spec string, argv, env []string) error {
	s, err := ParseSpec(spec)
	if err != nil {
		return err
	}
	rules, err := Plan(s.Paths)
	if err != nil {
		return err
	}
	if err := restrict(rules, s.ABI); err != nil {
		return fmt.Errorf("confine the command: %w", err)
	}
	return execve(argv, env)
}
