package protocol

import (
	"bytes"
	"reflect"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

// FuzzDecodeFrame feeds DecodeFrame arbitrary header values. Bits of
// present say which of the four headers exist. DecodeFrame must never
// panic, and what it accepts must survive Encode/DecodeFrame unchanged.
func FuzzDecodeFrame(f *testing.F) {
	f.Add(uint8(0b0111), "output", "c1", "1", "", []byte("hello\n"))
	f.Add(uint8(0b1111), "result", "c1", "3", "2/3", []byte(`{"call_id":"c1"}`))
	f.Add(uint8(0b1111), "call", "abc_DEF-9", "18446744073709551615", "8192/8192", []byte{})
	f.Add(uint8(0b0111), "keepalive", "k", "0", "", []byte(nil))
	f.Add(uint8(0b1111), "progress", "p", "007", "01/02", []byte("50%"))
	f.Add(uint8(0b1111), "result", "c1", "1", "+1/2", []byte("x"))
	f.Add(uint8(0b0111), "result", "c1", "1", "", []byte("x"))
	f.Add(uint8(0b1111), "call", "c.1", "-1", "0/0", []byte("x"))
	f.Add(uint8(0b1111), "output", "c1", "1", "1/8193", []byte("x"))
	f.Add(uint8(0b0110), "", "c1", "1", "", []byte("x"))
	f.Add(uint8(0b1111), "bogus", "c*", "x", "a/b", []byte("x"))
	f.Fuzz(func(t *testing.T, present uint8, kind, callID, seq, part string, body []byte) {
		h := Header{}
		for i, kv := range [][2]string{{HeaderKind, kind}, {HeaderCall, callID}, {HeaderSeq, seq}, {HeaderPart, part}} {
			if present&(1<<i) != 0 {
				h[kv[0]] = []string{kv[1]}
			}
		}
		fr, err := DecodeFrame(h, body)
		if err != nil {
			if err.Error() == "" {
				t.Fatalf("DecodeFrame(%v) returned an empty error", h)
			}
			return
		}
		switch fr.Kind {
		case KindOutput, KindProgress, KindKeepalive:
		case KindResult, KindCall:
			if fr.Parts == 0 {
				t.Fatalf("DecodeFrame(%v) accepted a %s frame without parts: %+v", h, fr.Kind, fr)
			}
		default:
			t.Fatalf("DecodeFrame(%v) accepted kind %q", h, fr.Kind)
		}
		if err := ValidateCallID(fr.CallID); err != nil {
			t.Fatalf("DecodeFrame(%v) accepted call id %q: %v", h, fr.CallID, err)
		}
		if fr.Parts != 0 && (fr.Part < 1 || fr.Part > fr.Parts || fr.Parts > MaxParts) {
			t.Fatalf("DecodeFrame(%v) accepted part %d of %d", h, fr.Part, fr.Parts)
		}
		if !bytes.Equal(fr.Data, body) {
			t.Fatalf("DecodeFrame changed the body")
		}
		h2, body2 := fr.Encode()
		fr2, err := DecodeFrame(h2, body2)
		if err != nil {
			t.Fatalf("DecodeFrame(Encode(%+v)) = %v", fr, err)
		}
		if !reflect.DeepEqual(fr, fr2) {
			t.Fatalf("re-encoding changed the frame:\n got %+v\nwant %+v", fr2, fr)
		}
	})
}

// FuzzValidateHost checks that every accepted host ID is safe to put in a
// subject, and that HostFromName always produces an accepted one.
func FuzzValidateHost(f *testing.F) {
	for _, s := range []string{
		"web-1", "a", "web.example.com", "*", ">", "web 1", "-web", "_", "wéb", "日本",
		"WEB_01", "a\tb", "a\u00a0b", "\x00", "\xff", strings.Repeat("a", 64), strings.Repeat("a", 65),
		"My Laptop (2).local", "",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if ValidateHost(s) == nil {
			if s == "" || len(s) > MaxHostLen {
				t.Fatalf("ValidateHost accepted %q (%d bytes)", s, len(s))
			}
			if strings.ContainsAny(s, ".*>") {
				t.Fatalf("ValidateHost accepted %q, which has a subject separator or wildcard", s)
			}
			if strings.IndexFunc(s, unicode.IsSpace) >= 0 || strings.IndexFunc(s, unicode.IsControl) >= 0 {
				t.Fatalf("ValidateHost accepted %q, which has whitespace or control characters", s)
			}
			if !utf8.ValidString(s) || utf8.RuneCountInString(s) != len(s) {
				t.Fatalf("ValidateHost accepted non-ASCII %q", s)
			}
			if s[0] == '-' || s[0] == '_' {
				t.Fatalf("ValidateHost accepted %q, which does not start with a letter or digit", s)
			}
			// The host is exactly one token of its subjects.
			tokens := strings.Split(CallSubject(s), ".")
			if len(tokens) != 5 || tokens[3] != s {
				t.Fatalf("CallSubject(%q) = %q does not hold the host as one token", s, CallSubject(s))
			}
		}
		name := HostFromName(s)
		if err := ValidateHost(name); err != nil {
			t.Fatalf("HostFromName(%q) = %q is invalid: %v", s, name, err)
		}
		if again := HostFromName(name); again != name {
			t.Fatalf("HostFromName is not stable: %q -> %q -> %q", s, name, again)
		}
	})
}

