package protocol

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// golden compares got with testdata/name, or rewrites the file with -update.
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./protocol -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s changed: this is a wire format change; if it is intended, run go test ./protocol -update and bump Version for incompatible changes.\n--- got\n%s\n--- want\n%s", path, got, want)
	}
}

func TestValidateHost(t *testing.T) {
	long64 := strings.Repeat("a", 64)
	long65 := strings.Repeat("b", 65)
	good := []string{"web-1", "a", "Z", "0", "9lives", "web_1", "WEB-01", "a-", "a_", "x-y_z-0", long64}
	for _, id := range good {
		if err := ValidateHost(id); err != nil {
			t.Errorf("ValidateHost(%q) = %v, want nil", id, err)
		}
	}
	bad := []struct {
		id   string
		want []string // substrings of the error message
	}{
		{"", []string{"empty"}},
		{long65, []string{"65 characters", "64"}},
		{".", []string{`"."`, "position 1"}},
		{"web.1", []string{`"."`, "position 4"}},
		{"*", []string{`"*"`, "position 1"}},
		{"web*", []string{`"*"`, "position 4"}},
		{">", []string{`">"`, "position 1"}},
		{"web>", []string{`">"`, "position 4"}},
		{" web", []string{`" "`, "position 1"}},
		{"web 1", []string{`" "`, "position 4"}},
		{"web\t1", []string{`"\t"`, "position 4"}},
		{"web\n", []string{`"\n"`, "position 4"}},
		{"web\r", []string{"position 4"}},
		{"\x00", []string{"position 1"}},
		{"-web", []string{`"-"`, "position 1", "starting with a letter or digit"}},
		{"_web", []string{`"_"`, "position 1"}},
		{"web/1", []string{`"/"`}},
		{"web:1", []string{`":"`}},
		{"wéb", []string{"position 2", `"é"`}},
		{"ü", []string{"position 1", `"ü"`}},
		{"web\u00a01", []string{"position 4"}}, // no-break space
		{"日本", []string{"position 1", `"日"`}},
	}
	for _, tc := range bad {
		err := ValidateHost(tc.id)
		if err == nil {
			t.Errorf("ValidateHost(%q) = nil, want an error", tc.id)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("ValidateHost(%q) = %q, want it to mention %s", tc.id, err, w)
			}
		}
	}
}

func TestHostFromName(t *testing.T) {
	tests := []struct{ in, want string }{
		{"web-1", "web-1"},
		{"web-1.example.com", "web-1"},
		{"WEB01.Corp.Example", "web01"},
		{"My_Host", "my-host"},
		{"host name", "host-name"},
		{"-leading", "leading"},
		{"__x", "x"},
		{"trailing-", "trailing-"},
		{"", "host"},
		{".example.com", "host"},
		{"***", "host"},
		{"-", "host"},
		{"ünïcode", "n--code"},
		{"a*b>c", "a-b-c"},
		{strings.Repeat("A", 70), strings.Repeat("a", 64)},
		{strings.Repeat("ab-", 30), strings.Repeat("ab-", 21) + "a"},
	}
	for _, tc := range tests {
		got := HostFromName(tc.in)
		if got != tc.want {
			t.Errorf("HostFromName(%q) = %q, want %q", tc.in, got, tc.want)
		}
		if err := ValidateHost(got); err != nil {
			t.Errorf("HostFromName(%q) = %q, which is not a valid host: %v", tc.in, got, err)
		}
	}
}

func TestValidateCallID(t *testing.T) {
	good := []string{"c", "0", "abc-DEF_123", strings.Repeat("x", MaxCallIDLen)}
	for _, id := range good {
		if err := ValidateCallID(id); err != nil {
			t.Errorf("ValidateCallID(%q) = %v, want nil", id, err)
		}
	}
	bad := []struct{ id, want string }{
		{"", "1 to 64 characters"},
		{strings.Repeat("x", MaxCallIDLen+1), "1 to 64 characters"},
		{"a.b", `"."`},
		{"a*", `"*"`},
		{"a>", `">"`},
		{"a b", `" "`},
		{"a/b", `"/"`},
		{"a\x00", "only letters, digits"},
		{"é", "only letters, digits"},
	}
	for _, tc := range bad {
		err := ValidateCallID(tc.id)
		if err == nil {
			t.Errorf("ValidateCallID(%q) = nil, want an error", tc.id)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ValidateCallID(%q) = %q, want it to mention %s", tc.id, err, tc.want)
		}
	}
}

