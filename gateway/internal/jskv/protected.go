package jskv

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// The buckets of the join tokens and agent records are protected streams
// (protectedStreams): the gateways' runtime users may not delete, update,
// purge or restore them, so that nobody with those users can bring back
// a spent token use or a record from before a revocation by restoring an
// old snapshot (which keeps the stream's creation time and sequences,
// all the token check has to go by). The gateway therefore creates them
// with a plain stream create, never nats.go's create-or-update (a
// STREAM.UPDATE), and changes an existing one's configuration only
// through a Admin: on the embedded server a user made for that one
// change, on an external cluster nobody (the operator, with an admin
// credential) unless the gateway's own creds may.

// Admin runs do with a JetStream context whose user may change the
// protected streams, closing it after.
type Admin func(ctx context.Context, do func(jetstream.JetStream) error) error

// DeniesSubject reports whether one of the publish denies covers the
// literal subject subj (a deny may end in > or hold * tokens).
func DeniesSubject(deny []string, subj string) bool {
	have := strings.Split(subj, ".")
	for _, d := range deny {
		pat := strings.Split(d, ".")
		match := true
		for i, tok := range pat {
			if tok == ">" {
				match = i < len(have)
				break
			}
			if i >= len(have) || tok != "*" && tok != have[i] {
				match = false
				break
			}
			if i == len(pat)-1 && len(pat) != len(have) {
				match = false
			}
		}
		if match {
			return true
		}
	}
	return false
}

// StreamConfig is the stream nats.go's KeyValue client makes for kc
// (prepareKeyValueConfig, for the options the gateway uses), with direct
// gets off when the bucket is replicated, so that reads go to the leader
// (see LeaderReads).
func StreamConfig(kc jetstream.KeyValueConfig) jetstream.StreamConfig {
	history, replicas, maxBytes, maxMsgSize := int64(1), kc.Replicas, kc.MaxBytes, int32(kc.MaxValueSize)
	if kc.History > 0 {
		history = int64(kc.History)
	}
	if replicas == 0 {
		replicas = 1
	}
	if maxBytes == 0 {
		maxBytes = -1
	}
	if maxMsgSize == 0 {
		maxMsgSize = -1
	}
	dup := 2 * time.Minute
	if kc.TTL > 0 && kc.TTL < dup {
		dup = kc.TTL
	}
	return jetstream.StreamConfig{
		Name: "KV_" + kc.Bucket, Description: kc.Description, Subjects: []string{"$KV." + kc.Bucket + ".>"},
		MaxMsgsPerSubject: history, MaxBytes: maxBytes, MaxAge: kc.TTL, MaxMsgSize: maxMsgSize,
		// No rollups: a message with a Nats-Rollup header would purge
		// the whole stream, and any user of the account may publish one.
		Storage: kc.Storage, Replicas: replicas, AllowRollup: false, DenyDelete: true, Duplicates: dup,
		MaxMsgs: -1, MaxConsumers: -1, AllowDirect: replicas <= 1, Discard: jetstream.DiscardNew,
	}
}

// ConfigDiffers says what of have's settings want's differ from
// ("" when none does).
func ConfigDiffers(want, have jetstream.StreamConfig) string {
	var d []string
	add := func(differs bool, what string, w, h any) {
		if differs {
			d = append(d, fmt.Sprintf("%s %v (want %v)", what, h, w))
		}
	}
	add(want.Description != have.Description, "description", want.Description, have.Description)
	add(strings.Join(want.Subjects, ",") != strings.Join(have.Subjects, ","), "subjects", want.Subjects, have.Subjects)
	add(want.MaxMsgsPerSubject != have.MaxMsgsPerSubject, "history", want.MaxMsgsPerSubject, have.MaxMsgsPerSubject)
	add(want.MaxBytes != have.MaxBytes, "max_bytes", want.MaxBytes, have.MaxBytes)
	add(want.MaxAge != have.MaxAge, "max_age", want.MaxAge, have.MaxAge)
	add(want.MaxMsgSize != have.MaxMsgSize, "max_msg_size", want.MaxMsgSize, have.MaxMsgSize)
	add(want.MaxMsgs != have.MaxMsgs, "max_msgs", want.MaxMsgs, have.MaxMsgs)
	add(want.Storage != have.Storage, "storage", want.Storage, have.Storage)
	add(want.Replicas != have.Replicas, "replicas", want.Replicas, have.Replicas)
	add(want.AllowRollup != have.AllowRollup, "allow_rollup_hdrs", want.AllowRollup, have.AllowRollup)
	add(want.DenyDelete != have.DenyDelete, "deny_delete", want.DenyDelete, have.DenyDelete)
	add(want.DenyPurge != have.DenyPurge, "deny_purge", want.DenyPurge, have.DenyPurge)
	add(want.AllowDirect != have.AllowDirect, "allow_direct", want.AllowDirect, have.AllowDirect)
	add(want.Discard != have.Discard, "discard", want.Discard, have.Discard)
	add(want.Sealed != have.Sealed, "sealed", want.Sealed, have.Sealed)
	return strings.Join(d, ", ")
}

