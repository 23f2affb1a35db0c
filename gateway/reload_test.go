package gateway

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestReloadAfterShutdownBegins: a reload that comes once the gateway
// shuts down (a SIGHUP during a stop) reloads nothing: it does not
// reopen the audit file the shutdown closed.
func TestReloadAfterShutdownBegins(t *testing.T) {
	auditFile := filepath.Join(t.TempDir(), "audit.log")
	gw := startAPIGateway(t, nil, func(c *Config) { c.Audit.File = auditFile })
	if err := gw.Reload(); err != nil {
		t.Fatalf("reload while running: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := gw.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(auditFile); err != nil {
		t.Fatal(err)
	}
	if err := gw.Reload(); !errors.Is(err, errReloadStopping) {
		t.Fatalf("reload after shutdown: %v, want %v", err, errReloadStopping)
	}
	if _, err := os.Stat(auditFile); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the reload after shutdown opened the audit file again: %v", err)
	}
}