func seqBytes(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i % 251)
	}
	return b
}

func TestSplit(t *testing.T) {
	tests := []struct {
		name      string
		n, size   int
		wantParts int
		wantErr   string
	}{
		{"empty", 0, 4, 1, ""},
		{"smaller than size", 3, 4, 1, ""},
		{"exactly size", 4, 4, 1, ""},
		{"exact multiple", 12, 4, 3, ""},
		{"one byte over", 13, 4, 4, ""},
		{"size 1", 5, 1, 5, ""},
		{"zero size means ChunkSize", ChunkSize, 0, 1, ""},
		{"zero size means ChunkSize, over", ChunkSize + 1, 0, 2, ""},
		{"negative size means ChunkSize", 2*ChunkSize + 1, -7, 3, ""},
		{"exactly MaxParts", MaxParts, 1, MaxParts, ""},
		{"MaxParts overflow", MaxParts + 1, 1, 0, fmt.Sprintf("needs %d parts", MaxParts+1)},
		{"MaxParts overflow, larger size", 2*MaxParts + 1, 2, 0, fmt.Sprintf("at most %d", MaxParts)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			data := seqBytes(tc.n)
			parts, err := Split(data, tc.size)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Split(%d bytes, %d) error = %v, want one mentioning %q", tc.n, tc.size, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Split(%d bytes, %d): %v", tc.n, tc.size, err)
			}
			if len(parts) != tc.wantParts {
				t.Fatalf("Split(%d bytes, %d) = %d parts, want %d", tc.n, tc.size, len(parts), tc.wantParts)
			}
			size := tc.size
			if size <= 0 {
				size = ChunkSize
			}
			for i, p := range parts {
				if len(p) > size {
					t.Errorf("part %d is %d bytes, more than %d", i+1, len(p), size)
				}
				if i < len(parts)-1 && len(p) != size {
					t.Errorf("part %d of %d is %d bytes, want a full %d", i+1, len(parts), len(p), size)
				}
			}
			if got := bytes.Join(parts, nil); !bytes.Equal(got, data) {
				t.Errorf("parts joined differ from the input")
			}
		})
	}
}

// Appending to a part (as a sender adding a trailer might) must not
// overwrite the next part.
func TestSplitPartsDoNotAlias(t *testing.T) {
	data := seqBytes(10)
	parts, err := Split(data, 4)
	if err != nil {
		t.Fatal(err)
	}
	_ = append(parts[0], 0xff, 0xff)
	if want := seqBytes(10)[4:8]; !bytes.Equal(parts[1], want) {
		t.Errorf("appending to part 1 changed part 2: %v", parts[1])
	}
}

func frame(part, parts int, data string) Frame {
	return Frame{Kind: KindResult, CallID: "c1", Seq: uint64(part), Part: part, Parts: parts, Data: []byte(data)}
}

