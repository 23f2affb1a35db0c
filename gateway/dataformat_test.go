package gateway

import (
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestDataFormat: a new directory is stamped; a directory of this format
// or an older one is accepted (and stamped); one written by a newer
// gateway, or with a damaged stamp, is refused saying what to do, and
// left as it was.
func TestDataFormat(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, dataFormatFile)
	if err := checkDataFormat(dir); err != nil {
		t.Fatal(err)
	}
	if data, _ := os.ReadFile(path); strings.TrimSpace(string(data)) != "1" {
		t.Fatalf("a new directory is stamped %q, want 1", data)
	}
	if err := checkDataFormat(dir); err != nil {
		t.Fatalf("the same format again: %v", err)
	}
	for _, tc := range []struct{ stamp, want string }{
		{"2\n", "newer fleet-gateway"},
		{"99", "newer fleet-gateway"},
		{"two", "not a format number"},
		{"0", "not a format number"},
	} {
		if err := os.WriteFile(path, []byte(tc.stamp), 0o600); err != nil {
			t.Fatal(err)
		}
		err := checkDataFormat(dir)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("stamp %q: %v, want an error saying %q", tc.stamp, err, tc.want)
		}
		if data, _ := os.ReadFile(path); string(data) != tc.stamp {
			t.Errorf("stamp %q was rewritten to %q", tc.stamp, data)
		}
	}
	if err := os.WriteFile(path, []byte("2"), 0o600); err != nil {
		t.Fatal(err)
	}
	var fe *DataFormatError
	if err := checkDataFormat(dir); !errors.As(err, &fe) || fe.Found != 2 || fe.Max != dataFormat {
		t.Errorf("newer format: %v, want a DataFormatError", err)
	}
}

// TestGatewayRefusesNewerData: a gateway does not start on a data
// directory a newer gateway wrote.
func TestGatewayRefusesNewerData(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, dataFormatFile), []byte("2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := Config{Listen: "127.0.0.1:0", DataDir: dir, NATSListen: "127.0.0.1:0", APIListen: "127.0.0.1:0",
		AuthDisabled: true, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	gw, err := Start(t.Context(), cfg)
	if err == nil {
		_ = gw.Shutdown(t.Context())
		t.Fatal("a gateway started on a directory of a newer data format")
	}
	var fe *DataFormatError
	if !errors.As(err, &fe) {
		t.Fatalf("Start: %v, want a DataFormatError", err)
	}
}
