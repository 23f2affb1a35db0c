package gateway

import (
	"bufio"
	"encoding/base64"
	"encoding/json"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"
)

// The embedded server sends a client no PING until its ping interval:
// by default nats-server sends the first one 2 s after a CONNECT began
// to be processed, and a client whose handshake waited longer than that
// in the queue of a reconnecting fleet reads the PING where it expects
// the PONG of its handshake, and fails it. Spoken here as an agent
// speaks it: INFO, CONNECT with its credential and signed nonce, PING,
// PONG; then nothing from the server for as long as that early PING
// would take.
func TestEmbeddedServerSendsNoEarlyPing(t *testing.T) {
	gw := startAPIGateway(t, nil, func(c *Config) { c.APIListen = "" })
	kp := newUser(t)
	pub, _ := kp.PublicKey()
	creds, err := gw.EnrolLocal(t.Context(), "web-1", pub, nil)
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(gw.NATSURL())
	if err != nil || u.Scheme != "nats" {
		t.Fatalf("NATS URL %s: %v", gw.NATSURL(), err)
	}
	c, err := net.DialTimeout("tcp", u.Host, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	line, err := r.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "INFO ") {
		t.Fatalf("first line %q: %v", line, err)
	}
	var info struct {
		Nonce string `json:"nonce"`
	}
	if err := json.Unmarshal([]byte(strings.TrimPrefix(strings.TrimSpace(line), "INFO ")), &info); err != nil || info.Nonce == "" {
		t.Fatalf("INFO %q: %v", line, err)
	}
	sig, err := kp.Sign([]byte(info.Nonce))
	if err != nil {
		t.Fatal(err)
	}
	connect, _ := json.Marshal(map[string]any{"jwt": creds.JWT, "sig": base64.RawURLEncoding.EncodeToString(sig), "verbose": false,
		"pedantic": false, "protocol": 1, "name": "early ping probe"})
	if _, err := c.Write([]byte("CONNECT " + string(connect) + "\r\nPING\r\n")); err != nil {
		t.Fatal(err)
	}
	for {
		line, err = r.ReadString('\n')
		if err != nil {
			t.Fatalf("the handshake: %v", err)
		}
		if strings.HasPrefix(line, "PONG") {
			break
		}
		if strings.HasPrefix(line, "-ERR") || strings.HasPrefix(line, "PING") {
			t.Fatalf("the handshake got %q", line)
		}
	}
	got := make(chan string, 1)
	go func() {
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				got <- ""
				return
			}
			if strings.HasPrefix(line, "PING") {
				got <- line
				return
			}
		}
	}()
	// nats-server's early first PING comes 2 to 2.4 s after CONNECT.
	select {
	case line := <-got:
		if line != "" {
			t.Fatal("the server sent a PING soon after the handshake: a client still waiting for its PONG under load would fail")
		}
	case <-time.After(3500 * time.Millisecond):
	}
}
