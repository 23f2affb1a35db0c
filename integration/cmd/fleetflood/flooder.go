package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/fleetmcp/fleetmcp/agent/identity"
	"github.com/fleetmcp/fleetmcp/integration/cmd/internal/childproc"
	"github.com/fleetmcp/fleetmcp/integration/enrolclient"
	"github.com/fleetmcp/fleetmcp/protocol"
)

// The flooder (-role flooder) is the owner of one enrolled host, with
// the host's own files from its state directory (its key, credential
// and CA). It takes commands on standard input, one a line, and answers
// each with one line:
//
//	capture              CAPTURING: then CALL <id> for the first call sent to the host
//	real <id>            REAL: every 50th report is about call <id>
//	start <reports> <renewals>
//	                     STARTED: refusal reports to the subject <reports>
//	                     and renewal requests to <renewals>, at the rates
//	                     of -report_rate and -renew_rate, until stop
//	stop                 STOPPED <reports> <renewal requests> <answers> <seconds>
//
// With -creds it connects with that credential instead of the host's
// (the floor's server knows no host), and still signs with the host's
// key, so that the messages are the same.

// Forged content of the flood's reports, as TestFloodingHost's.
const (
	floodCaller = "mallory-forged-caller"
	floodText   = "FORGED-TEXT: alice ran rm -rf /"
)

type flooder struct {
	nc         *nats.Conn
	kp         nkeys.KeyPair
	host       string
	reportRate int
	renewRate  int

	forged  []*nats.Msg
	real    *nats.Msg
	renews  [][]byte
	answers atomic.Int64
}

func runFlooder(ctx context.Context, o *options, stdin io.Reader, stdout io.Writer) error {
	nc, kp, host, err := dialAsHost(o)
	if err != nil {
		return err
	}
	defer nc.Close()
	f := &flooder{nc: nc, kp: kp, host: host, reportRate: o.reportRate, renewRate: o.renewRate}
	for i := range 500 {
		m, err := f.report(fmt.Sprintf("c%024x", i+1))
		if err != nil {
			return err
		}
		f.forged = append(f.forged, m)
	}
	f.real = f.forged[0]
	// The answers to the renewal requests are counted, nothing more.
	if _, err := nc.Subscribe(protocol.AgentInboxPrefix(host)+".>", func(m *nats.Msg) {
		if m.Header.Get("Status") == "" {
			f.answers.Add(1)
		}
	}); err != nil {
		return err
	}
	if err := nc.Flush(); err != nil {
		return err
	}
	out := &childproc.LockedWriter{W: stdout}
	fmt.Fprintln(out, "READY")
	var running *flooding
	defer func() {
		if running != nil {
			running.stop()
		}
	}()
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stdin)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	for {
		var line string
		select {
		case <-ctx.Done():
			return nil
		case l, ok := <-lines:
			if !ok {
				return nil // standard input closed: the command is done with us
			}
			line = l
		}
		words := strings.Fields(line)
		switch {
		case len(words) == 1 && words[0] == "capture":
			if err := f.capture(out); err != nil {
				return err
			}
		case len(words) == 2 && words[0] == "real":
			m, err := f.report(words[1])
			if err != nil {
				return err
			}
			f.real = m
			fmt.Fprintln(out, "REAL")
		case len(words) == 3 && words[0] == "start" && running == nil:
			if err := f.signRenewals(); err != nil {
				return err
			}
			running = f.start(words[1], words[2])
			fmt.Fprintln(out, "STARTED")
		case len(words) == 1 && words[0] == "stop" && running != nil:
			reports, renewals, took, err := running.stop()
			running = nil
			if err != nil {
				return err
			}
			// The answers still on their way are counted once they came.
			if err := nc.Flush(); err != nil {
				return err
			}
			fmt.Fprintf(out, "STOPPED %d %d %d %.3f\n", reports, renewals, f.answers.Swap(0), took.Seconds())
		default:
			return fmt.Errorf("flooder: command %q not understood here", line)
		}
	}
}

// report is a refusal report of the host's, signed with its key, about
// call id, with a caller and a text of the host's choosing.
func (f *flooder) report(id string) (*nats.Msg, error) {
	data, _ := json.Marshal(protocol.Refusal{Host: f.host, Kind: protocol.MsgCall, Reason: protocol.RefusedReplayed, Message: floodText,
		CallID: id, Tool: "bash", Caller: floodCaller, At: time.Now()})
	sig, err := f.kp.Sign(protocol.RefusalSigningBytes(data))
	if err != nil {
		return nil, err
	}
	return &nats.Msg{Data: data, Header: nats.Header{protocol.HeaderReportSig: {base64.RawURLEncoding.EncodeToString(sig)}}}, nil
}

