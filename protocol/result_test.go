package protocol

import (
	"strings"
	"testing"
)

func TestResultRoundTrip(t *testing.T) {
	in := &Result{
		CallID: "c42",
		Content: []Content{
			Text("line one\nline \"two\"\n"),
			{Type: "image", MIMEType: "image/png", Data: []byte{0x89, 'P', 'N', 'G', 0, '\n', 0xff}},
			Text(""),
		},
		Structured: []byte(`{"exit":0}`),
		IsError:    true,
	}
	data, err := EncodeResult(in)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"call_id":"c42","content":[{"type":"text","len":20},{"type":"image","mime_type":"image/png","len":7},{"type":"text","len":0}],"structured":{"exit":0},"is_error":true}` + "\n"
	if !strings.HasPrefix(string(data), want) {
		t.Fatalf("header = %q\nwant    %q", data[:strings.IndexByte(string(data), '\n')+1], want)
	}
	out, err := DecodeResult(data)
	if err != nil {
		t.Fatal(err)
	}
	if out.CallID != in.CallID || !out.IsError || string(out.Structured) != `{"exit":0}` || len(out.Content) != 3 ||
		out.Content[0].Text != in.Content[0].Text || string(out.Content[1].Data) != string(in.Content[1].Data) ||
		out.Content[1].MIMEType != "image/png" || out.Content[2].Text != "" {
		t.Fatalf("round trip: %+v", out)
	}
}

func TestDecodeResultErrors(t *testing.T) {
	for _, tc := range []struct{ name, data, want string }{
		{"no header line", `{"call_id":"c"}`, "no header line"},
		{"bad header", "{oops\n", "result header"},
		{"short body", `{"content":[{"type":"text","len":10}]}` + "\nabc", "claims 10 bytes but 3 remain"},
		{"negative length", `{"content":[{"type":"text","len":-1}]}` + "\n", "claims -1 bytes"},
		{"trailing bytes", `{"content":[{"type":"text","len":1}]}` + "\nab", "1 bytes after its last content item"},
		{"unknown type", `{"content":[{"type":"audio","len":0}]}` + "\n", `unknown type "audio"`},
		{"too many items", `{"content":[` + strings.Repeat(`{"type":"text","len":0},`, MaxContentItems) + `{"type":"text","len":0}]}` + "\n", "at most 1024"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeResult([]byte(tc.data))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want it to contain %q", err, tc.want)
			}
		})
	}
}
