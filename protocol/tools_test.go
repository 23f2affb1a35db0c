package protocol

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

// declaredField is one argument of a tool as its declaration gives it.
type declaredField struct {
	name, kind, desc string
	required         bool
	sub              []declaredField // the fields of the objects of an array
}

// declaredFields reads the arguments of struct type t from its tags the
// way a JSON schema of it reads them: promoted fields of embedded
// structs, the json name, required unless omitempty, the jsonschema tag
// with its limits written in.
func declaredFields(t *testing.T, typ reflect.Type) []declaredField {
	t.Helper()
	var out []declaredField
	for _, f := range reflect.VisibleFields(typ) {
		if f.Anonymous || !f.IsExported() {
			continue
		}
		tag, ok := f.Tag.Lookup("json")
		name, opts, _ := strings.Cut(tag, ",")
		if !ok || name == "" || name == "-" {
			t.Errorf("%s.%s has no json name", typ, f.Name)
			continue
		}
		desc, ok := f.Tag.Lookup("jsonschema")
		if !ok || desc == "" {
			t.Errorf("%s.%s (%s) has no jsonschema description: a model reads it", typ, f.Name, name)
		}
		d := declaredField{name: name, kind: kindOf(f.Type), desc: Describe(desc), required: !slices.Contains(strings.Split(opts, ","), "omitempty")}
		if et := f.Type; et.Kind() == reflect.Slice && et.Elem().Kind() == reflect.Struct {
			d.sub = declaredFields(t, et.Elem())
		}
		out = append(out, d)
	}
	return out
}

func kindOf(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch {
	case t == reflect.TypeFor[[]byte]() || t.Name() == "RawMessage":
		return "any"
	case t.Kind() == reflect.String:
		return "string"
	case t.Kind() == reflect.Bool:
		return "boolean"
	case t.Kind() >= reflect.Int && t.Kind() <= reflect.Uint64:
		return "integer"
	case t.Kind() == reflect.Float32 || t.Kind() == reflect.Float64:
		return "number"
	case t.Kind() == reflect.Slice:
		return "array of " + kindOf(t.Elem())
	case t.Kind() == reflect.Map:
		return "object of " + kindOf(t.Elem())
	case t.Kind() == reflect.Struct:
		return "object"
	}
	return t.Kind().String()
}

// TestHostToolsDeclared: every per-host tool is declared completely — a
// unique name, an argument struct that starts with OnHost, a json name and
// a description for every argument — and no description names a limit
// that does not exist.
func TestHostToolsDeclared(t *testing.T) {
	seen := map[string]bool{}
	for _, spec := range HostTools() {
		if spec.Name == "" || seen[spec.Name] {
			t.Errorf("tool name %q is empty or declared twice", spec.Name)
		}
		seen[spec.Name] = true
		if strings.Contains(spec.Description, "{{") || strings.Contains(spec.Description, "}}") || len(spec.Description) < 40 {
			t.Errorf("%s: description %q is unexpanded or too short to help a model", spec.Name, spec.Description)
		}
		if spec.Args == nil || spec.Args.Kind() != reflect.Struct || spec.Args.NumField() == 0 || spec.Args.Field(0).Type != reflect.TypeFor[OnHost]() {
			t.Errorf("%s: arguments %v do not start with OnHost", spec.Name, spec.Args)
			continue
		}
		names := map[string]bool{}
		for _, f := range declaredFields(t, spec.Args) {
			if names[f.name] {
				t.Errorf("%s: argument %s declared twice", spec.Name, f.name)
			}
			names[f.name] = true
		}
		if !names["host"] {
			t.Errorf("%s: no host argument", spec.Name)
		}
		if got, ok := HostTool(spec.Name); !ok || got.Name != spec.Name {
			t.Errorf("HostTool(%q) does not find it", spec.Name)
		}
		if spec.ComesWith != "" && !slices.Contains(GrantedTools(), spec.ComesWith) {
			t.Errorf("%s comes with %s, which is not a granted tool", spec.Name, spec.ComesWith)
		}
	}
	if _, ok := HostTool("hosts"); ok {
		t.Error("HostTool finds hosts, a gateway tool")
	}
	if got, want := len(GrantedTools())+len(TaskTools()), len(HostTools()); got != want {
		t.Errorf("granted %v and task tools %v are not all %d tools", GrantedTools(), TaskTools(), want)
	}
}

