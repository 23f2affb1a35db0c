package gateway

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestShrinkJSON(t *testing.T) {
	long := strings.Repeat("a", 40)
	tests := []struct {
		in, want string
		sizes    map[string]int
	}{
		{`{}`, `{}`, map[string]int{}},
		{` {"host" : "web-1", "n": 12.5e-3, "ok": true, "x": null} `, `{"host":"web-1","n":12.5e-3,"ok":true,"x":null}`, map[string]int{"host": 5, "n": 7, "ok": 4, "x": 4}},
		{`{"content":"` + long + `"}`, `{"content":"` + long[:16] + `"}`, map[string]int{"content": 40}},
		{`{"edits":[{"old_string":"` + long + `"}]}`, `{"edits":[{"old_string":"` + long[:16] + `"}]}`, map[string]int{"edits": 16 + 40 + 3}},
		{`{"e":"` + strings.Repeat(`\n`, 10) + `"}`, `{"e":"` + strings.Repeat(`\n`, 8) + `"}`, map[string]int{"e": 10}},
		{`{"u":"` + strings.Repeat(`\u00e9`, 4) + `"}`, `{"u":"\u00e9\u00e9"}`, map[string]int{"u": 8}},
		{`{"r":"` + strings.Repeat("é", 10) + `"}`, `{"r":"` + strings.Repeat("é", 8) + `"}`, map[string]int{"r": 20}},
		{`{"s":"` + strings.Repeat("x", 15) + `é"}`, `{"s":"` + strings.Repeat("x", 15) + `"}`, map[string]int{"s": 17}},
		{`{"p":"\ud83d\ude00"}`, `{"p":"\ud83d\ude00"}`, map[string]int{"p": 4}},
		{`[1,"` + long + `",{}]`, `[1,"` + long[:16] + `",{}]`, nil},
		{`"` + long + `"`, `"` + long[:16] + `"`, nil},
		{`{"` + long + `":1}`, `{"` + long[:16] + `":1}`, map[string]int{long: 1}},
	}
	for _, tc := range tests {
		got, sizes, err := shrinkJSON([]byte(tc.in), 16)
		if err != nil {
			t.Errorf("shrinkJSON(%s): %v", tc.in, err)
			continue
		}
		if string(got) != tc.want {
			t.Errorf("shrinkJSON(%s) =\n%s\nwant\n%s", tc.in, got, tc.want)
		}
		if tc.sizes != nil && !reflect.DeepEqual(sizes, tc.sizes) {
			t.Errorf("shrinkJSON(%s) sizes = %v, want %v", tc.in, sizes, tc.sizes)
		}
	}
	for _, bad := range []string{``, `{`, `{"a"}`, `{"a":}`, `{"a":1,}`, `[1,]`, `"abc`, `"a\x"`, "\"a\x01\"", `tru`, `01`, `1.`, `-`, `1e`, `{} {}`, `{"a":1 "b":2}`, strings.Repeat("[", maxArgDepth+1) + strings.Repeat("]", maxArgDepth+1)} {
		if _, _, err := shrinkJSON([]byte(bad), 16); err == nil {
			t.Errorf("shrinkJSON(%.40q) accepted it", bad)
		}
	}
}

// FuzzShrinkJSON: shrinkJSON accepts exactly the JSON encoding/json does
// (within its nesting limit), returns valid JSON that decodes to the same
// value with every string a prefix of the original, of at most max bytes
// encoded; with a limit above the input's size it changes nothing but
// whitespace.
func FuzzShrinkJSON(f *testing.F) {
	for _, s := range []string{`{"host":"web-1","content":"hello world, hello world"}`, `[1,2,{"a":"\u00e9\ud83d\ude00"}]`, `"\\\\\\\""`, `{"a":-0.5E+7}`, `{"e":[{"old_string":"x\ny","new_string":""}]}`, `{}`, `1E700`, `{"a":"\ud800\u0041"}`, "{\"\":\"\xdf\"}"} {
		f.Add([]byte(s), uint8(4))
	}
	f.Fuzz(func(t *testing.T, data []byte, max uint8) {
		limit := int(max)
		small, sizes, err := shrinkJSON(data, limit)
		valid := json.Valid(data)
		if err != nil {
			if valid && !strings.Contains(err.Error(), "nested") {
				t.Fatalf("shrinkJSON refused valid JSON %q: %v", data, err)
			}
			return
		}
		if !valid {
			t.Fatalf("shrinkJSON accepted invalid JSON %q", data)
		}
		orig, err := decodeAny(data)
		if err != nil {
			t.Fatal(err)
		}
		got, err := decodeAny(small)
		if err != nil {
			t.Fatalf("shrunk %q is not JSON: %v", small, err)
		}
		if !prefixOf(got, orig) {
			t.Fatalf("shrunk %q is not a prefix-wise copy of %q", small, data)
		}
		if m, ok := orig.(map[string]any); ok && utf8.Valid(data) && len(data) <= limit {
			for k, v := range m {
				if s, isString := v.(string); isString && sizes[k] != len(s) && strings.Count(string(data), `"`+k+`"`) == 1 {
					t.Fatalf("size of %q is %d, want %d", k, sizes[k], len(s))
				}
			}
		}
		if m, ok := orig.(map[string]any); ok {
			members, err := jsonMembers(data)
			if err != nil && !strings.Contains(err.Error(), "twice") {
				t.Fatalf("jsonMembers(%q): %v", data, err)
			}
			for k, sp := range members {
				v, err := decodeAny(data[sp.start:sp.end])
				if err != nil || !reflect.DeepEqual(v, m[k]) && strings.Count(string(data), k) == 1 {
					t.Fatalf("member %q spans %q, want %v (%v)", k, data[sp.start:sp.end], m[k], err)
				}
			}
		}
		if big, _, err := shrinkJSON(data, len(data)+1); err != nil || !json.Valid(big) {
			t.Fatalf("shrinkJSON with a large limit: %q, %v", big, err)
		} else {
			again, _ := decodeAny(big)
			if !reflect.DeepEqual(again, orig) {
				t.Fatalf("shrinkJSON with a large limit changed %q into %q", data, big)
			}
		}
	})
}

