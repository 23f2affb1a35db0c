package main

import (
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/fleetmcp/fleetmcp/agent/callauth"
	"github.com/fleetmcp/fleetmcp/protocol"
)

// The floor of the design: the least any gateway built the way fleetmcp
// is must do for one read. The floor process serves, beside the bare
// echo, a "relay" tool: a bare go-sdk handler that sends the read over
// an embedded NATS server (the gateway embeds its own) to a responder in
// a process of its own (this binary with -role relay), which reads the
// file and answers; the handler passes its text on. "signed_relay" adds
// the four signatures of signed calls, with the product's own code: the
// handler signs the call's envelope (protocol.EnvelopeSigner), the
// responder checks it with its replay cache (callauth.Verifier) and
// signs a receipt of its result (callauth.ReceiptSigner), and the
// handler checks the receipt against the result before it answers.
//
// What the real gateway and agent spend beyond "signed relay" is theirs
// to lose (access, audit, framing, policy, the race-free open...); what
// "signed relay" costs beyond the bare echo, no implementation of the
// design can save.

const relayHost = "bench-relay"

// relayKeys are the two keys of the relay: the "gateway's" ed25519 key
// that signs calls and the "agent's" nkey that signs receipts.
type relayKeys struct {
	Gateway []byte `json:"gateway_seed"` // ed25519 seed
	Agent   []byte `json:"agent_seed"`   // nkeys user seed
}

// writeRelayKeys makes fresh keys and writes them to a file only this
// user can read.
func writeRelayKeys(file string) error {
	_, priv, err := ed25519.GenerateKey(nil)
	if err != nil {
		return err
	}
	kp, err := nkeys.CreateUser()
	if err != nil {
		return err
	}
	seed, err := kp.Seed()
	if err != nil {
		return err
	}
	data, err := json.Marshal(relayKeys{Gateway: priv.Seed(), Agent: seed})
	if err != nil {
		return err
	}
	return os.WriteFile(file, data, 0o600)
}

func readRelayKeys(file string) (*relayKeys, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	var k relayKeys
	if err := json.Unmarshal(data, &k); err != nil || len(k.Gateway) != ed25519.SeedSize || len(k.Agent) == 0 {
		return nil, fmt.Errorf("relay keys %s: not the file fleetbench writes (%v)", file, err)
	}
	return &k, nil
}

// Subjects of the relay.
const (
	relaySubject = "bench.relay"
	relayInbox   = "bench.reply"
)

type relayIn struct {
	Path string `json:"path"`
}

// relayClient is the floor process's side: it sends calls on one NATS
// connection and hands each reply to the call waiting for it.
type relayClient struct {
	nc       *nats.Conn
	signer   *protocol.EnvelopeSigner
	agentKey string // the responder's receipt key (U...)
	n        atomic.Int64
	mu       sync.Mutex
	waiting  map[string]chan *nats.Msg
}

// startRelayNATS runs the embedded NATS server of the floor process.
func startRelayNATS() (*server.Server, error) {
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, NoLog: true, NoSigs: true})
	if err != nil {
		return nil, err
	}
	ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		ns.Shutdown()
		return nil, errors.New("the floor's NATS server did not start within 10 s")
	}
	return ns, nil
}

func newRelayClient(ns *server.Server, keys *relayKeys) (*relayClient, error) {
	kp, err := nkeys.FromSeed(keys.Agent)
	if err != nil {
		return nil, err
	}
	pub, err := kp.PublicKey()
	if err != nil {
		return nil, err
	}
	// In process, as the gateway connects to its embedded server.
	nc, err := nats.Connect("", nats.Name("fleetbench floor"), nats.InProcessServer(ns))
	if err != nil {
		return nil, err
	}
	rc := &relayClient{nc: nc, signer: protocol.NewEnvelopeSigner(ed25519.NewKeyFromSeed(keys.Gateway)), agentKey: pub, waiting: map[string]chan *nats.Msg{}}
	if _, err := nc.Subscribe(relayInbox+".*", rc.onReply); err != nil {
		nc.Close()
		return nil, err
	}
	if err := nc.Flush(); err != nil {
		nc.Close()
		return nil, err
	}
	return rc, nil
}

func (rc *relayClient) onReply(m *nats.Msg) {
	id := strings.TrimPrefix(m.Subject, relayInbox+".")
	rc.mu.Lock()
	ch := rc.waiting[id]
	delete(rc.waiting, id)
	rc.mu.Unlock()
	if ch != nil {
		ch <- m
	}
}