func TestAssembly(t *testing.T) {
	tests := []struct {
		name    string
		limit   int
		frames  []Frame
		want    string // assembled message when all frames are accepted
		wantErr string // error expected on the last frame
	}{
		{"single part", 0, []Frame{frame(1, 1, "hello")}, "hello", ""},
		{"empty single part", 0, []Frame{frame(1, 1, "")}, "", ""},
		{"in order", 0, []Frame{frame(1, 3, "ab"), frame(2, 3, "cd"), frame(3, 3, "e")}, "abcde", ""},
		{"exactly at limit", 5, []Frame{frame(1, 2, "abc"), frame(2, 2, "de")}, "abcde", ""},
		{"first part lost", 0, []Frame{frame(2, 2, "cd")}, "", "expected part 1"},
		{"gap", 0, []Frame{frame(1, 3, "ab"), frame(3, 3, "e")}, "", "got part 3 of 3, expected part 2"},
		{"duplicate", 0, []Frame{frame(1, 3, "ab"), frame(1, 3, "ab")}, "", "expected part 2"},
		{"part count grows", 0, []Frame{frame(1, 2, "ab"), frame(2, 3, "cd")}, "", "part count changed from 2 to 3"},
		{"part count shrinks", 0, []Frame{frame(1, 3, "ab"), frame(2, 2, "cd")}, "", "part count changed from 3 to 2"},
		{"limit exceeded", 4, []Frame{frame(1, 2, "abc"), frame(2, 2, "de")}, "", "exceeds 4 bytes"},
		{"limit exceeded by first part", 2, []Frame{frame(1, 1, "abc")}, "", "exceeds 2 bytes"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a := NewAssembly(tc.limit)
			for i, f := range tc.frames {
				last := i == len(tc.frames)-1
				done, err := a.Add(f)
				if last && tc.wantErr != "" {
					if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
						t.Fatalf("Add(part %d/%d) error = %v, want one mentioning %q", f.Part, f.Parts, err, tc.wantErr)
					}
					if !strings.Contains(err.Error(), f.CallID) {
						t.Errorf("error %q does not name call %s", err, f.CallID)
					}
					if done {
						t.Errorf("Add reported done together with an error")
					}
					return
				}
				if err != nil {
					t.Fatalf("Add(part %d/%d): %v", f.Part, f.Parts, err)
				}
				if done != last {
					t.Fatalf("Add(part %d/%d) done = %v, want %v", f.Part, f.Parts, done, last)
				}
			}
			if got := string(a.Bytes()); got != tc.want {
				t.Errorf("Bytes() = %q, want %q", got, tc.want)
			}
		})
	}
}

// subjectBuilders lists every subject builder with its output for host
// web-1. TestSubjectBuildersListed keeps it complete.
func subjectBuilders(host string) []struct{ name, subject string } {
	return []struct{ name, subject string }{
		{"CallSubject", CallSubject(host)},
		{"CancelSubject", CancelSubject(host)},
		{"FetchSubject", FetchSubject(host)},
		{"HostSubjects", HostSubjects(host)},
		{"PresenceSubject", PresenceSubject(host)},
		{"PresenceWildcard", PresenceWildcard()},
		{"AllPresence", AllPresence()},
		{"DiscoverSubject", DiscoverSubject()},
		{"AllHosts", AllHosts()},
		{"AgentInboxPrefix", AgentInboxPrefix(host)},
		{"GatewayInboxPrefix", GatewayInboxPrefix()},
		{"ReplySubject", ReplySubject(GatewayInboxPrefix()+".g1", host)},
		{"ReplyWildcard", ReplyWildcard(GatewayInboxPrefix() + ".g1")},
		{"HostFromReply", HostFromReply(ReplySubject(GatewayInboxPrefix()+".g1", host))},
		{"HostFromPresence", HostFromPresence(PresenceSubject(host))},
		{"KeysSubject", KeysSubject(host)},
		{"KeysPushSubject", KeysPushSubject(host)},
		{"RefusedSubject", RefusedSubject(host)},
	}
}

// unversioned builders produce inbox subjects (not under fleet.vN) or
// parse subjects into IDs.
var unversioned = map[string]bool{
	"AgentInboxPrefix": true, "GatewayInboxPrefix": true, "ReplySubject": true,
	"ReplyWildcard": true, "HostFromReply": true, "HostFromPresence": true,
}

// wildcardBuilders may (and must) produce NATS wildcards.
var wildcardBuilders = map[string]bool{
	"HostSubjects": true, "PresenceWildcard": true, "AllPresence": true, "AllHosts": true, "ReplyWildcard": true,
}

func TestSubjectsGolden(t *testing.T) {
	var b strings.Builder
	for _, s := range subjectBuilders("web-1") {
		fmt.Fprintf(&b, "%s %s\n", s.name, s.subject)
	}
	golden(t, "subjects.golden", []byte(b.String()))
}

