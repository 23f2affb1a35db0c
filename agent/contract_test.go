//go:build unix

package agent

import (
	"context"
	"encoding/json"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// argFields lists the JSON names of the arguments of struct type t, with
// the fields of arrays of objects as name[].field, and for each the JSON
// kind a value of it has; host, which addresses the call, is left out.
func argFields(t reflect.Type, prefix string, out map[string]reflect.Kind) {
	for _, f := range reflect.VisibleFields(t) {
		if f.Anonymous || !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if prefix == "" && name == "host" {
			continue
		}
		ft := f.Type
		for ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		out[prefix+name] = ft.Kind()
		if ft.Kind() == reflect.Slice && ft.Elem().Kind() == reflect.Struct {
			argFields(ft.Elem(), prefix+name+"[].", out)
		}
	}
}

// wrongValue is a JSON value that no field of kind k accepts.
func wrongValue(k reflect.Kind) string {
	switch k {
	case reflect.String:
		return `{"not": "a string"}`
	case reflect.Map, reflect.Struct:
		return `"not an object"`
	}
	return `"not a ` + k.String() + `"`
}

// TestToolboxServesTheContract: the tools the agent serves are exactly
// the per-host tools protocol declares, and each decodes its arguments
// into the declared type: it knows every declared argument by name (an
// unknown one is refused with the list of the declared ones) and checks
// its type (a wrongly typed value of each is refused, naming it). Nothing
// runs: every call is refused while its arguments are decoded.
func TestToolboxServesTheContract(t *testing.T) {
	tb := tbNew(t)
	var declared []string
	for _, spec := range protocol.HostTools() {
		declared = append(declared, spec.Name)
	}
	slices.Sort(declared)
	if served := slices.Sorted(maps.Keys(tb.tools())); !slices.Equal(served, declared) {
		t.Fatalf("the agent serves %v; protocol declares %v", served, declared)
	}
	ctx := context.Background()
	for _, spec := range protocol.HostTools() {
		fields := map[string]reflect.Kind{}
		argFields(spec.Args, "", fields)
		names := slices.Sorted(maps.Keys(fields))

		r, _ := tbCall(t, ctx, tb, spec.Name, json.RawMessage(`{"host": "h", "no_such_argument": 1}`))
		if r.Error == nil || r.Error.Code != protocol.CodeBadRequest {
			t.Errorf("%s with an unknown argument: %+v, want a bad request", spec.Name, r)
			continue
		}
		_, list, ok := strings.Cut(r.Error.Message, "the arguments are ")
		if got := strings.Split(list, ", "); !ok || !slices.Equal(slices.Sorted(slices.Values(got)), names) {
			t.Errorf("%s decodes the arguments %q; protocol declares %v", spec.Name, list, names)
		}
		for _, name := range names {
			args := `{"` + name + `": ` + wrongValue(fields[name]) + `}`
			path := name
			if outer, inner, nested := strings.Cut(name, "[]."); nested {
				args = `{"` + outer + `": [{"` + inner + `": ` + wrongValue(fields[name]) + `}]}`
				path = outer + "." + inner
			}
			r, _ := tbCall(t, ctx, tb, spec.Name, json.RawMessage(args))
			if r.Error == nil || !strings.Contains(r.Error.Message, `field "`+path+`" must be`) {
				t.Errorf("%s %s: %+v, want a refusal of the field's type", spec.Name, args, r)
			}
		}
	}
}
