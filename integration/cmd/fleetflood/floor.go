package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/fleetmcp/fleetmcp/integration/cmd/internal/childproc"
	"github.com/fleetmcp/fleetmcp/protocol"
)

// The floor: what the flood costs with no gateway logic. Its server
// (-role floor) is the gateway's process with everything but NATS taken
// out: an embedded nats-server in operator mode (accounts and users
// signed as the gateway signs them, JetStream on), a connection in
// process that hears the hosts' refusal reports and renewal requests on
// the gateway's subjects and drops them (a renewal request is answered
// with a fixed refusal of the size of the gateway's), and an HTTP
// endpoint, /call, that sends its body's worth of a call over NATS to a
// responder and returns the answer. The responder (-role responder), in
// a process of its own as an agent is, echoes a payload of -call_bytes.
// The honest round trip is then HTTP, a NATS request and its answer;
// the flood is the same messages at the same rates as the gateway's.

const (
	floorCallSubject = "floor.call"
	floorHost        = "honest"
)

// floorAnswer is the answer the floor gives every renewal request: the
// gateway's too_early refusal, of its size.
var floorAnswer, _ = json.Marshal(&protocol.APIError{Code: protocol.APITooEarly,
	Message: "the credential of victim is renewed once past half its life, from 2026-12-22T23:00:00Z (gateway time); until then it keeps the one it has: ask again then"})

// floorAuth is the operator, accounts and users of the floor's server.
type floorAuth struct {
	operator *jwt.OperatorClaims
	sysPub   string
	resolver *server.MemAccResolver
	account  nkeys.KeyPair
}

func newFloorAuth() (*floorAuth, error) {
	okp, err := nkeys.CreateOperator()
	if err != nil {
		return nil, err
	}
	opub, _ := okp.PublicKey()
	oc := jwt.NewOperatorClaims(opub)
	oc.Name = "floor"
	ojwt, err := oc.Encode(okp)
	if err != nil {
		return nil, err
	}
	a := &floorAuth{resolver: &server.MemAccResolver{}}
	if a.operator, err = jwt.DecodeOperatorClaims(ojwt); err != nil {
		return nil, err
	}
	for _, name := range []string{"SYS", "FLEET"} {
		akp, err := nkeys.CreateAccount()
		if err != nil {
			return nil, err
		}
		apub, _ := akp.PublicKey()
		ac := jwt.NewAccountClaims(apub)
		ac.Name = name
		if name == "FLEET" {
			ac.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: -1, DiskStorage: -1, Streams: -1, Consumer: -1}
			a.account = akp
		} else {
			a.sysPub = apub
		}
		ajwt, err := ac.Encode(okp)
		if err != nil {
			return nil, err
		}
		if err := a.resolver.Store(apub, ajwt); err != nil {
			return nil, err
		}
	}
	return a, nil
}

// user mints a user of the fleet account that may publish to pub and
// subscribe to sub (all when both are empty), and answer requests when
// respond is set.
func (a *floorAuth) user(name string, pub, sub []string, respond bool) (token string, seed []byte, err error) {
	ukp, err := nkeys.CreateUser()
	if err != nil {
		return "", nil, err
	}
	upub, _ := ukp.PublicKey()
	uc := jwt.NewUserClaims(upub)
	uc.Name = name
	uc.Pub.Allow.Add(pub...)
	uc.Sub.Allow.Add(sub...)
	if respond {
		uc.Resp = &jwt.ResponsePermission{MaxMsgs: 1, Expires: time.Minute}
	}
	if token, err = uc.Encode(a.account); err != nil {
		return "", nil, err
	}
	seed, err = ukp.Seed()
	return token, seed, err
}

// writeCreds writes a creds file of a new user to path.
func (a *floorAuth) writeCreds(path, name string, pub, sub []string, respond bool) error {
	token, seed, err := a.user(name, pub, sub, respond)
	if err != nil {
		return err
	}
	data, err := jwt.FormatUserConfig(token, seed)
	if err != nil {
		return err
	}
	return os.WriteFile(path, data, 0o600)
}

