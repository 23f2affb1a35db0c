package jskv

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ModifyCAS applies change to a record with compare-and-swap: it reads
// the record and its revision with get, lets change edit it, and writes
// it with put at that revision, reading again as often as put reports
// changed (another writer came first). change returns ErrSkip when there
// is nothing to write.
func ModifyCAS[T any](ctx context.Context, get func() (T, uint64, error), put func(T, uint64) error, changed error, change func(T) error) (T, error) {
	var zero T
	for {
		rec, rev, err := get()
		if err != nil {
			return zero, err
		}
		if err := change(rec); errors.Is(err, ErrSkip) {
			return rec, nil
		} else if err != nil {
			return zero, err
		}
		if err = put(rec, rev); err == nil {
			return rec, nil
		}
		if !errors.Is(err, changed) || ctx.Err() != nil {
			return zero, err
		}
	}
}

// ErrSkip tells ModifyCAS that the record needs no write.
var ErrSkip = errors.New("no change")

// Timeout bounds one JetStream API call; JetStream may not answer at all
// while it elects a leader, so calls are retried rather than waited on.
const Timeout = 3 * time.Second

// WatchPatience is how long a watch is retried while JetStream does not
// answer (as while a whole fleet reconnects).
const WatchPatience = 20 * time.Second

// Attempts bounds the attempts of an idempotent JetStream request
// (Retry); each has Timeout.
const Attempts = 4

// Retry runs op, an idempotent JetStream request (a read, or a write
// made so that doing it twice is no different from once), with a
// fresh Timeout for each attempt, again while JetStream does not answer
// (a leader election: no reply at all, or no responders) until it
// answers, ctx ends, or Attempts attempts were made.
func Retry[T any](ctx context.Context, op func(context.Context) (T, error)) (T, error) {
	var v T
	var err error
	for attempt := 1; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, Timeout)
		v, err = op(actx)
		cancel()
		if err == nil || !Unanswered(err) || ctx.Err() != nil || attempt == Attempts {
			return v, err
		}
		select {
		case <-ctx.Done():
			return v, err
		case <-time.After(time.Duration(attempt) * 100 * time.Millisecond):
		}
	}
}

// Unanswered reports whether err means JetStream did not answer (as
// during a leader election), rather than answered no.
func Unanswered(err error) bool {
	var apiErr *jetstream.APIError
	var legacyErr *nats.APIError
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, nats.ErrTimeout), errors.Is(err, nats.ErrNoResponders),
		errors.Is(err, jetstream.ErrNoStreamResponse),
		// While a server applies new account claims (a revocation
		// pushed), the account's JetStream is briefly not there. A KV
		// watch subscribes through the older nats API, whose errors
		// are its own values: nobody answering a consumer create
		// comes back as nats.ErrJetStreamNotEnabled.
		errors.Is(err, jetstream.ErrJetStreamNotEnabled), errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount),
		errors.Is(err, nats.ErrJetStreamNotEnabled), errors.Is(err, nats.ErrJetStreamNotEnabledForAccount):
		return true
	case errors.As(err, &apiErr):
		return apiErr.Code == 503
	case errors.As(err, &legacyErr):
		return legacyErr.Code == 503
	}
	return false
}