// TestHostToolsGolden: the contract as a model and an agent see it, tool
// by tool. A change shows up here in review; arguments may be added
// (optional ones, for older agents), never renamed or retyped without a
// version bump.
func TestHostToolsGolden(t *testing.T) {
	var b strings.Builder
	var write func(prefix string, fs []declaredField)
	write = func(prefix string, fs []declaredField) {
		for _, f := range fs {
			req := "optional"
			if f.required {
				req = "required"
			}
			fmt.Fprintf(&b, "  %s%s (%s, %s): %s\n", prefix, f.name, f.kind, req, f.desc)
			write(prefix+f.name+"[].", f.sub)
		}
	}
	for _, spec := range HostTools() {
		var flags []string
		if spec.ReadOnly {
			flags = append(flags, "read-only")
		}
		if spec.Destructive {
			flags = append(flags, "destructive")
		}
		if spec.ComesWith != "" {
			flags = append(flags, "comes with "+spec.ComesWith)
		}
		fmt.Fprintf(&b, "%s [%s]\n  %s\n", spec.Name, strings.Join(flags, ", "), spec.Description)
		write("", declaredFields(t, spec.Args))
		b.WriteString("\n")
	}
	golden(t, "tools.golden", []byte(b.String()))
}

func TestDescribe(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"no limits", "no limits"},
		{"{{output_lines}} lines or {{output_bytes}}", fmt.Sprintf("%d lines or %dKB", MaxOutputLines, MaxOutputBytes>>10)},
		{"kept {{spill_age}}; {{task_timeout}} to {{task_max_timeout}}", "kept 7 days; 1 h to 24 h"},
		{"{ not a name } and {\"json\": 1}", "{ not a name } and {\"json\": 1}"},
	} {
		if got := Describe(tc.in); got != tc.want {
			t.Errorf("Describe(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
	for _, bad := range []string{"{{no_such_limit}}", "open {{output_lines"} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("Describe(%q) did not panic", bad)
				}
			}()
			Describe(bad)
		}()
	}
}

func TestSizeAndDurationText(t *testing.T) {
	for n, want := range map[int64]string{100 << 20: "100 MiB", 1 << 30: "1 GiB", 4 << 10: "4 KiB", 1536: "1536 bytes", 3 << 29: "1536 MiB", 10: "10 bytes"} {
		if got := SizeText(n); got != want {
			t.Errorf("SizeText(%d) = %q, want %q", n, got, want)
		}
	}
	for d, want := range map[time.Duration]string{24 * time.Hour: "24 h", 48 * time.Hour: "2 days", 30 * 24 * time.Hour: "30 days", time.Hour: "1 h", 36 * time.Hour: "36 h",
		20 * time.Second: "20 s", 90 * time.Minute: "90 min", 1500 * time.Millisecond: "1.5 s"} {
		if got := DurationText(d); got != want {
			t.Errorf("DurationText(%v) = %q, want %q", d, got, want)
		}
	}
}

// TestHostToolsCopies: what HostTools and GrantedTools return is the
// caller's own; changing it changes nothing for the next caller.
func TestHostToolsCopies(t *testing.T) {
	tools := HostTools()
	tools[0].Name = "changed"
	names := GrantedTools()
	names[0] = "changed"
	if HostTools()[0].Name == "changed" || GrantedTools()[0] == "changed" {
		t.Fatal("a caller's change reached the declarations")
	}
	if _, ok := HostTool(ToolRead); !ok {
		t.Fatal("HostTool(read) not found")
	}
	if _, ok := HostTool("changed"); ok {
		t.Fatal("HostTool found a tool no declaration names")
	}
}

// BenchmarkHostTool is the lookup the gateway makes for every call, and
// for every host of a fan-out.
func BenchmarkHostTool(b *testing.B) {
	for b.Loop() {
		if _, ok := HostTool(ToolBash); !ok {
			b.Fatal("no bash")
		}
	}
}

// The gateway's own tools are named apart from the per-host ones, and
// each fan-out tool runs a per-host tool that access rules grant.
func TestGatewayToolNames(t *testing.T) {
	own := append([]string{ToolHosts, ToolFleetBash, ToolFleetRead}, AdminTools()...)
	for _, name := range own {
		if _, ok := HostTool(name); ok {
			t.Errorf("%s is both a gateway tool and a per-host tool", name)
		}
	}
	for _, name := range []string{ToolFleetBash, ToolFleetRead} {
		if base := FanoutBase(name); !slices.Contains(GrantedTools(), base) {
			t.Errorf("%s runs %q, not a granted per-host tool", name, base)
		}
	}
	if FanoutBase(ToolBash) != "" || FanoutBase(ToolHosts) != "" || !IsAdminTool(ToolAudit) || IsAdminTool(ToolHosts) || IsAdminTool(ToolBash) {
		t.Error("FanoutBase or IsAdminTool misclassifies a tool")
	}
}
