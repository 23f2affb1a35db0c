package jskv

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Gateways follow the key-value buckets they share (hosts, agent records)
// with one watch each, kept alive across outages.

// Watch is one watch of the bucket; cancel ends it.
type Watch struct {
	w      jetstream.KeyWatcher
	cancel context.CancelFunc
}

// StartWatch starts watching every key of kv until ctx ends or the
// watch is cancelled, retrying for up to patience while JetStream does
// not answer. (A watch ends when the context given to WatchAll does, so
// that context cannot carry a timeout.)
func StartWatch(ctx context.Context, kv jetstream.KeyValue, patience time.Duration) (Watch, error) {
	what := kv.Bucket()
	type result struct {
		w   jetstream.KeyWatcher
		err error
	}
	deadline := time.Now().Add(patience)
	for {
		wctx, cancel := context.WithCancel(ctx)
		done := make(chan result, 1)
		go func() {
			w, err := kv.WatchAll(wctx)
			done <- result{w, err}
		}()
		var res result
		select {
		case res = <-done:
		case <-time.After(Timeout):
			cancel() // ends the request, or the watch it started
			if res = <-done; res.err == nil {
				drain(res.w)
				res.err = context.DeadlineExceeded
			}
		}
		if res.err == nil {
			return Watch{w: res.w, cancel: cancel}, nil
		}
		cancel()
		if time.Now().After(deadline) || ctx.Err() != nil {
			return Watch{}, fmt.Errorf("%s bucket: watch: %w", what, res.err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// drain discards a cancelled watch's updates until its channel closes:
// the subscription delivering them ends only once its last send is taken.
func drain(w jetstream.KeyWatcher) {
	for range w.Updates() {
	}
}

// Follow applies every entry of kv to apply until ctx ends: those
// of first (the current records, after which loaded is closed), then
// every change. When the connection comes back after an outage it starts
// a new watch at once, rather than wait until the old one notices missed
// heartbeats (about 20 s later), and when a watch ends by itself (its
// consumer or the bucket went away) it starts another; a new watch
// delivers every record again, which apply skips by revision. wg joins
// the goroutines that drain retired watches.
func Follow(ctx context.Context, nc *nats.Conn, kv jetstream.KeyValue, first Watch, wg *sync.WaitGroup,
	log *slog.Logger, loaded chan struct{}, apply func(jetstream.KeyValueEntry)) {
	reconnected := nc.StatusChanged(nats.CONNECTED)
	defer nc.RemoveStatusListener(reconnected)
	cur := first
	retire := func(bw Watch) {
		bw.cancel()
		wg.Go(func() { drain(bw.w) })
	}
	defer func() { retire(cur) }()
	for {
		select {
		case <-ctx.Done():
			return
		case <-reconnected:
			next, err := StartWatch(ctx, kv, WatchPatience)
			if err != nil {
				log.Warn(kv.Bucket()+" bucket: cannot watch again after reconnecting; the old watch recovers by itself", "err", err)
				continue
			}
			retire(cur)
			cur = next
		case e, ok := <-cur.w.Updates():
			switch {
			case !ok && ctx.Err() != nil:
				return
			case !ok:
				log.Warn(kv.Bucket() + " bucket: watch ended; watching again")
				next, err := StartWatch(ctx, kv, WatchPatience)
				for err != nil {
					select {
					case <-ctx.Done():
						return
					case <-time.After(5 * time.Second):
					}
					next, err = StartWatch(ctx, kv, WatchPatience)
				}
				retire(cur)
				cur = next
			case e == nil:
				select {
				case <-loaded:
				default:
					close(loaded)
				}
			default:
				apply(e)
			}
		}
	}
}

// EnsureBucket creates or updates a bucket, retrying for up to patience
// while JetStream starts up.
func EnsureBucket(js jetstream.JetStream, patience time.Duration, kc jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	deadline := time.Now().Add(patience)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), Timeout)
		kv, err := js.CreateOrUpdateKeyValue(ctx, kc)
		if err == nil && kc.Replicas > 1 {
			kv, err = LeaderReads(ctx, js, kc.Bucket)
		}
		cancel()
		switch {
		case err == nil:
			return kv, nil
		case errors.Is(err, jetstream.ErrJetStreamNotEnabled), errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount):
			return nil, fmt.Errorf("bucket %s needs JetStream, which the NATS server does not offer the fleet account: enable jetstream in its configuration and give the account JetStream limits (see deploy/nats)", kc.Bucket)
		case time.Now().After(deadline):
			return nil, fmt.Errorf("bucket %s: %w", kc.Bucket, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// LeaderReads makes the reads of a replicated bucket go to its leader.
// JetStream creates buckets with direct gets, which any replica answers,
// one that lags the leader too: a record another gateway has just
// written (acknowledged by a quorum) could read as missing, or older,
// through this one. Without direct gets a read is the leader's, which
// holds every acknowledged write. (Another gateway creating the bucket
// turns direct gets on again on the server; this gateway's handle keeps
// reading from the leader, and that one turns them off again.)
func LeaderReads(ctx context.Context, js jetstream.JetStream, bucket string) (jetstream.KeyValue, error) {
	s, err := js.Stream(ctx, "KV_"+bucket)
	if err != nil {
		return nil, err
	}
	if cfg := s.CachedInfo().Config; cfg.AllowDirect {
		cfg.AllowDirect = false
		if _, err := js.UpdateStream(ctx, cfg); err != nil {
			return nil, err
		}
	}
	return js.KeyValue(ctx, bucket)
}
