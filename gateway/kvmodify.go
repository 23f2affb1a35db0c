package gateway

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// modifyCAS applies change to a record with compare-and-swap: it reads
// the record and its revision with get, lets change edit it, and writes
// it with put at that revision, reading again as often as put reports
// changed (another writer came first). change returns errSkip when there
// is nothing to write.
func modifyCAS[T any](ctx context.Context, get func() (T, uint64, error), put func(T, uint64) error, changed error, change func(T) error) (T, error) {
	var zero T
	for {
		rec, rev, err := get()
		if err != nil {
			return zero, err
		}
		if err := change(rec); errors.Is(err, errSkip) {
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

// errSkip tells modifyCAS that the record needs no write.
var errSkip = errors.New("no change")

// jsAttempts bounds the attempts of an idempotent JetStream request
// (retryJS); each has jsTimeout.
const jsAttempts = 4

// retryJS runs op, an idempotent JetStream request (a read, or a write
// made so that doing it twice is no different from once), with a
// fresh jsTimeout for each attempt, again while JetStream does not answer
// (a leader election: no reply at all, or no responders) until it
// answers, ctx ends, or jsAttempts were made.
func retryJS[T any](ctx context.Context, op func(context.Context) (T, error)) (T, error) {
	var v T
	var err error
	for attempt := 1; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, jsTimeout)
		v, err = op(actx)
		cancel()
		if err == nil || !jsUnanswered(err) || ctx.Err() != nil || attempt == jsAttempts {
			return v, err
		}
		select {
		case <-ctx.Done():
			return v, err
		case <-time.After(time.Duration(attempt) * 100 * time.Millisecond):
		}
	}
}

// jsUnanswered reports whether err means JetStream did not answer (as
// during a leader election), rather than answered no.
func jsUnanswered(err error) bool {
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
