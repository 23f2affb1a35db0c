package skills

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// This file signs the stored skill records again after the gateway's key
// changed (a rotation of its signing key): every manifest and desired
// state signed by the old key is signed again with the new one, so that
// hosts still take them once the old key is retired. A record is signed
// again only when a key the gateway takes its own signatures by signed it
// (anything else in the buckets is not this fleet's and stays as it is,
// for hosts to refuse), and written with compare-and-swap, so that a
// newer record written meanwhile wins.

// resignStored signs the stored records again; it returns how many it
// rewrote.
func (s *Store) resignStored(ctx context.Context) (int, error) {
	n := 0
	for _, b := range []struct {
		kv     jetstream.KeyValue
		resign func([]byte) ([]byte, bool)
	}{{s.bundles, s.resignBundle}, {s.desired, s.resignDesiredRecord}} {
		lister, err := b.kv.ListKeys(ctx)
		if errors.Is(err, jetstream.ErrNoKeysFound) {
			continue
		}
		if err != nil {
			return n, fmt.Errorf("list %s: %w", b.kv.Bucket(), err)
		}
		for key := range lister.Keys() {
			e, err := b.kv.Get(ctx, key)
			if err != nil {
				continue // deleted meanwhile
			}
			data, changed := b.resign(e.Value())
			if !changed {
				continue
			}
			if _, err := b.kv.Update(ctx, key, data, e.Revision()); err == nil {
				n++
			} else if !errors.Is(err, jetstream.ErrKeyRevisionMismatch) && !errors.Is(err, jetstream.ErrKeyExists) {
				_ = lister.Stop()
				return n, fmt.Errorf("write %s %s: %w", b.kv.Bucket(), key, err)
			}
		}
		if err := ctx.Err(); err != nil {
			return n, err
		}
	}
	return n, nil
}

// resignBundle signs a stored bundle record's manifest again.
func (s *Store) resignBundle(data []byte) ([]byte, bool) {
	var rec bundleRecord
	if json.Unmarshal(data, &rec) != nil {
		return nil, false
	}
	sig := s.signer.Resign(protocol.PurposeManifest, rec.Manifest.CanonicalBytes(), rec.Signature)
	if sig == rec.Signature {
		return nil, false
	}
	rec.Signature = sig
	out, err := json.Marshal(&rec)
	return out, err == nil
}

// resignDesiredRecord signs a stored desired state again.
func (s *Store) resignDesiredRecord(data []byte) ([]byte, bool) {
	out := s.resignDesired(data)
	return out, string(out) != string(data)
}

// ResignInBackground signs the stored records again on the store's
// own goroutine, logging what it did.
func (s *Store) ResignInBackground() {
	s.wg.Go(func() {
		n, err := s.resignStored(s.ctx)
		if err != nil {
			s.log.Error("skills: the stored records could not all be signed with the new key; a reload tries again", "signed", n, "err", err)
			return
		}
		s.log.Info("skills: stored records signed with the new key", "records", n)
	})
}
