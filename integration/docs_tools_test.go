package integration

import (
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// toolRow is a row of agent/README.md's tool table: | `name` | args | ...
var toolRow = regexp.MustCompile("^\\| `([a-z0-9_]+)` \\| ([^|]*) \\|")

// docArg is one argument as the table writes it: `name` or `name`? (or
// `name: [...]`).
var docArg = regexp.MustCompile("`([a-z0-9_]+)(?::[^`]*)?`(\\?)?")

// TestToolTableMatchesTheContract: the tool table a user reads in
// agent/README.md names every per-host tool, and for each exactly the
// arguments the declaration has, the optional ones marked with ? — the
// table is read against protocol.HostTools, so a new or renamed argument
// cannot leave the docs behind.
func TestToolTableMatchesTheContract(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(moduleRoot(t), "agent", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]map[string]bool{} // tool -> argument -> optional
	for _, line := range strings.Split(string(data), "\n") {
		m := toolRow.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		args := map[string]bool{}
		for _, a := range docArg.FindAllStringSubmatch(m[2], -1) {
			args[a[1]] = a[2] == "?"
		}
		documented[m[1]] = args
	}
	for _, spec := range protocol.HostTools() {
		doc, ok := documented[spec.Name]
		if !ok {
			t.Errorf("agent/README.md's tool table has no row for %s", spec.Name)
			continue
		}
		want := map[string]bool{}
		jsonFields(spec.Args, want)
		for name, optional := range want {
			switch got, ok := doc[name]; {
			case !ok:
				t.Errorf("%s: the table leaves out the argument %s", spec.Name, name)
			case got != optional:
				t.Errorf("%s: the table marks %s optional=%v; the declaration says %v", spec.Name, name, got, optional)
			}
		}
		for name := range doc {
			if _, ok := want[name]; !ok {
				t.Errorf("%s: the table names an argument %s the tool does not take (it takes %v)", spec.Name, name, slices.Sorted(maps.Keys(want)))
			}
		}
	}
}

// jsonFields adds the JSON names of t's fields (those of embedded
// structs too) to out, each with whether it may be left out.
func jsonFields(t reflect.Type, out map[string]bool) {
	for i := range t.NumField() {
		f := t.Field(i)
		if f.Anonymous && f.Type.Kind() == reflect.Struct {
			jsonFields(f.Type, out)
			continue
		}
		tag := f.Tag.Get("json")
		name, opts, _ := strings.Cut(tag, ",")
		if name == "" || name == "-" {
			continue
		}
		out[name] = strings.Contains(opts, "omitempty") || strings.Contains(opts, "omitzero")
	}
}