// runFloor runs the floor's server until ctx ends. It writes the creds
// of the responder (floor-responder.creds) and of the flooder (the host
// victim's permissions, floor-victim.creds) into dir, and prints
// READY <http address> <NATS URL>.
func runFloor(ctx context.Context, o *options, stdout io.Writer) error {
	auth, err := newFloorAuth()
	if err != nil {
		return err
	}
	opts := &server.Options{
		ServerName: "fleetflood-floor", Host: "127.0.0.1", Port: server.RANDOM_PORT,
		NoSigs: true, NoLog: true, JetStream: true, StoreDir: filepath.Join(o.dir, "jetstream"),
		AuthTimeout: 10, DisableShortFirstPing: true, PingInterval: 20 * time.Second, MaxPingsOut: server.DEFAULT_PING_MAX_OUT,
		TrustedOperators: []*jwt.OperatorClaims{auth.operator}, SystemAccount: auth.sysPub, AccountResolver: auth.resolver,
	}
	ns, err := server.NewServer(opts)
	if err != nil {
		return fmt.Errorf("floor NATS: %w", err)
	}
	ns.Start()
	defer ns.Shutdown()
	if !ns.ReadyForConnections(30 * time.Second) {
		return fmt.Errorf("floor NATS server not ready")
	}
	victim := "victim"
	if err := auth.writeCreds(filepath.Join(o.dir, "floor-victim.creds"), victim,
		protocol.AgentPublishAllow(victim), protocol.AgentSubscribeAllow(victim), true); err != nil {
		return err
	}
	if err := auth.writeCreds(filepath.Join(o.dir, "floor-responder.creds"), floorHost,
		nil, []string{floorCallSubject}, true); err != nil {
		return err
	}
	// The floor's own connections, in process as the gateway's: one for
	// the calls, one for the hosts' reports and requests.
	own := func(name string) (*nats.Conn, error) {
		token, seed, err := auth.user(name, nil, nil, false)
		if err != nil {
			return nil, err
		}
		return nats.Connect("", nats.InProcessServer(ns), nats.UserJWTAndSeed(token, string(seed)), nats.Name(name))
	}
	nc, err := own("floor calls")
	if err != nil {
		return err
	}
	defer nc.Close()
	hostNC, err := own("floor host reports")
	if err != nil {
		return err
	}
	defer hostNC.Close()
	if _, err := hostNC.Subscribe(protocol.RefusedSubjectAll, func(*nats.Msg) {}); err != nil {
		return err
	}
	if _, err := hostNC.QueueSubscribe(protocol.RenewSubjectAll, "renew", func(m *nats.Msg) {
		if m.Reply != "" {
			_ = m.Respond(floorAnswer)
		}
	}); err != nil {
		return err
	}
	if err := hostNC.Flush(); err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /call", func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		reply, err := nc.RequestWithContext(r.Context(), floorCallSubject, body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		_, _ = w.Write(reply.Data)
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	return childproc.Serve(ctx, ln, mux, stdout, ns.ClientURL())
}

// runResponder answers the floor's calls with -call_bytes of payload,
// after running -floor_command.
func runResponder(ctx context.Context, o *options, stdout io.Writer) error {
	nc, err := nats.Connect(o.natsURL, nats.UserCredentials(o.creds), nats.Name("floor responder"))
	if err != nil {
		return fmt.Errorf("responder: connect to %s: %w", o.natsURL, err)
	}
	defer nc.Close()
	payload := make([]byte, o.callBytes)
	for i := range payload {
		payload[i] = 'a' + byte(i%26)
	}
	if _, err := nc.Subscribe(floorCallSubject, func(m *nats.Msg) {
		if o.floorCommand != "" {
			// What the agent does for the honest call, with nothing
			// of the agent around it.
			out, err := exec.Command("bash", "-c", o.floorCommand).Output()
			if err != nil {
				out = []byte(err.Error())
			}
			copy(payload, out)
		}
		_ = m.Respond(payload)
	}); err != nil {
		return err
	}
	if err := nc.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(stdout, "READY")
	<-ctx.Done()
	return nil
}