// Every exported string-returning function in subjects.go must be covered by
// the golden file, so a new subject cannot escape review.
func TestSubjectBuildersListed(t *testing.T) {
	fset := token.NewFileSet()
	file, err := parser.ParseFile(fset, "subjects.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var listed []string
	for _, s := range subjectBuilders("web-1") {
		listed = append(listed, s.name)
	}
	var found []string
	for _, d := range file.Decls {
		fn, ok := d.(*ast.FuncDecl)
		if !ok || fn.Recv != nil || !fn.Name.IsExported() {
			continue
		}
		found = append(found, fn.Name.Name)
		if !slices.Contains(listed, fn.Name.Name) {
			t.Errorf("subject builder %s is not in subjectBuilders (and so not in testdata/subjects.golden)", fn.Name.Name)
		}
	}
	for _, name := range listed {
		if !slices.Contains(found, name) {
			t.Errorf("subjectBuilders lists %s, which subjects.go does not define", name)
		}
	}
}

func TestSubjectsWellFormed(t *testing.T) {
	hosts := []string{"web-1", "a", "Z9", "x_y", strings.Repeat("h", MaxHostLen)}
	for _, host := range hosts {
		for _, s := range subjectBuilders(host) {
			if s.subject == "" {
				t.Errorf("%s(%q) is empty", s.name, host)
				continue
			}
			tokens := strings.Split(s.subject, ".")
			for i, tok := range tokens {
				if tok == "" {
					t.Errorf("%s(%q) = %q has an empty token", s.name, host, s.subject)
				}
				if strings.ContainsAny(tok, " \t\r\n") {
					t.Errorf("%s(%q) = %q contains whitespace", s.name, host, s.subject)
				}
				wild := strings.ContainsAny(tok, "*>")
				switch {
				case wild && !wildcardBuilders[s.name]:
					t.Errorf("%s(%q) = %q contains a wildcard", s.name, host, s.subject)
				case wild && tok != "*" && tok != ">":
					t.Errorf("%s(%q) = %q: wildcard inside token %q", s.name, host, s.subject, tok)
				case tok == ">" && i != len(tokens)-1:
					t.Errorf("%s(%q) = %q: '>' is not the last token", s.name, host, s.subject)
				}
			}
			if wildcardBuilders[s.name] && !strings.ContainsAny(s.subject, "*>") {
				t.Errorf("%s(%q) = %q matches only itself; it should be a wildcard", s.name, host, s.subject)
			}
			if !unversioned[s.name] && !strings.HasPrefix(s.subject, fmt.Sprintf("fleet.v%d.", Version)) {
				t.Errorf("%s(%q) = %q is not versioned", s.name, host, s.subject)
			}
		}
	}
}

// matches reports whether NATS would deliver subject to a subscription on
// pattern.
func matches(pattern, subject string) bool {
	p, s := strings.Split(pattern, "."), strings.Split(subject, ".")
	for i, tok := range p {
		switch {
		case tok == ">":
			return len(s) > i
		case i >= len(s):
			return false
		case tok != "*" && tok != s[i]:
			return false
		}
	}
	return len(p) == len(s)
}

// The permissions the gateway hands out are built from these wildcards, so
// they must cover exactly the intended subjects.
func TestSubjectMatching(t *testing.T) {
	hosts := []string{"web", "web-1", "web-10", "W", "db_2"}
	for _, h := range hosts {
		own := []string{CallSubject(h), CancelSubject(h), FetchSubject(h)}
		for _, s := range own {
			if !matches(HostSubjects(h), s) {
				t.Errorf("HostSubjects(%q) = %q does not match %q", h, HostSubjects(h), s)
			}
			if !matches(AllHosts(), s) {
				t.Errorf("AllHosts() = %q does not match %q", AllHosts(), s)
			}
			for _, w := range []string{PresenceWildcard(), AllPresence(), DiscoverSubject()} {
				if matches(w, s) {
					t.Errorf("%q matches host subject %q", w, s)
				}
			}
			if s == PresenceSubject(h) {
				t.Errorf("host subject %q equals the presence subject", s)
			}
		}
		for _, w := range []string{PresenceWildcard(), AllPresence()} {
			if !matches(w, PresenceSubject(h)) {
				t.Errorf("%q does not match PresenceSubject(%q) = %q", w, h, PresenceSubject(h))
			}
		}
		if matches(AllHosts(), PresenceSubject(h)) || matches(AllHosts(), DiscoverSubject()) {
			t.Errorf("AllHosts() = %q matches a presence or discover subject", AllHosts())
		}
		for _, other := range hosts {
			if other == h {
				continue
			}
			for _, s := range []string{CallSubject(other), CancelSubject(other), FetchSubject(other), PresenceSubject(other)} {
				if matches(HostSubjects(h), s) {
					t.Errorf("HostSubjects(%q) = %q matches %q of host %q", h, HostSubjects(h), s, other)
				}
			}
		}
	}
}

// An agent must never be given the gateway's inbox prefix, or it could read
// every call's replies; nor may two agents share one.
func TestInboxPrefixesDistinct(t *testing.T) {
	hosts := []string{"web-1", "GW", "gw", "GW-1", "G", "INBOX", "_", "a"}
	seen := map[string]string{GatewayInboxPrefix(): "the gateway"}
	for _, h := range hosts {
		if ValidateHost(h) != nil {
			continue
		}
		p := AgentInboxPrefix(h)
		if strings.ContainsAny(p, ".*> \t") {
			t.Errorf("AgentInboxPrefix(%q) = %q contains a subject separator, wildcard or space", h, p)
		}
		if owner, ok := seen[p]; ok {
			t.Errorf("AgentInboxPrefix(%q) = %q is also the inbox prefix of %s", h, p, owner)
		}
		seen[p] = "host " + h
	}
}

func TestFrameRoundTrip(t *testing.T) {
	frames := []Frame{
		{Kind: KindOutput, CallID: "c1", Seq: 1, Data: []byte("hello\n")},
		{Kind: KindOutput, CallID: "c1", Seq: 2, Data: []byte{0, 0xff, '\n'}},
		{Kind: KindProgress, CallID: "call_2", Seq: 3, Data: []byte("50%")},
		{Kind: KindKeepalive, CallID: "K-3", Seq: 1<<64 - 1, Data: []byte{}},
		{Kind: KindResult, CallID: "c1", Seq: 4, Part: 1, Parts: 1, Data: []byte(`{"call_id":"c1"}`)},
		{Kind: KindResult, CallID: "c1", Seq: 5, Part: 2, Parts: 3, Data: []byte("middle")},
		{Kind: KindCall, CallID: "c9", Seq: 1, Part: MaxParts, Parts: MaxParts, Data: []byte(`{}`)},
		{Kind: KindCall, CallID: strings.Repeat("z", MaxCallIDLen), Seq: 0, Part: 1, Parts: 2, Data: []byte("x")},
	}
	kinds := map[FrameKind]bool{}
	for _, f := range frames {
		kinds[f.Kind] = true
		h, body := f.Encode()
		got, err := DecodeFrame(h, body)
		if err != nil {
			t.Errorf("DecodeFrame(Encode(%+v)): %v", f, err)
			continue
		}
		if !reflect.DeepEqual(got, f) {
			t.Errorf("round trip changed the frame:\n got %+v\nwant %+v", got, f)
		}
	}
	for _, k := range []FrameKind{KindOutput, KindProgress, KindKeepalive, KindResult, KindCall} {
		if !kinds[k] {
			t.Errorf("no round trip for kind %s", k)
		}
	}
}

func TestFrameEncodeHeaders(t *testing.T) {
	h, body := Frame{Kind: KindResult, CallID: "c1", Seq: 7, Part: 2, Parts: 3, Data: []byte("x")}.Encode()
	want := Header{HeaderKind: {"result"}, HeaderCall: {"c1"}, HeaderSeq: {"7"}, HeaderPart: {"2/3"}}
	if !reflect.DeepEqual(h, want) || string(body) != "x" {
		t.Errorf("Encode = %v %q, want %v %q", h, body, want, "x")
	}
	h, _ = Frame{Kind: KindOutput, CallID: "c1", Seq: 1}.Encode()
	if _, ok := h[HeaderPart]; ok {
		t.Errorf("an output frame without parts has a %s header: %v", HeaderPart, h)
	}
}

func TestDecodeFrameErrors(t *testing.T) {
	base := func(kind, call, seq, part string) Header {
		h := Header{}
		for k, v := range map[string]string{HeaderKind: kind, HeaderCall: call, HeaderSeq: seq, HeaderPart: part} {
			if v != "-" {
				h[k] = []string{v}
			}
		}
		return h
	}
	tests := []struct {
		name string
		h    Header
		want string
	}{
		{"no headers", nil, HeaderKind},
		{"missing kind", base("-", "c1", "1", "-"), HeaderKind},
		{"empty kind", base("", "c1", "1", "-"), HeaderKind},
		{"kind without value", Header{HeaderKind: {}, HeaderCall: {"c1"}, HeaderSeq: {"1"}}, HeaderKind},
		{"unknown kind", base("bogus", "c1", "1", "-"), `"bogus"`},
		{"kind in wrong case", base("Output", "c1", "1", "-"), `"Output"`},
		{"missing call id", base("output", "-", "1", "-"), "call id"},
		{"bad call id", base("output", "c.1", "1", "-"), `"."`},
		{"call id too long", base("output", strings.Repeat("c", MaxCallIDLen+1), "1", "-"), "call id"},
		{"missing seq", base("output", "c1", "-", "-"), HeaderSeq},
		{"bad seq", base("output", "c1", "one", "-"), HeaderSeq},
		{"negative seq", base("output", "c1", "-1", "-"), HeaderSeq},
		{"seq overflow", base("output", "c1", "18446744073709551616", "-"), HeaderSeq},
		{"result without part", base("result", "c1", "1", "-"), HeaderPart},
		{"call without part", base("call", "c1", "1", "-"), HeaderPart},
		{"result with empty part", base("result", "c1", "1", ""), HeaderPart},
		{"part without slash", base("result", "c1", "1", "1"), HeaderPart},
		{"part zero", base("result", "c1", "1", "0/1"), HeaderPart},
		{"part after last", base("result", "c1", "1", "3/2"), HeaderPart},
		{"zero parts", base("result", "c1", "1", "0/0"), HeaderPart},
		{"negative part", base("result", "c1", "1", "-1/2"), HeaderPart},
		{"too many parts", base("call", "c1", "1", fmt.Sprintf("1/%d", MaxParts+1)), HeaderPart},
		{"part not a number", base("result", "c1", "1", "a/b"), HeaderPart},
		{"bad part on output", base("output", "c1", "1", "x"), HeaderPart},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f, err := DecodeFrame(tc.h, []byte("body"))
			if err == nil {
				t.Fatalf("DecodeFrame(%v) = %+v, want an error", tc.h, f)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("DecodeFrame(%v) error %q does not mention %q", tc.h, err, tc.want)
			}
		})
	}
	if _, err := DecodeFrame(Header{"Other": {"x"}}, nil); !errors.Is(err, ErrNotFrame) {
		t.Errorf("DecodeFrame of a plain message = %v, want ErrNotFrame", err)
	}
	if _, err := DecodeFrame(base("bogus", "c1", "1", "-"), nil); errors.Is(err, ErrNotFrame) {
		t.Errorf("a frame with an unknown kind is reported as not a frame: %v", err)
	}
}