// FuzzSplitAssemble checks that splitting a message and assembling the
// parts (carried as encoded frames) gives back the original bytes.
func FuzzSplitAssemble(f *testing.F) {
	f.Add([]byte(""), 4)
	f.Add([]byte("hello, world"), 4)
	f.Add([]byte("hello, world"), 5)
	f.Add([]byte("x"), 0)
	f.Add(bytes.Repeat([]byte("ab"), 100), 1)
	f.Add(bytes.Repeat([]byte{0}, MaxParts+1), 1)
	f.Add([]byte("negative"), -3)
	f.Fuzz(func(t *testing.T, data []byte, size int) {
		parts, err := Split(data, size)
		eff := size
		if eff <= 0 {
			eff = ChunkSize
		}
		if err != nil {
			if len(data) <= MaxParts*eff {
				t.Fatalf("Split(%d bytes, %d): %v", len(data), size, err)
			}
			return
		}
		if len(parts) < 1 || len(parts) > MaxParts {
			t.Fatalf("Split(%d bytes, %d) = %d parts", len(data), size, len(parts))
		}
		for _, limit := range []int{0, len(data), len(data) - 1} {
			if limit < 0 {
				continue
			}
			a := NewAssembly(limit)
			var aerr error
			for i, p := range parts {
				h, body := Frame{Kind: KindResult, CallID: "c1", Seq: uint64(i + 1), Part: i + 1, Parts: len(parts), Data: p}.Encode()
				fr, err := DecodeFrame(h, body)
				if err != nil {
					t.Fatalf("part %d of %d (header %v): %v", i+1, len(parts), h, err)
				}
				done, err := a.Add(fr)
				if err != nil {
					aerr = err
					break
				}
				if done != (i == len(parts)-1) {
					t.Fatalf("Add(part %d of %d) done = %v", i+1, len(parts), done)
				}
			}
			tooBig := limit > 0 && len(data) > limit
			switch {
			case tooBig && aerr == nil:
				t.Fatalf("assembly with limit %d accepted %d bytes", limit, len(data))
			case !tooBig && aerr != nil:
				t.Fatalf("assembly with limit %d of %d bytes: %v", limit, len(data), aerr)
			case !tooBig && !bytes.Equal(a.Bytes(), data):
				t.Fatalf("assembled %d bytes differ from the %d bytes split (size %d)", len(a.Bytes()), len(data), size)
			}
		}
	})
}

// FuzzDecodeResult: arbitrary bytes never panic DecodeResult, and whatever
// it accepts survives a round trip unchanged.
func FuzzDecodeResult(f *testing.F) {
	seed := []*Result{
		{CallID: "c1", Content: []Content{Text("hello\n")}},
		{CallID: "c2", Content: []Content{Text("a"), {Type: "image", MIMEType: "image/png", Data: []byte{0x89, 'P', 'N', 'G'}}}, IsError: true},
		{CallID: "c3", Structured: []byte(`{"ok":true}`), Content: []Content{Text(`{"ok":true}`)}},
		{CallID: "c4", Error: &Error{Code: CodeBusy, Message: "busy"}},
	}
	for _, r := range seed {
		data, err := EncodeResult(r)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte("{}\n"))
	f.Add([]byte(`{"content":[{"type":"text","len":99}]}` + "\nshort"))
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := DecodeResult(data)
		if err != nil {
			return
		}
		// The first encoding normalises (compacts structured JSON); from
		// then on encoding and decoding must be exact inverses.
		once, err := EncodeResult(r)
		if err != nil {
			t.Fatalf("decoded result does not encode: %v", err)
		}
		r2, err := DecodeResult(once)
		if err != nil {
			t.Fatalf("re-encoded result does not decode: %v\n%q", err, once)
		}
		twice, err := EncodeResult(r2)
		if err != nil || !bytes.Equal(once, twice) {
			t.Fatalf("round trip is not stable (%v):\n%q\n%q", err, once, twice)
		}
	})
}
