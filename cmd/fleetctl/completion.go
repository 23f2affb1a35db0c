package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"
)

// The completion scripts are made from the command table, so they know
// every command and flag this fleetctl has.

// topFlagNames are the own flags of the commands outside the groups.
var topFlagNames = map[string][]string{
	"doctor":     {"mcp_url"},
	"login":      {"no_check", "token_file"},
	"audit":      {"caller", "host", "tool", "decision", "since", "until", "receipt", "limit"},
	"help":       nil,
	"completion": nil,
}

// completionModel is what the scripts complete: the first words, each
// group's commands, and each command's flags (with whether each takes a
// value).
type completionModel struct {
	first  []string
	groups map[string][]string
	// flags of "group cmd" or of a top command, as --name.
	flags map[string][]string
	// valued are the flags that take a value, as --name.
	valued []string
}

func (c *cli) completionModel() *completionModel {
	m := &completionModel{groups: map[string][]string{}, flags: map[string][]string{}}
	valued := map[string]bool{}
	addFlags := func(key string, fs *flag.FlagSet, keep func(string) bool) {
		fs.VisitAll(func(f *flag.Flag) {
			if !keep(f.Name) {
				return
			}
			m.flags[key] = append(m.flags[key], "--"+f.Name)
			if b, ok := f.Value.(interface{ IsBoolFlag() bool }); !ok || !b.IsBoolFlag() {
				valued["--"+f.Name] = true
			}
		})
	}
	global := flag.NewFlagSet("", flag.ContinueOnError)
	c.g.register(global)
	for _, cmd := range commands {
		if _, ok := m.groups[cmd.group]; !ok {
			m.first = append(m.first, cmd.group)
		}
		m.groups[cmd.group] = append(m.groups[cmd.group], cmd.name)
		fs := flag.NewFlagSet("", flag.ContinueOnError)
		c.g.register(fs)
		cmd.flags(fs)
		addFlags(cmd.path(), fs, func(string) bool { return true })
	}
	for name, own := range topFlagNames {
		m.first = append(m.first, name)
		addFlags(name, global, func(string) bool { return true })
		for _, f := range own {
			m.flags[name] = append(m.flags[name], "--"+f)
			if f != "no_check" {
				valued["--"+f] = true
			}
		}
	}
	addFlags("", global, func(string) bool { return true })
	m.flags[""] = append(m.flags[""], "--version")
	sort.Strings(m.first)
	for v := range valued {
		m.valued = append(m.valued, v)
	}
	sort.Strings(m.valued)
	return m
}

// runCompletion prints the completion script for a shell.
func (c *cli) runCompletion(_ context.Context, args []string) error {
	if len(args) == 1 && (args[0] == "-h" || args[0] == "--help") {
		fmt.Fprint(c.stderr, completionHelp)
		return flag.ErrHelp
	}
	if len(args) != 1 {
		fmt.Fprint(c.stderr, completionHelp)
		return usagef("completion takes one shell: bash, zsh or fish")
	}
	m := c.completionModel()
	switch args[0] {
	case "bash":
		m.bash(c.stdout, false)
	case "zsh":
		m.bash(c.stdout, true)
	case "fish":
		m.fish(c.stdout)
	default:
		return usagef("completion %q: fleetctl completes in bash, zsh or fish", args[0])
	}
	return nil
}

const completionHelp = `Usage: fleetctl completion bash|zsh|fish

print the shell completion script for fleetctl's commands and flags:
  bash: source <(fleetctl completion bash)          (in ~/.bashrc)
  zsh:  source <(fleetctl completion zsh)           (in ~/.zshrc)
  fish: fleetctl completion fish > ~/.config/fish/completions/fleetctl.fish
`