// call sends a read of path to the responder, signed or not, and returns
// the file's text.
func (rc *relayClient) call(ctx context.Context, path string, signed bool) (string, error) {
	id := "c" + strconv.FormatInt(rc.n.Add(1), 10)
	args, err := json.Marshal(relayIn{Path: path})
	if err != nil {
		return "", err
	}
	call := protocol.Call{ID: id, Protocol: protocol.Version, Host: relayHost, Tool: "read", Caller: protocol.Caller{Subject: "fleetbench"}, TimeoutMS: 10_000, Args: args}
	body, err := json.Marshal(&call)
	if err != nil {
		return "", err
	}
	reply := relayInbox + "." + id
	msg := &nats.Msg{Subject: relaySubject, Reply: reply, Data: body, Header: nats.Header{}}
	if signed {
		now := time.Now()
		claims := protocol.Claims{Kind: protocol.MsgCall, Host: relayHost, Instance: relayHost, CallID: id, MsgID: protocol.NewMsgID(), Tool: call.Tool, Reply: reply,
			BodySHA256: sha256.Sum256(body), BodySize: int64(len(body)), TimeoutMS: call.TimeoutMS, Caller: call.Caller.Claims(),
			IssuedAt: now, Expires: now.Add(protocol.EnvelopeLifetime)}
		msg.Header.Set(protocol.HeaderAuth, rc.signer.Sign(&claims))
	}
	ch := make(chan *nats.Msg, 1)
	rc.mu.Lock()
	rc.waiting[id] = ch
	rc.mu.Unlock()
	defer func() {
		rc.mu.Lock()
		delete(rc.waiting, id)
		rc.mu.Unlock()
	}()
	if err := rc.nc.PublishMsg(msg); err != nil {
		return "", err
	}
	var m *nats.Msg
	select {
	case m = <-ch:
	case <-ctx.Done():
		return "", ctx.Err()
	case <-time.After(10 * time.Second):
		return "", fmt.Errorf("the relay responder did not answer call %s within 10 s", id)
	}
	res, err := protocol.DecodeResult(m.Data)
	if err != nil {
		return "", err
	}
	if res.Error != nil {
		return "", fmt.Errorf("the relay responder refused call %s: %s", id, res.Error.Message)
	}
	if signed {
		rcpt, err := protocol.ParseReceipt(m.Header.Get(protocol.HeaderReceipt))
		if err == nil {
			err = rcpt.Matches(relayHost, id, res, m.Data)
		}
		if err == nil {
			err = rcpt.Verify(rc.agentKey)
		}
		if err != nil {
			return "", fmt.Errorf("receipt of call %s: %w", id, err)
		}
	}
	if res.IsError || len(res.Content) != 1 {
		return "", fmt.Errorf("the relay responder failed call %s: %+v", id, res)
	}
	return res.Content[0].Text, nil
}

// addRelayTools adds the relay tools to the floor server.
func addRelayTools(s *mcp.Server, rc *relayClient) {
	for _, signed := range []bool{false, true} {
		name := "relay"
		if signed {
			name = "signed_relay"
		}
		mcp.AddTool(s, &mcp.Tool{Name: name}, func(ctx context.Context, _ *mcp.CallToolRequest, in relayIn) (*mcp.CallToolResult, any, error) {
			text, err := rc.call(ctx, in.Path, signed)
			if err != nil {
				return nil, nil, err
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: text}}}, nil, nil
		})
	}
}

// runRelay is the responder (-role relay): it answers the floor's reads
// on the NATS server at url until ctx ends, reading files under dir
// only.
func runRelay(ctx context.Context, url, keyFile, dir string, stdout io.Writer) error {
	keys, err := readRelayKeys(keyFile)
	if err != nil {
		return err
	}
	receipts, err := callauth.NewReceiptSigner(keys.Agent)
	if err != nil {
		return err
	}
	v, err := callauth.New(callauth.Config{Host: relayHost, Instance: relayHost,
		Keys: protocol.KeyState{Serial: 1, Keys: []string{protocol.FormatSigningKey(ed25519.NewKeyFromSeed(keys.Gateway).Public().(ed25519.PublicKey))}}})
	if err != nil {
		return err
	}
	nc, err := nats.Connect(url, nats.Name("fleetbench relay"))
	if err != nil {
		return err
	}
	defer nc.Close()
	r := &responder{nc: nc, v: v, receipts: receipts, dir: dir}
	// Each read is served on a goroutine of its own, side by side, as
	// the agent runs calls (served one at a time, the signed reads at
	// c=8 were slower than the product's).
	if _, err := nc.Subscribe(relaySubject, func(m *nats.Msg) { go r.serve(m) }); err != nil {
		return err
	}
	if err := nc.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(stdout, "READY")
	<-ctx.Done()
	return nil
}

type responder struct {
	nc       *nats.Conn
	v        *callauth.Verifier
	receipts *callauth.ReceiptSigner
	dir      string
}

func (r *responder) serve(m *nats.Msg) {
	start := time.Now()
	auth := m.Header.Get(protocol.HeaderAuth)
	var call protocol.Call
	res := func() *protocol.Result {
		if auth != "" {
			if _, err := r.v.OpenBody(auth, callauth.Expect{Kind: protocol.MsgCall, Reply: m.Reply}, m.Data); err != nil {
				return protocol.ErrorResult("", protocol.CodeBadRequest, err.Error())
			}
		}
		if err := json.Unmarshal(m.Data, &call); err != nil {
			return protocol.ErrorResult("", protocol.CodeBadRequest, err.Error())
		}
		var in relayIn
		if err := json.Unmarshal(call.Args, &in); err != nil {
			return protocol.ErrorResult(call.ID, protocol.CodeBadRequest, err.Error())
		}
		if filepath.Dir(in.Path) != r.dir {
			return protocol.ErrorResult(call.ID, protocol.CodeBadRequest, "the relay reads only the benchmark's own files")
		}
		data, err := os.ReadFile(in.Path)
		if err != nil {
			return protocol.ErrorResult(call.ID, protocol.CodeBadRequest, err.Error())
		}
		return &protocol.Result{CallID: call.ID, Content: []protocol.Content{protocol.Text(string(data))}}
	}()
	data, err := protocol.EncodeResult(res)
	if err != nil {
		return
	}
	out := &nats.Msg{Subject: m.Reply, Data: data, Header: nats.Header{}}
	if auth != "" {
		h, err := r.receipts.Sign(relayHost, res, data, start, time.Now(), nil)
		if err != nil {
			return
		}
		out.Header.Set(protocol.HeaderReceipt, h)
	}
	_ = r.nc.PublishMsg(out)
}
