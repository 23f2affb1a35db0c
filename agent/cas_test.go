//go:build unix

package agent

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCASExpectedArgument(t *testing.T) {
	tc := &toolCall{ID: "c1"}
	sum := sha256Hex([]byte("hello"))
	for _, give := range []string{"", sum, strings.ToUpper(sum), "sha256:" + sum} {
		got, r := expectedHash(tc, give)
		if r != nil {
			t.Fatalf("expectedHash(%q) failed: %s", give, resultText(t, r))
		}
		if give != "" && got != sum {
			t.Errorf("expectedHash(%q) = %q, want %q", give, got, sum)
		}
	}
	for _, bad := range []string{"abc", sum[:63] + "g", sum + "0"} {
		if _, r := expectedHash(tc, bad); r == nil || !r.IsError || !strings.Contains(resultText(t, r), "64 hexadecimal") {
			t.Errorf("expectedHash(%q) = %v, want a failure naming the format", bad, r)
		}
	}
}

func TestCheckExpected(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "f")
	if err := os.WriteFile(p, []byte("hello"), 0o644); err != nil {
		t.Fatal(err)
	}
	tc := &toolCall{ID: "c1"}
	tb := tbNew(t)
	if r := tb.checkExpected(context.Background(), tc, p, p, ""); r != nil {
		t.Fatal("no expected hash must pass")
	}
	if r := tb.checkExpected(context.Background(), tc, p, p, sha256Hex([]byte("hello"))); r != nil {
		t.Fatalf("matching hash refused: %s", resultText(t, r))
	}
	stale := sha256Hex([]byte("old"))
	r := tb.checkExpected(context.Background(), tc, p, p, stale)
	if r == nil || !r.IsError {
		t.Fatal("a stale hash must fail")
	}
	var s struct {
		Current string `json:"current_sha256"`
		Exists  bool   `json:"exists"`
	}
	if err := json.Unmarshal(r.Structured, &s); err != nil || s.Current != sha256Hex([]byte("hello")) || !s.Exists {
		t.Fatalf("structured = %s (%v), want the current hash", r.Structured, err)
	}
	if !strings.Contains(resultText(t, r), s.Current) {
		t.Errorf("text %q does not carry the current hash", resultText(t, r))
	}
	r = tb.checkExpected(context.Background(), tc, p+"-gone", p+"-gone", stale)
	if r == nil || !strings.Contains(resultText(t, r), "does not exist") {
		t.Fatalf("a missing file must fail as missing, got %v", r)
	}
}
