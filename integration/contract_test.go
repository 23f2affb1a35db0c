package integration

import (
	"context"
	"encoding/json"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// jsonType is the JSON schema type of a Go argument field, as a model must
// send it (a pointer is the same type, given or not; a json.RawMessage is
// any value: "").
func jsonType(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch {
	case t == reflect.TypeFor[json.RawMessage]():
		return ""
	case t.Kind() == reflect.String:
		return "string"
	case t.Kind() == reflect.Bool:
		return "boolean"
	case t.Kind() >= reflect.Int && t.Kind() <= reflect.Uint64:
		return "integer"
	case t.Kind() == reflect.Float32 || t.Kind() == reflect.Float64:
		return "number"
	case t.Kind() == reflect.Slice:
		return "array"
	}
	return "object"
}

// checkSchema compares a published object schema with the struct type
// that declares it: the same properties, each with the declared type and
// description (limits written in), required exactly when the json tag
// has no omitempty, nothing else allowed.
func checkSchema(t *testing.T, where string, published map[string]any, typ reflect.Type) {
	t.Helper()
	if published["type"] != "object" {
		t.Errorf("%s: schema type %v, want object", where, published["type"])
	}
	if published["additionalProperties"] != false {
		t.Errorf("%s: additionalProperties %v, want false: undeclared arguments must be refused", where, published["additionalProperties"])
	}
	props, _ := published["properties"].(map[string]any)
	var names, required []string
	for _, f := range reflect.VisibleFields(typ) {
		if f.Anonymous || !f.IsExported() {
			continue
		}
		name, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
		names = append(names, name)
		if !strings.Contains(opts, "omitempty") {
			required = append(required, name)
		}
		p, _ := props[name].(map[string]any)
		if p == nil {
			t.Errorf("%s: argument %s is declared but not published", where, name)
			continue
		}
		if want := jsonType(f.Type); p["type"] != nil && p["type"] != want || p["type"] == nil && want != "" {
			t.Errorf("%s: argument %s has type %v, declared %q", where, name, p["type"], want)
		}
		if want := protocol.Describe(f.Tag.Get("jsonschema")); p["description"] != want {
			t.Errorf("%s: argument %s is described\n%q; declared\n%q", where, name, p["description"], want)
		}
		if f.Type.Kind() == reflect.Slice && f.Type.Elem().Kind() == reflect.Struct {
			items, _ := p["items"].(map[string]any)
			checkSchema(t, where+"."+name+"[]", items, f.Type.Elem())
		}
	}
	if got := slices.Sorted(maps.Keys(props)); !slices.Equal(got, slices.Sorted(slices.Values(names))) {
		t.Errorf("%s: published arguments %v, declared %v", where, got, names)
	}
	var gotReq []string
	for _, r := range published["required"].([]any) {
		gotReq = append(gotReq, r.(string))
	}
	if !slices.Equal(slices.Sorted(slices.Values(gotReq)), slices.Sorted(slices.Values(required))) {
		t.Errorf("%s: required %v, declared %v", where, gotReq, required)
	}
}

// TestPublishedToolsMatchTheContract: what a real MCP client lists is
// what protocol declares for every per-host tool — name, description,
// hints and each argument's name, type, description and whether it is
// required — and the host's agent serves exactly these tools.
func TestPublishedToolsMatchTheContract(t *testing.T) {
	env := NewEnv(t, Options{Agents: []string{"alpha"}})
	cs := env.Client("", nil)
	res, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]*mcp.Tool{}
	for _, tool := range res.Tools {
		listed[tool.Name] = tool
	}
	var names []string
	for _, spec := range protocol.HostTools() {
		names = append(names, spec.Name)
		tool := listed[spec.Name]
		if tool == nil {
			t.Errorf("%s is declared but not listed", spec.Name)
			continue
		}
		if tool.Description != spec.Description {
			t.Errorf("%s: listed description\n%q; declared\n%q", spec.Name, tool.Description, spec.Description)
		}
		a := tool.Annotations
		if ro := a != nil && a.ReadOnlyHint; ro != spec.ReadOnly {
			t.Errorf("%s: read-only hint %v, declared %v", spec.Name, ro, spec.ReadOnly)
		}
		if d := a != nil && a.DestructiveHint != nil && *a.DestructiveHint; d != spec.Destructive {
			t.Errorf("%s: destructive hint %v, declared %v", spec.Name, d, spec.Destructive)
		}
		raw, err := json.Marshal(tool.InputSchema)
		if err != nil {
			t.Fatal(err)
		}
		var schema map[string]any
		if err := json.Unmarshal(raw, &schema); err != nil {
			t.Fatal(err)
		}
		checkSchema(t, spec.Name, schema, spec.Args)
	}
	hosts := structured(t, call(t, cs, "hosts", nil))["hosts"].([]any)
	if len(hosts) != 1 {
		t.Fatalf("hosts: %v", hosts)
	}
	var served []string
	for _, n := range hosts[0].(map[string]any)["tools"].([]any) {
		served = append(served, n.(string))
	}
	if !slices.Equal(slices.Sorted(slices.Values(served)), slices.Sorted(slices.Values(names))) {
		t.Errorf("alpha serves %v; protocol declares %v", served, names)
	}
	// The published schema is enforced: an undeclared argument never
	// travels.
	mustErr(t, call(t, cs, protocol.ToolRead, map[string]any{"host": "alpha", "path": "x", "no_such_argument": 1}), "no_such_argument")
}
