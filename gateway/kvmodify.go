package gateway

import (
	"context"
	"errors"
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
