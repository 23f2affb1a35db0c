package gateway

import (
	"context"
	"encoding/json"
	"slices"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// Every tool the server registers is one the access rules know: the
// per-host ones (which take a required host) are hostToolNames, so the
// guard filters tools/list and decides calls for each of them.
func TestToolsKnownToAccess(t *testing.T) {
	s := mcp.NewServer(&mcp.Implementation{Name: "test", Version: "1"}, nil)
	(&Gateway{}).addTools(s)
	ct, st := mcp.NewInMemoryTransports()
	ctx := context.Background()
	ss, err := s.Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ss.Close()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "client", Version: "1"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	res, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var perHost []string
	for _, tool := range res.Tools {
		if tool.Name == protocol.ToolHosts || protocol.IsAdminTool(tool.Name) {
			continue
		}
		data, _ := json.Marshal(tool.InputSchema)
		var schema struct {
			Required []string `json:"required"`
		}
		if err := json.Unmarshal(data, &schema); err != nil {
			t.Fatalf("%s: schema %s: %v", tool.Name, data, err)
		}
		// Fan-out tools are granted as the per-host tool they run, and
		// take a selector instead of a host.
		if base := protocol.FanoutBase(tool.Name); base != "" {
			if !slices.Contains(protocol.GrantedTools(), base) || !slices.Contains(schema.Required, "selector") {
				t.Errorf("%s: runs %q, requires %v", tool.Name, base, schema.Required)
			}
			continue
		}
		perHost = append(perHost, tool.Name)
		if !slices.Contains(schema.Required, "host") {
			t.Errorf("%s: host is not a required argument: %s", tool.Name, data)
		}
		switch tool.Name {
		case "list", "search":
			if tool.Annotations == nil || !tool.Annotations.ReadOnlyHint {
				t.Errorf("%s is not marked read-only", tool.Name)
			}
		case "delete":
			if tool.Annotations == nil || tool.Annotations.DestructiveHint == nil || !*tool.Annotations.DestructiveHint {
				t.Errorf("delete is not marked destructive")
			}
		}
	}
	slices.Sort(perHost)
	want := slices.Sorted(slices.Values(append(protocol.GrantedTools(), protocol.TaskTools()...)))
	if !slices.Equal(perHost, want) {
		t.Errorf("per-host tools registered %v, known to the access rules %v", perHost, want)
	}
}
