package protocol

import (
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
)

// EncodeCallParts passes c's JSON encoding to send in parts of at most
// size bytes (ChunkSize when size ≤ 0), in order, each with its 1-based
// number and the number of parts. It never builds the whole encoding:
// c.Args, which may be most of it (a file's content), is copied straight
// into each part, so a call costs one part of memory beyond its
// arguments. The parts of one call share a buffer: send must not keep
// data after it returns. c.Args must be one JSON value (empty: null); it
// is forwarded as it is, not re-encoded.
//
// Before the first part, sign (when not nil) gets the size and SHA-256 of
// the whole encoding, and what it returns (the call's signed envelope)
// goes with the first part only: the digest binds the other parts to it.
func EncodeCallParts(c *Call, size int, sign func(size int64, sum [sha256.Size]byte) (string, error),
	send func(part, parts int, auth string, data []byte) error) error {
	if size <= 0 {
		size = ChunkSize
	}
	args := []byte(c.Args)
	if len(args) == 0 {
		args = []byte("null")
	} else if !json.Valid(args) {
		return errors.New("encode call: its arguments are not one JSON value")
	}
	head := *c
	head.Args = json.RawMessage("0")
	prefix, err := json.Marshal(&head)
	if err != nil {
		return fmt.Errorf("encode call: %w", err)
	}
	// Args is the last field: the encoding ends with "0}".
	const tail = `0}`
	if len(prefix) < len(tail) || string(prefix[len(prefix)-len(tail):]) != tail {
		return errors.New("encode call: unexpected encoding of a call without arguments")
	}
	prefix = prefix[:len(prefix)-len(tail)]
	segments := [][]byte{prefix, args, []byte("}")}
	total := len(prefix) + len(args) + 1
	parts := (total + size - 1) / size
	if parts > MaxParts {
		return fmt.Errorf("call of %d bytes needs %d parts of %d bytes; at most %d are allowed", total, parts, size, MaxParts)
	}
	auth := ""
	if sign != nil {
		h := sha256.New()
		for _, seg := range segments {
			h.Write(seg)
		}
		var sum [sha256.Size]byte
		h.Sum(sum[:0])
		if auth, err = sign(int64(total), sum); err != nil {
			return fmt.Errorf("sign call: %w", err)
		}
	}
	buf := make([]byte, 0, min(size, total))
	part := 1
	for _, seg := range segments {
		for len(seg) > 0 {
			n := min(size-len(buf), len(seg))
			buf = append(buf, seg[:n]...)
			seg = seg[n:]
			if len(buf) == size {
				if err := send(part, parts, auth, buf); err != nil {
					return err
				}
				part++
				buf, auth = buf[:0], ""
			}
		}
	}
	if len(buf) > 0 {
		return send(part, parts, auth, buf)
	}
	return nil
}
