package protocol

import (
	"crypto/sha256"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

// TestEncodeCallParts: the parts of a call joined are a JSON encoding of
// it, each part at most the given size, numbered in order; the arguments
// arrive as they were given.
func TestEncodeCallParts(t *testing.T) {
	for _, tc := range []struct {
		name string
		args string
		size int
	}{
		{"small", `{"host":"web-1","command":"ls"}`, 0},
		{"no arguments", ``, 0},
		{"null", `null`, 7},
		{"spaces kept", ` { "host" : "web-1" } `, 5},
		{"large", `{"host":"web-1","content":"` + strings.Repeat("0123456789", 100000) + `"}`, ChunkSize},
		{"exact multiple", `"` + strings.Repeat("x", 98) + `"`, 16},
		{"size one", `[1,2]`, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Call{ID: "c1", Protocol: Version, Host: "web-1", Tool: "write", Caller: Caller{Subject: "u", Name: "Ü <ser>"}, TimeoutMS: 60000, Args: json.RawMessage(tc.args)}
			var joined []byte
			next := 1
			size := tc.size
			if size <= 0 {
				size = ChunkSize
			}
			var signedSize int64
			var signedSum [32]byte
			sign := func(n int64, sum [32]byte) (string, error) {
				signedSize, signedSum = n, sum
				return "envelope", nil
			}
			err := EncodeCallParts(&c, tc.size, sign, func(part, parts int, auth string, data []byte) error {
				if part != next || part > parts || len(data) > size || len(data) == 0 {
					t.Fatalf("part %d of %d with %d bytes (want part %d, at most %d bytes)", part, parts, len(data), next, size)
				}
				if (part == 1) != (auth == "envelope") {
					t.Fatalf("part %d carries the envelope %q; only the first part does", part, auth)
				}
				next++
				joined = append(joined, data...)
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if signedSize != int64(len(joined)) || signedSum != sha256.Sum256(joined) {
				t.Errorf("signed a body of %d bytes, sent %d, or another digest", signedSize, len(joined))
			}
			var back Call
			if err := json.Unmarshal(joined, &back); err != nil {
				t.Fatalf("joined parts are not JSON: %v\n%.300s", err, joined)
			}
			want := c
			if tc.args == "" {
				want.Args = json.RawMessage("null")
			}
			if string(back.Args) != strings.TrimSpace(string(want.Args)) && string(back.Args) != string(want.Args) {
				t.Errorf("arguments changed: %.100q", back.Args)
			}
			back.Args, want.Args = nil, nil
			if !reflect.DeepEqual(back, want) {
				t.Errorf("call = %+v, want %+v", back, want)
			}
		})
	}
	c := Call{ID: "c1", Args: json.RawMessage(`{"a":`)}
	noSend := func(int, int, string, []byte) error { return nil }
	if err := EncodeCallParts(&c, 0, nil, noSend); err == nil {
		t.Error("arguments that are not JSON were sent")
	}
	c.Args = json.RawMessage(`"` + strings.Repeat("x", MaxParts) + `"`)
	if err := EncodeCallParts(&c, 1, nil, noSend); err == nil || !strings.Contains(err.Error(), "at most 8192") {
		t.Errorf("a call of more than MaxParts parts: %v", err)
	}
}
