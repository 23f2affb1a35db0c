package goclient

import (
	"context"
	"fmt"
	"log"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Example calls bash on the host laptop through the gateway at endpoint,
// as the top README.md shows: the lines from the README marker to
// Output are that snippet, word for word (TestREADMESnippet).
func Example() {
	endpoint, stop := startFleet("laptop") // a gateway with auth off, and laptop's agent
	defer stop()

	// README.md, Go (go-sdk):
	ctx := context.Background()
	client := mcp.NewClient(&mcp.Implementation{Name: "me", Version: "1"}, nil)
	cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: endpoint}, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer cs.Close()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "bash",
		Arguments: map[string]any{"host": "laptop", "command": "echo hello from the fleet"}})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Print(res.Content[0].(*mcp.TextContent).Text)
	// Output:
	// hello from the fleet
}