// goldenMessages holds one representative value of every message, in a
// fixed order, for testdata/messages.golden.json.
type goldenMessages struct {
	Call            Call        `json:"call"`
	Result          Result      `json:"result"`
	ResultToolError Result      `json:"result_tool_error"`
	ResultError     Result      `json:"result_error"`
	Announce        Announce    `json:"announce"`
	AnnounceLeaving Announce    `json:"announce_leaving"`
	Cancel          Cancel      `json:"cancel"`
	Fetch           Fetch       `json:"fetch"`
	Receipt         Receipt     `json:"receipt"`
	KeySets         KeySetChain `json:"key_sets"`
	Refusal         Refusal     `json:"refusal"`
}

func sampleMessages() goldenMessages {
	exit2 := 2
	png := []byte{0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n', 0, 0, 0, 0x0d}
	return goldenMessages{
		Call: Call{
			ID: "0a1b2c3d4e5f", Protocol: Version, Host: "web-1", Tool: "bash",
			Caller: Caller{Subject: "user-123", Name: "Ada Lovelace", Issuer: "https://id.example.com",
				ClientID: "claude-code", Groups: []string{"sre", "ops"}},
			TimeoutMS: 120000,
			Args:      json.RawMessage(`{"command":"echo hi","timeout":30}`),
		},
		Result: Result{
			CallID: "0a1b2c3d4e5f",
			Content: []Content{
				Text("hi\n"),
				{Type: "image", Data: png, MIMEType: "image/png"},
			},
			Structured: json.RawMessage(`{"exit_code":0,"lines":1}`),
		},
		ResultToolError: Result{
			CallID:  "0a1b2c3d4e5f",
			Content: []Content{Text("ls: cannot access 'x': No such file or directory\n\nCommand exited with code 2")},
			IsError: true,
		},
		ResultError: *ErrorResult("0a1b2c3d4e5f", CodeBusy, "16 calls running and 64 queued; try again shortly"),
		Announce: Announce{
			Host: "web-1", Instance: "8c1f0e2a9b7d6c5e", AgentID: "3f9a1c7e5b2d4f6081a3c5e7f9b1d3a5",
			Protocol: Version, AgentVersion: "0.1.0",
			Labels: map[string]string{"role": "web", "env": "staging"},
			OS:     "linux", Arch: "amd64", Hostname: "web-1.example.com",
			Cwd: "/srv/app", Shell: "/bin/bash",
			Tools:        []string{"bash", "read"},
			PolicyDigest: "sha256:5f2c0d6f6e1a3b4c8d9e0f1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e",
			TrustedKeys:  []string{"_oEsEvOrTOas", "Qm9vVGhlcmUx"},
			Confinement:  "landlock abi 7",
			StartedAt:    time.Date(2025, 3, 4, 5, 6, 7, 800000000, time.UTC),
			HeartbeatMS:  5000, Busy: 2, Limit: 16,
		},
		AnnounceLeaving: Announce{
			Host: "web-1", Instance: "8c1f0e2a9b7d6c5e", Protocol: Version, AgentVersion: "0.1.0", OS: "linux", Arch: "arm64",
			Cwd: "/", Shell: "/bin/sh", Tools: []string{}, Confinement: "none: kernel has no Landlock",
			StartedAt:   time.Date(2025, 3, 4, 5, 6, 7, 0, time.UTC),
			HeartbeatMS: 5000, Leaving: true, Limit: 16,
		},
		Cancel: Cancel{CallID: "0a1b2c3d4e5f", Reason: "client cancelled the request"},
		Fetch:  Fetch{CallID: "0a1b2c3d4e5f"},
		Receipt: Receipt{CallID: "0a1b2c3d4e5f", Host: "web-1", Outcome: OutcomeToolError, ExitCode: &exit2,
			ResultSHA256: "45fb0254ec0f0ce1c7c6ce6379dfe8afa7ee7dfa13537d323c487f1d76357676", ResultBytes: 118,
			Start: time.Date(2025, 3, 4, 5, 6, 7, 800000000, time.UTC), End: time.Date(2025, 3, 4, 5, 6, 8, 100000000, time.UTC),
			Key: "UDXU4RCSJNZOIQHZNWXHXORDPRTGNJAHAHFRGZNEEJCPQTT2M7NLCNF4", Signature: "c2lnbmF0dXJl"},
		KeySets: KeySetChain{Sets: []SignedKeySet{{
			Set: KeySet{Serial: 2, Keys: []string{"ed25519:bmV3bmV3bmV3bmV3bmV3bmV3bmV3bmV3bmV3bmV3bmU", "ed25519:b2xkb2xkb2xkb2xkb2xkb2xkb2xkb2xkb2xkb2xkb2w"},
				At: time.Date(2025, 3, 4, 5, 6, 7, 0, time.UTC)},
			Signatures: []Signature{{Key: "ed25519:b2xkb2xkb2xkb2xkb2xkb2xkb2xkb2xkb2xkb2xkb2w", Sig: "c2lnbmF0dXJl"}},
		}}},
		Refusal: Refusal{Host: "web-1", Kind: MsgCall, Reason: RefusedReplayed, Message: "call 0a1b2c3d4e5f was run already",
			CallID: "0a1b2c3d4e5f", Tool: "bash", Caller: "user-123", KeyID: "_oEsEvOrTOas",
			At: time.Date(2025, 3, 4, 5, 6, 9, 0, time.UTC), Suppressed: 3},
	}
}

func TestMessagesGolden(t *testing.T) {
	got, err := json.MarshalIndent(sampleMessages(), "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	got = append(got, '\n')
	golden(t, "messages.golden.json", got)

	// What was written must read back to the same messages: decoding the
	// golden file and encoding it again gives the same bytes.
	var back goldenMessages
	dec := json.NewDecoder(bytes.NewReader(got))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&back); err != nil {
		t.Fatalf("decode messages: %v", err)
	}
	again, err := json.MarshalIndent(back, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if again = append(again, '\n'); !bytes.Equal(again, got) {
		t.Errorf("messages do not survive a decode/encode round trip:\n--- after\n%s\n--- before\n%s", again, got)
	}
	want := sampleMessages()
	if !bytes.Equal(back.Result.Content[1].Data, want.Result.Content[1].Data) {
		t.Errorf("image data = %x, want %x", back.Result.Content[1].Data, want.Result.Content[1].Data)
	}
	if !back.Announce.StartedAt.Equal(want.Announce.StartedAt) {
		t.Errorf("StartedAt = %v, want %v", back.Announce.StartedAt, want.Announce.StartedAt)
	}
	if back.ResultError.Error == nil || back.ResultError.Error.Code != CodeBusy {
		t.Errorf("error result decoded as %+v", back.ResultError)
	}
}

func TestErrorAndHelpers(t *testing.T) {
	r := ErrorResult("c1", CodeUnknownTool, "no tool frob")
	if r.CallID != "c1" || r.Error == nil || r.IsError || len(r.Content) != 0 {
		t.Fatalf("ErrorResult = %+v", r)
	}
	if got, want := r.Error.Error(), "unknown_tool: no tool frob"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	var pe *Error
	if !errors.As(fmt.Errorf("dispatch: %w", r.Error), &pe) || pe.Code != CodeUnknownTool {
		t.Errorf("errors.As does not find the protocol error")
	}
	if c := Text("x"); c.Type != "text" || c.Text != "x" {
		t.Errorf("Text(x) = %+v", c)
	}
	if got := (&Call{TimeoutMS: 1500}).Timeout(); got != 1500*time.Millisecond {
		t.Errorf("Timeout() = %v, want 1.5s", got)
	}
}

// Codes are append-only and sent on the wire: their values must never
// change, and every code in errors.go must be listed here.
func TestCodeValues(t *testing.T) {
	codes := map[Code]string{
		CodeBadRequest: "bad_request", CodeUnknownTool: "unknown_tool", CodeBusy: "busy",
		CodeVersion: "version", CodeIncomplete: "incomplete", CodeTooLarge: "too_large",
		CodeUnknownCall: "unknown_call", CodeShuttingDown: "shutting_down",
		CodeCancelled: "cancelled", CodeInternal: "internal", CodeDenied: "denied",
		CodeRefused: "refused", CodeResultDropped: "result_dropped",
	}
	for c, want := range codes {
		if string(c) != want {
			t.Errorf("code %q changed, want %q", c, want)
		}
	}
	file, err := parser.ParseFile(token.NewFileSet(), "errors.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	declared := 0
	for _, d := range file.Decls {
		gd, ok := d.(*ast.GenDecl)
		if !ok || gd.Tok != token.CONST {
			continue
		}
		for _, spec := range gd.Specs {
			vs := spec.(*ast.ValueSpec)
			if id, ok := vs.Type.(*ast.Ident); !ok || id.Name != "Code" {
				continue
			}
			declared += len(vs.Names)
		}
	}
	if declared != len(codes) {
		t.Errorf("errors.go declares %d codes, this test knows %d: add the new code's wire value here", declared, len(codes))
	}
}
