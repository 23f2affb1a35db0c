package hacheck

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// OperatorConn connects to urls as the fleet's operator would: as a user
// of the fleet account signed by the gateway signing key in a gateway's
// data directory (nats/gateway-signer.nk), which may read every stream.
func OperatorConn(dataDir string, urls []string, opts ...nats.Option) (*nats.Conn, error) {
	seed, err := os.ReadFile(filepath.Join(dataDir, "nats", "gateway-signer.nk"))
	if err != nil {
		return nil, fmt.Errorf("the gateway signing key: %w", err)
	}
	signer, err := nkeys.FromSeed([]byte(strings.TrimSpace(string(seed))))
	if err != nil {
		return nil, fmt.Errorf("the gateway signing key: %w", err)
	}
	account, err := os.ReadFile(filepath.Join(dataDir, "nats", "account.pub"))
	if err != nil {
		return nil, fmt.Errorf("the fleet account: %w", err)
	}
	user, err := nkeys.CreateUser()
	if err != nil {
		return nil, err
	}
	pub, _ := user.PublicKey()
	uc := jwt.NewUserClaims(pub)
	uc.Name = "hacheck"
	uc.IssuerAccount = strings.TrimSpace(string(account))
	// The signing key's template gives the permissions.
	uc.UserPermissionLimits = jwt.UserPermissionLimits{}
	token, err := uc.Encode(signer)
	if err != nil {
		return nil, err
	}
	useed, _ := user.Seed()
	all := append([]nats.Option{nats.UserJWTAndSeed(token, string(useed)), nats.MaxReconnects(-1),
		nats.ReconnectWait(100 * time.Millisecond)}, opts...)
	return nats.Connect(strings.Join(urls, ","), all...)
}

// ReadRecords reads the whole audit stream, retrying while JetStream
// does not answer, until ctx ends.
func ReadRecords(ctx context.Context, nc *nats.Conn) ([]Record, error) {
	var last error
	for ctx.Err() == nil {
		recs, err := readRecords(ctx, nc)
		if err == nil {
			return recs, nil
		}
		last = err
		select {
		case <-ctx.Done():
		case <-time.After(250 * time.Millisecond):
		}
	}
	return nil, fmt.Errorf("read the audit stream: %w (last: %v)", ctx.Err(), last)
}

func readRecords(ctx context.Context, nc *nats.Conn) ([]Record, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	sctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	stream, err := js.Stream(sctx, protocol.AuditStream)
	if err != nil {
		return nil, err
	}
	info, err := stream.Info(sctx)
	if err != nil {
		return nil, err
	}
	if info.State.Msgs == 0 {
		return nil, nil
	}
	cons, err := stream.OrderedConsumer(sctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return nil, err
	}
	var out []Record
	for empty := 0; len(out) < int(info.State.Msgs); {
		batch, err := cons.FetchNoWait(1000)
		if err != nil {
			return nil, err
		}
		n := 0
		for m := range batch.Messages() {
			n++
			meta, err := m.Metadata()
			if err != nil {
				return nil, err
			}
			var rec Record
			if err := json.Unmarshal(m.Data(), &rec.Record); err != nil {
				return nil, fmt.Errorf("record %d: %w", meta.Sequence.Stream, err)
			}
			rec.Seq, rec.MsgID = meta.Sequence.Stream, m.Headers().Get(jetstream.MsgIDHeader)
			out = append(out, rec)
			if meta.NumPending == 0 {
				return out, nil
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			return nil, err
		}
		if n > 0 {
			empty = 0
			continue
		}
		if empty++; empty > 100 {
			return nil, fmt.Errorf("the audit stream stopped after %d of %d records", len(out), info.State.Msgs)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return out, nil
}

// HostStates asks the gateway at url for its hosts (the hosts tool) and
// returns each one's state.
func HostStates(ctx context.Context, url string) (map[string]string, error) {
	client := mcp.NewClient(&mcp.Implementation{Name: "hacheck", Version: "1"}, nil)
	cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, DisableStandaloneSSE: true}, nil)
	if err != nil {
		return nil, err
	}
	defer cs.Close()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "hosts"})
	if err != nil {
		return nil, err
	}
	if res.IsError {
		return nil, fmt.Errorf("hosts: %v", res.Content)
	}
	out := map[string]string{}
	for _, c := range res.Content {
		t, ok := c.(*mcp.TextContent)
		if !ok {
			continue
		}
		for i, line := range strings.Split(t.Text, "\n") {
			f := strings.Split(line, "\t")
			if i == 0 || len(f) < 2 {
				continue
			}
			out[f[0]] = f[1]
		}
	}
	return out, nil
}
