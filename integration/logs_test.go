package integration

import (
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/fleetmcp/fleetmcp/gateway"
)

// At info, the gateway logs no line per tool call (the SDK's session
// lines of stateless requests are debug), exactly one per refused call,
// one per host state change, and one per NATS connection refused for
// want of a valid credential.
func TestGatewayLogLines(t *testing.T) {
	logs := &logBuffer{}
	env := NewEnv(t, Options{Gateway: func(c *gateway.Config) {
		c.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}})
	if got := logs.lines(`msg="host online"`, "host=alpha"); len(got) != 1 {
		t.Fatalf("host online lines: %q", got)
	}
	before := len(logs.lines())
	for _, era := range eras {
		cs := env.Client(era.Version, nil)
		for range 5 {
			mustOK(t, call(t, cs, "bash", map[string]any{"host": "alpha", "command": "true"}))
			mustOK(t, call(t, cs, "hosts", nil))
		}
		mustErr(t, call(t, cs, "read", map[string]any{"host": "nosuch", "path": "x"}), "unknown host")
	}
	if got := logs.lines()[before:]; len(got) != 2 || len(logs.lines(`msg="tool call refused"`, "host=nosuch")) != 2 {
		t.Fatalf("lines logged for 20 calls and 2 refusals: %q", got)
	}

	// A stranger's credential: signed by a key the servers do not know.
	kp, _ := nkeys.CreateAccount()
	user, _ := nkeys.CreateUser()
	pub, _ := user.PublicKey()
	seed, _ := user.Seed()
	uc := jwt.NewUserClaims(pub)
	uc.Name = "stranger"
	token, err := uc.Encode(kp)
	if err != nil {
		t.Fatal(err)
	}
	if nc, err := nats.Connect(env.NATSURL(), nats.UserJWTAndSeed(token, string(seed)), nats.MaxReconnects(0)); err == nil {
		nc.Close()
		t.Fatal("a stranger's credential was accepted")
	}
	waitFor(t, 10*time.Second, "the refused connection logged", func() bool {
		return len(logs.lines(`msg="NATS connection refused: no valid credential"`, "key="+pub)) == 1
	})

	env.StopAgent("alpha")
	waitFor(t, 10*time.Second, "alpha's goodbye logged", func() bool { return len(logs.lines(`msg="host left"`, "host=alpha")) == 1 })
	env.StartAgent("alpha", nil)
	env.WaitHost("alpha", true)
	waitFor(t, 10*time.Second, "alpha's return logged", func() bool { return len(logs.lines(`msg="host back online"`, "host=alpha")) == 1 })
}