// decodeAny decodes JSON keeping numbers as they are written.
func decodeAny(data []byte) (any, error) {
	d := json.NewDecoder(bytes.NewReader(data))
	d.UseNumber()
	var v any
	err := d.Decode(&v)
	return v, err
}

// prefixOf reports whether a has b's shape with each string a prefix of
// b's (object keys may be cut too, so objects are compared by size).
func prefixOf(a, b any) bool {
	switch b := b.(type) {
	case string:
		s, ok := a.(string)
		return ok && (strings.HasPrefix(b, s) || strings.HasPrefix(strings.ToValidUTF8(b, "\uFFFD"), s))
	case []any:
		s, ok := a.([]any)
		if !ok || len(s) != len(b) {
			return false
		}
		for i := range s {
			if !prefixOf(s[i], b[i]) {
				return false
			}
		}
		return true
	case map[string]any:
		m, ok := a.(map[string]any)
		return ok && len(m) <= len(b)
	default:
		return reflect.DeepEqual(a, b)
	}
}

func TestJSONMembersCutShort(t *testing.T) {
	data := []byte(`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"write","arguments":{"content":"xxxxxxxx`)
	m, err := jsonMembers(data)
	if err == nil {
		t.Fatal("no error for JSON cut short")
	}
	if sp := m["id"]; string(data[sp.start:sp.end]) != "7" {
		t.Errorf("id spans %q", data[sp.start:sp.end])
	}
	p, ok := m["params"]
	if !ok || p.end != -1 {
		t.Fatalf("params = %+v, %v; want it cut short", p, ok)
	}
	params, _ := jsonMembers(data[p.start:])
	if got := stringMember(data[p.start:], params, "name"); got != "write" {
		t.Errorf("name = %q", got)
	}
	if got := stringMember(data, m, "method"); got != "tools/call" {
		t.Errorf("method = %q", got)
	}
}

func TestShrinkRequest(t *testing.T) {
	content := strings.Repeat("c", 3*maxArgString)
	call := func(tool string) []byte {
		return []byte(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"` + tool + `","arguments":{"content":"` + content + `","host":"web-1","path":"f"},"_meta":{"k":"v"}}}`)
	}
	body := call("write")
	small, args := shrinkRequest(body)
	if args == nil {
		t.Fatal("a write was not shrunk")
	}
	var msg struct {
		Params struct {
			Name      string          `json:"name"`
			Arguments json.RawMessage `json:"arguments"`
			Meta      map[string]any  `json:"_meta"`
		} `json:"params"`
	}
	if err := json.Unmarshal(small, &msg); err != nil {
		t.Fatalf("shrunk request is not JSON: %v", err)
	}
	if len(small) > 2*maxArgString || msg.Params.Name != "write" || msg.Params.Meta["k"] != "v" || string(msg.Params.Arguments) != string(args.small) {
		t.Errorf("shrunk request of %d bytes: %+v", len(small), msg.Params.Name)
	}
	if !strings.Contains(string(args.raw), content) || args.sizes["content"] != len(content) || hostArg(args.small) != "web-1" {
		t.Errorf("arguments: raw of %d bytes, sizes %v", len(args.raw), args.sizes)
	}
	for name, b := range map[string][]byte{
		"fan-out tool":    call("fleet_bash"),
		"not a tool call": []byte(`{"jsonrpc":"2.0","id":1,"method":"ping","params":{"x":"` + content + `"}}`),
		"batch":           append(append([]byte("["), body...), ']'),
		"not JSON":        []byte(`{"method":"tools/call"`),
		"arguments twice": []byte(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"write","arguments":{"host":"a","content":"` + content + `"},"arguments":{"host":"b"}}}`),
		"params twice":    []byte(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"write","arguments":{"content":"` + content + `"}},"params":{}}`),
	} {
		if got, args := shrinkRequest(b); args != nil || string(got) != string(b) {
			t.Errorf("%s was changed", name)
		}
	}
}
