package protocol

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// A Result travels as a one-line JSON header followed by the raw bytes of
// each content item, in order:
//
//	{"call_id":"c1","content":[{"type":"text","len":5}]}\nhello
//
// Text and image bytes stay out of JSON, so a 50 KB read or a 4 MB image
// costs neither escaping nor base64, and the receiver scans only the small
// header. Compact JSON never contains a raw newline, so the first '\n'
// ends the header.

type resultHeader struct {
	CallID     string          `json:"call_id"`
	Content    []contentHeader `json:"content,omitempty"`
	Structured json.RawMessage `json:"structured,omitempty"`
	IsError    bool            `json:"is_error,omitempty"`
	Error      *Error          `json:"error,omitempty"`
}

type contentHeader struct {
	Type     string `json:"type"`
	MIMEType string `json:"mime_type,omitempty"`
	Len      int    `json:"len"`
}

// EncodeResult returns r's wire form.
func EncodeResult(r *Result) ([]byte, error) {
	h := resultHeader{CallID: r.CallID, Structured: r.Structured, IsError: r.IsError, Error: r.Error}
	size := 0
	for _, c := range r.Content {
		n := len(c.body())
		h.Content = append(h.Content, contentHeader{Type: c.Type, MIMEType: c.MIMEType, Len: n})
		size += n
	}
	head, err := json.Marshal(h)
	if err != nil {
		return nil, fmt.Errorf("encode result of call %s: %w", r.CallID, err)
	}
	out := make([]byte, 0, len(head)+1+size)
	out = append(append(out, head...), '\n')
	for _, c := range r.Content {
		out = append(out, c.body()...)
	}
	return out, nil
}

func (c *Content) body() []byte {
	if c.Type == "text" {
		return []byte(c.Text)
	}
	return c.Data
}

// MaxContentItems bounds the content items of one result.
const MaxContentItems = 1024

// DecodeResult parses EncodeResult's output. It checks every length against
// the data it has and never panics.
func DecodeResult(data []byte) (*Result, error) {
	nl := bytes.IndexByte(data, '\n')
	if nl < 0 {
		return nil, errors.New("result has no header line")
	}
	var h resultHeader
	if err := json.Unmarshal(data[:nl], &h); err != nil {
		return nil, fmt.Errorf("result header: %w", err)
	}
	if len(h.Content) > MaxContentItems {
		return nil, fmt.Errorf("result has %d content items; at most %d are allowed", len(h.Content), MaxContentItems)
	}
	r := &Result{CallID: h.CallID, Structured: h.Structured, IsError: h.IsError, Error: h.Error}
	rest := data[nl+1:]
	for i, ch := range h.Content {
		if ch.Len < 0 || ch.Len > len(rest) {
			return nil, fmt.Errorf("result content %d claims %d bytes but %d remain", i+1, ch.Len, len(rest))
		}
		body := rest[:ch.Len:ch.Len]
		rest = rest[ch.Len:]
		c := Content{Type: ch.Type, MIMEType: ch.MIMEType}
		switch ch.Type {
		case "text":
			c.Text = string(body)
		case "image":
			c.Data = body
		default:
			return nil, fmt.Errorf("result content %d has unknown type %q", i+1, ch.Type)
		}
		r.Content = append(r.Content, c)
	}
	if len(rest) != 0 {
		return nil, fmt.Errorf("result has %d bytes after its last content item", len(rest))
	}
	return r, nil
}
