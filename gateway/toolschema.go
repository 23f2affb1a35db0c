package gateway

import (
	"encoding/json"
	"fmt"
	"reflect"
	"slices"

	"github.com/google/jsonschema-go/jsonschema"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// inputSchema derives a tool's input schema from its arguments type t as
// mcp.AddTool would (jsonschema-go: names from the json tags, descriptions
// from the jsonschema tags, fields without omitempty required, no other
// properties allowed), with three differences: a json.RawMessage is any
// JSON value, the types of optional fields do not offer null (null and
// leaving a field out mean the same), and the {{limits}} named in
// descriptions are written in (protocol.Describe).
func inputSchema(t reflect.Type) (*jsonschema.Schema, error) {
	s, err := jsonschema.ForType(t, &jsonschema.ForOptions{
		TypeSchemas: map[reflect.Type]*jsonschema.Schema{reflect.TypeFor[json.RawMessage](): {}},
	})
	if err != nil {
		return nil, fmt.Errorf("input schema of %s: %w", t, err)
	}
	if s.Type != "object" {
		return nil, fmt.Errorf("input schema of %s: the arguments must be an object, not %q", t, s.Type)
	}
	tidySchema(s)
	return s, nil
}

// tidySchema drops null from s's types and writes the limits into its
// description, and into those of what it contains.
func tidySchema(s *jsonschema.Schema) {
	if s == nil {
		return
	}
	if len(s.Types) == 2 && slices.Contains(s.Types, "null") {
		s.Type = s.Types[0]
		if s.Type == "null" {
			s.Type = s.Types[1]
		}
		s.Types = nil
	}
	s.Description = protocol.Describe(s.Description)
	for _, p := range s.Properties {
		tidySchema(p)
	}
	tidySchema(s.Items)
	tidySchema(s.AdditionalProperties)
}

// mustInputSchema is inputSchema of In, for the gateway's own tools,
// whose argument types are constants of this package.
func mustInputSchema[In any]() *jsonschema.Schema {
	s, err := inputSchema(reflect.TypeFor[In]())
	if err != nil {
		panic(err)
	}
	return s
}