// withKVSettings is have with want's settings: what the server filled
// in (its defaults, metadata) is kept.
func withKVSettings(have, want jetstream.StreamConfig) jetstream.StreamConfig {
	c := have
	c.Description, c.Subjects, c.MaxMsgsPerSubject, c.MaxBytes = want.Description, want.Subjects, want.MaxMsgsPerSubject, want.MaxBytes
	c.MaxAge, c.MaxMsgSize, c.MaxMsgs, c.Replicas = want.MaxAge, want.MaxMsgSize, want.MaxMsgs, want.Replicas
	c.AllowRollup, c.DenyDelete, c.DenyPurge, c.AllowDirect = want.AllowRollup, want.DenyDelete, want.DenyPurge, want.AllowDirect
	c.Discard, c.Sealed = want.Discard, want.Sealed
	return c
}

// EnsureProtectedBucket creates the protected bucket kc, or opens it and
// brings its configuration in line through admin (with none, it is used
// as it is and the difference logged), retrying for up to patience while
// JetStream starts up.
func EnsureProtectedBucket(js jetstream.JetStream, patience time.Duration, kc jetstream.KeyValueConfig, admin Admin, log *slog.Logger) (jetstream.KeyValue, error) {
	want := StreamConfig(kc)
	deadline := time.Now().Add(patience)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), Timeout)
		kv, err := openProtectedBucket(ctx, js, want, kc.Bucket, admin, log)
		cancel()
		var refused *configRefusedError
		switch {
		case err == nil:
			return kv, nil
		case errors.Is(err, jetstream.ErrJetStreamNotEnabled), errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount):
			return nil, fmt.Errorf("bucket %s needs JetStream, which the NATS server does not offer the fleet account: enable jetstream in its configuration and give the account JetStream limits (see deploy/nats)", kc.Bucket)
		case errors.As(err, &refused), time.Now().After(deadline):
			return nil, fmt.Errorf("bucket %s: %w", kc.Bucket, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// configRefusedError: the server refused the configuration change (a
// storage type it cannot change, say): trying again does not help.
type configRefusedError struct{ err error }

func (e *configRefusedError) Error() string { return e.err.Error() }
func (e *configRefusedError) Unwrap() error { return e.err }

func openProtectedBucket(ctx context.Context, js jetstream.JetStream, want jetstream.StreamConfig, bucket string, admin Admin, log *slog.Logger) (jetstream.KeyValue, error) {
	_, err := js.CreateStream(ctx, want)
	if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		// There with another configuration: an older gateway's, another
		// replica count, or changed by someone else.
		s, serr := js.Stream(ctx, want.Name)
		if serr != nil {
			return nil, serr
		}
		have := s.CachedInfo().Config
		differs := ConfigDiffers(want, have)
		switch {
		case differs == "":
		case admin == nil:
			log.Warn("a protected bucket's configuration differs from this gateway's, and the gateway's NATS user may not update it: update it with an admin credential (deploy/nats/README.md)",
				"stream", want.Name, "differs", differs)
		default:
			update := withKVSettings(have, want)
			err := admin(ctx, func(ajs jetstream.JetStream) error { _, err := ajs.UpdateStream(ctx, update); return err })
			var apiErr *jetstream.APIError
			if errors.As(err, &apiErr) {
				return nil, &configRefusedError{fmt.Errorf("update stream %s (%s): %w", want.Name, differs, err)}
			}
			if err != nil {
				return nil, fmt.Errorf("update stream %s: %w", want.Name, err)
			}
			log.Info("protected bucket's configuration updated", "stream", want.Name, "was", differs)
		}
	} else if err != nil {
		return nil, err
	}
	return js.KeyValue(ctx, bucket)
}
