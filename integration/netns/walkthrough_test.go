package netns

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"mvdan.cc/sh/v3/expand"
	"mvdan.cc/sh/v3/syntax"

	"github.com/fleetmcp/fleetmcp/integration"
)

// walkthroughHeading is the deploy README's fresh-machine walk-through,
// whose shell blocks TestWalkthroughNetNS runs.
const walkthroughHeading = "## A fleet from scratch, step by step"

// shBlock is a fenced ```sh block of a markdown section. Its first line
// is a comment saying where it runs ("# on the gateway machine"); Where
// is the rest of that comment, Text the lines after it.
type shBlock struct {
	Line  int // of the opening fence, from 1
	Where string
	Text  string
}

// markdownShBlocks returns the ```sh blocks of the section that starts
// with the line heading (a level-2 heading) and ends at the next heading
// of level 1 or 2 outside a fence. Each block must begin with a comment
// "# on ..." naming where it runs.
func markdownShBlocks(md, heading string) ([]shBlock, error) {
	var (
		blocks            []shBlock
		in, found         bool
		fence             bool // inside a fence of any language
		cur               *shBlock
		lines             []string
		fenceLine, lineNo int
	)
	sc := bufio.NewScanner(strings.NewReader(md))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		lineNo++
		line := strings.TrimRight(sc.Text(), " \t\r")
		if fence {
			if strings.TrimSpace(line) == "```" {
				fence = false
				if cur != nil {
					if len(lines) == 0 || !strings.HasPrefix(lines[0], "# on ") || strings.TrimSpace(strings.TrimPrefix(lines[0], "# on ")) == "" {
						return nil, fmt.Errorf("line %d: the sh block does not start with a comment saying where it runs (\"# on the gateway machine\")", fenceLine)
					}
					cur.Where = strings.TrimSpace(strings.TrimPrefix(lines[0], "# on "))
					cur.Text = strings.Join(lines[1:], "\n")
					if strings.TrimSpace(cur.Text) == "" {
						return nil, fmt.Errorf("line %d: the sh block has no command", fenceLine)
					}
					blocks = append(blocks, *cur)
					cur, lines = nil, nil
				}
				continue
			}
			if cur != nil {
				lines = append(lines, line)
			}
			continue
		}
		if strings.HasPrefix(line, "```") {
			fence, fenceLine = true, lineNo
			if in && strings.TrimSpace(strings.TrimPrefix(line, "```")) == "sh" {
				cur = &shBlock{Line: lineNo}
			}
			continue
		}
		if line == heading {
			if found {
				return nil, fmt.Errorf("line %d: a second section %q", lineNo, heading)
			}
			found, in = true, true
			continue
		}
		if in && (strings.HasPrefix(line, "# ") || strings.HasPrefix(line, "## ")) {
			in = false
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	switch {
	case fence:
		return nil, fmt.Errorf("line %d: the fence is never closed", fenceLine)
	case !found:
		return nil, fmt.Errorf("no section %q", heading)
	case len(blocks) == 0:
		return nil, fmt.Errorf("section %q has no sh blocks", heading)
	}
	return blocks, nil
}

// shCommand is one simple command of a shell block: its source text and
// its words as the shell would pass them (variables expand to nothing).
type shCommand struct {
	Text string
	Args []string
}

// shCommands splits a block's text into its commands. Only simple
// commands are taken (no pipelines, lists or redirections), so that each
// can be run, and its program told, on its own.
func shCommands(text string) ([]shCommand, error) {
	f, err := syntax.NewParser().Parse(strings.NewReader(text), "")
	if err != nil {
		return nil, err
	}
	var cmds []shCommand
	for _, st := range f.Stmts {
		call, ok := st.Cmd.(*syntax.CallExpr)
		if !ok || len(st.Redirs) > 0 || st.Negated || st.Background || len(call.Args) == 0 || len(call.Assigns) > 0 {
			return nil, fmt.Errorf("line %d: not a simple command: %s", st.Pos().Line(), text[st.Pos().Offset():st.End().Offset()])
		}
		var args []string
		for _, w := range call.Args {
			s, err := expand.Literal(nil, w)
			if err != nil {
				return nil, fmt.Errorf("line %d: %v", w.Pos().Line(), err)
			}
			args = append(args, s)
		}
		cmds = append(cmds, shCommand{Text: text[st.Pos().Offset():st.End().Offset()], Args: args})
	}
	if len(cmds) == 0 {
		return nil, errors.New("no command")
	}
	return cmds, nil
}

// readWalkthrough returns the walk-through's blocks from deploy/README.md.
func readWalkthrough(t testing.TB) []shBlock {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(integration.ModuleRoot(t), "deploy", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	blocks, err := markdownShBlocks(string(data), walkthroughHeading)
	if err != nil {
		t.Fatalf("deploy/README.md: %v", err)
	}
	return blocks
}

// TestWalkthroughDoc: every block of the walk-through says where it runs,
// on the gateway machine or on each host, and is simple commands of the
// programs a newcomer has (the parts TestWalkthroughNetNS needs to run it
// anywhere namespaces can be made).
func TestWalkthroughDoc(t *testing.T) {
	known := map[string]bool{"fleet-gateway": true, "fleetctl": true, "fleet-agent": true, "mkdir": true, "curl": true}
	for _, b := range readWalkthrough(t) {
		if !strings.HasPrefix(b.Where, "the gateway machine") && !strings.HasPrefix(b.Where, "each host") {
			t.Errorf("deploy/README.md:%d: a block runs %q: want on the gateway machine or on each host", b.Line, b.Where)
		}
		cmds, err := shCommands(b.Text)
		if err != nil {
			t.Errorf("deploy/README.md:%d: %v", b.Line, err)
			continue
		}
		for _, c := range cmds {
			if !known[c.Args[0]] {
				t.Errorf("deploy/README.md:%d: %s: the walk-through's test does not know how to run %s", b.Line, c.Text, c.Args[0])
			}
		}
	}
}

func TestMarkdownShBlocks(t *testing.T) {
	md := "# t\n## A\n```sh\n# on x\nls\n```\n## B\n```sh\n# on y\nrm\n```\n"
	got, err := markdownShBlocks(md, "## A")
	if err != nil || len(got) != 1 || got[0].Where != "x" || got[0].Text != "ls" || got[0].Line != 3 {
		t.Errorf("got %+v, %v", got, err)
	}
	// A comment inside a fence is no heading.
	md = "## A\n```sh\n# on x\n# not a heading\nls\n```\n```sh\n# on y\npwd\n```\n"
	if got, err := markdownShBlocks(md, "## A"); err != nil || len(got) != 2 || got[1].Text != "pwd" {
		t.Errorf("got %+v, %v", got, err)
	}
	for _, bad := range []string{
		"## A\n```sh\nls\n```\n",             // no "# on"
		"## A\n```sh\n# on x\n```\n",         // no command
		"## A\n```sh\n# on x\nls\n",          // never closed
		"## B\n```sh\n# on x\nls\n```\n",     // no section
		"## A\ntext\n",                       // no blocks
		"## A\n```sh\n# on \nls\n```\n",      // on nowhere
		"## A\n## A\n```sh\n# on x\nls\n```", // twice
	} {
		if got, err := markdownShBlocks(bad, "## A"); err == nil {
			t.Errorf("%q: no error, got %+v", bad, got)
		}
	}
	if _, err := shCommands("a | b"); err == nil {
		t.Error("a pipeline is taken as a simple command")
	}
	if c, err := shCommands("fleetctl token create \\\n    --name_pattern 'web-*' # note\nls"); err != nil || len(c) != 2 || strings.Join(c[0].Args, " ") != "fleetctl token create --name_pattern web-*" {
		t.Errorf("got %+v, %v", c, err)
	}
}

func FuzzMarkdownShBlocks(f *testing.F) {
	if data, err := os.ReadFile(filepath.Join(integration.ModuleRoot(f), "deploy", "README.md")); err == nil {
		f.Add(string(data))
	}
	f.Add("## A\n```sh\n# on x\nls\n```\n")
	f.Add("## A\n```sh\n# on x\n```yaml\n```\n```\n")
	f.Fuzz(func(t *testing.T, md string) {
		blocks, err := markdownShBlocks(md, "## A fleet from scratch, step by step")
		if err != nil {
			return
		}
		lines := strings.Split(md, "\n")
		for _, b := range blocks {
			if b.Line < 1 || b.Line > len(lines) || b.Where == "" || strings.TrimSpace(b.Text) == "" {
				t.Fatalf("bad block %+v", b)
			}
			if !strings.Contains(md, b.Where) {
				t.Fatalf("where %q is not in the input", b.Where)
			}
			for _, l := range strings.Split(b.Text, "\n") {
				if !strings.Contains(md, l) {
					t.Fatalf("line %q is not in the input", l)
				}
			}
			_, _ = shCommands(b.Text)
		}
	})
}