// signRenewals signs the renewal requests of the next flood, now: a
// request is screened (too early, or beyond the host's rate) before its
// signature or nonce is looked at, so the same 200 go round.
func (f *flooder) signRenewals() error {
	f.renews = f.renews[:0]
	for range 200 {
		r := &protocol.RenewRequest{Host: f.host}
		if err := enrolclient.Sign(f.kp, &r.Proof, time.Now(), r.SigningBytes); err != nil {
			return err
		}
		data, _ := json.Marshal(r)
		f.renews = append(f.renews, data)
	}
	return nil
}

// capture subscribes to the host's call subject and prints the ID of
// the first call sent to it.
func (f *flooder) capture(out io.Writer) error {
	sub, err := f.nc.Subscribe(protocol.CallSubject(f.host), func(m *nats.Msg) {
		fmt.Fprintln(out, "CALL", m.Header.Get(protocol.HeaderCall))
	})
	if err != nil {
		return err
	}
	if err := sub.AutoUnsubscribe(1); err != nil {
		return err
	}
	if err := f.nc.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(out, "CAPTURING")
	return nil
}

// flooding is one flood under way.
type flooding struct {
	cancel            context.CancelFunc
	wg                sync.WaitGroup
	began             time.Time
	reports, renewals int
	mu                sync.Mutex
	err               error
}

// start floods reportSubject with reports and renewSubject with renewal
// requests, each at its rate, until stop. Each is paced by the clock:
// what is due by now is sent, then the sender sleeps a millisecond, so
// the rate is the same whoever hears the messages.
func (f *flooder) start(reportSubject, renewSubject string) *flooding {
	ctx, cancel := context.WithCancel(context.Background())
	fl := &flooding{cancel: cancel, began: time.Now()}
	paced := func(rate int, send func(i int) error, count *int) {
		defer fl.wg.Done()
		for n := 0; ; {
			due := int(float64(rate) * time.Since(fl.began).Seconds())
			for ; n < due; n++ {
				if err := send(n); err != nil {
					fl.fail(err)
					*count = n
					return
				}
			}
			*count = n
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Millisecond):
			}
		}
	}
	fl.wg.Add(2)
	go paced(f.reportRate, func(i int) error {
		m := f.forged[i%len(f.forged)]
		if i%50 == 0 {
			m = f.real
		}
		return f.nc.PublishMsg(&nats.Msg{Subject: reportSubject, Header: m.Header, Data: m.Data})
	}, &fl.reports)
	go paced(f.renewRate, func(i int) error {
		return f.nc.PublishRequest(renewSubject, f.nc.NewInbox(), f.renews[i%len(f.renews)])
	}, &fl.renewals)
	return fl
}

func (fl *flooding) fail(err error) {
	fl.mu.Lock()
	defer fl.mu.Unlock()
	if fl.err == nil {
		fl.err = err
	}
}

// stop ends the flood and returns what it sent, over how long.
func (fl *flooding) stop() (reports, renewals int, took time.Duration, err error) {
	fl.cancel()
	fl.wg.Wait()
	took = time.Since(fl.began)
	fl.mu.Lock()
	defer fl.mu.Unlock()
	if errors.Is(fl.err, nats.ErrConnectionClosed) {
		fl.err = fmt.Errorf("the flooder's connection was closed: %w", fl.err)
	}
	return fl.reports, fl.renewals, took, fl.err
}

// dialAsHost connects to NATS as the host whose state directory o names,
// with its key and credential (or o.creds), and returns its key and name.
func dialAsHost(o *options) (*nats.Conn, nkeys.KeyPair, string, error) {
	store := identity.Open(o.stateDir)
	kp, err := store.LoadKey()
	if err != nil {
		return nil, nil, "", fmt.Errorf("the host's key in %s: %w", o.stateDir, err)
	}
	enr, err := store.LoadEnrolment()
	if err != nil {
		return nil, nil, "", fmt.Errorf("the host's enrolment in %s: %w", o.stateDir, err)
	}
	opts := []nats.Option{nats.CustomInboxPrefix(protocol.AgentInboxPrefix(enr.Host)), nats.Name("fleetflood flooder")}
	if o.creds != "" {
		opts = append(opts, nats.UserCredentials(o.creds))
	} else {
		token, err := store.LoadJWT()
		if err != nil {
			return nil, nil, "", fmt.Errorf("the host's credential in %s: %w", o.stateDir, err)
		}
		seed, _ := kp.Seed()
		opts = append(opts, nats.UserJWTAndSeed(token, string(seed)))
		if enr.NATSCA != "" {
			pool := x509.NewCertPool()
			pool.AppendCertsFromPEM([]byte(enr.NATSCA))
			opts = append(opts, nats.Secure(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}))
		}
	}
	nc, err := nats.Connect(o.natsURL, opts...)
	if err != nil {
		return nil, nil, "", fmt.Errorf("connect to %s as %s: %w", o.natsURL, enr.Host, err)
	}
	return nc, kp, enr.Host, nil
}