// bash writes the bash script; zsh runs the same through bashcompinit.
func (m *completionModel) bash(w io.Writer, zsh bool) {
	if zsh {
		fmt.Fprint(w, "#compdef fleetctl\n# zsh completion for fleetctl: source <(fleetctl completion zsh)\nautoload -U +X bashcompinit && bashcompinit\n")
	} else {
		fmt.Fprint(w, "# bash completion for fleetctl: source <(fleetctl completion bash)\n")
	}
	fmt.Fprintf(w, `_fleetctl() {
    local cur="${COMP_WORDS[COMP_CWORD]}" prev="" word group="" sub="" i skip=0
    for ((i = 1; i < COMP_CWORD; i++)); do
        word="${COMP_WORDS[i]}"
        if ((skip)); then skip=0; continue; fi
        case "$word" in
            %s) skip=1; continue ;;
            -*) continue ;;
        esac
        if [[ -z "$group" ]]; then group="$word"; elif [[ -z "$sub" ]]; then sub="$word"; fi
    done
    ((COMP_CWORD > 1)) && prev="${COMP_WORDS[COMP_CWORD-1]}"
    case "$prev" in
        %s) return 0 ;;
    esac
    local words=""
    case "$group" in
        "") words=%q ;;
`, strings.Join(m.valued, "|"), strings.Join(m.valued, "|"), strings.Join(append(append([]string{}, m.first...), m.flags[""]...), " "))
	groups := sortedKeys(m.groups)
	for _, g := range groups {
		fmt.Fprintf(w, "        %s)\n            case \"$sub\" in\n                \"\") words=%q ;;\n", g, strings.Join(m.groups[g], " "))
		for _, s := range m.groups[g] {
			fmt.Fprintf(w, "                %s) words=%q ;;\n", s, strings.Join(m.flags[g+" "+s], " "))
		}
		fmt.Fprint(w, "            esac ;;\n")
	}
	for _, t := range sortedKeys(topFlagNames) {
		words := strings.Join(m.flags[t], " ")
		switch t {
		case "help":
			words = strings.Join(m.first, " ")
		case "completion":
			words = "bash zsh fish"
		}
		fmt.Fprintf(w, "        %s) words=%q ;;\n", t, words)
	}
	fmt.Fprint(w, `    esac
    COMPREPLY=($(compgen -W "$words" -- "$cur"))
}
complete -F _fleetctl fleetctl
`)
}

// fish writes the fish script.
func (m *completionModel) fish(w io.Writer) {
	fmt.Fprint(w, "# fish completion for fleetctl: fleetctl completion fish > ~/.config/fish/completions/fleetctl.fish\ncomplete -c fleetctl -f\n")
	fmt.Fprintf(w, "complete -c fleetctl -n '__fish_use_subcommand' -a '%s'\n", strings.Join(m.first, " "))
	for _, g := range sortedKeys(m.groups) {
		subs := strings.Join(m.groups[g], " ")
		fmt.Fprintf(w, "complete -c fleetctl -n '__fish_seen_subcommand_from %s; and not __fish_seen_subcommand_from %s' -a '%s'\n", g, subs, subs)
		for _, s := range m.groups[g] {
			m.fishFlags(w, fmt.Sprintf("__fish_seen_subcommand_from %s; and __fish_seen_subcommand_from %s", g, s), m.flags[g+" "+s])
		}
	}
	for _, t := range sortedKeys(topFlagNames) {
		m.fishFlags(w, "__fish_seen_subcommand_from "+t, m.flags[t])
	}
	fmt.Fprint(w, "complete -c fleetctl -n '__fish_seen_subcommand_from completion' -a 'bash zsh fish'\n")
}

func (m *completionModel) fishFlags(w io.Writer, cond string, flags []string) {
	for _, f := range flags {
		req := ""
		if i := sort.SearchStrings(m.valued, f); i < len(m.valued) && m.valued[i] == f {
			req = " -r"
		}
		fmt.Fprintf(w, "complete -c fleetctl -n '%s' -l %s%s\n", cond, strings.TrimPrefix(f, "--"), req)
	}
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
