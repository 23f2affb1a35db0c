package audit

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/fleetmcp/fleetmcp/gateway/internal/gwtest"
)

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// testSealer seals as the gateways do: an HMAC-SHA256 under a fleet key,
// over the kind of seal, the record's call ID and the sealed data.
type testSealer struct{ key []byte }

func testSeal(t *testing.T) *testSealer {
	t.Helper()
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		t.Fatal(err)
	}
	return &testSealer{key: key}
}

func (s *testSealer) sum(chained bool, callID string, data []byte) []byte {
	m := hmac.New(sha256.New, s.key)
	m.Write([]byte(strconv.FormatBool(chained)))
	m.Write([]byte{0})
	m.Write([]byte(callID))
	m.Write([]byte{0})
	m.Write(data)
	return m.Sum(nil)
}

func (s *testSealer) Mark(chained bool, callID string, data []byte) string {
	return base64.RawURLEncoding.EncodeToString(s.sum(chained, callID, data))
}

func (s *testSealer) Holds(chained bool, callID string, data []byte, seal string) bool {
	sum, err := base64.RawURLEncoding.DecodeString(seal)
	return err == nil && hmac.Equal(sum, s.sum(chained, callID, data))
}

// waitUntil waits (up to 5 s) until cond holds.
func waitUntil(t *testing.T, what string, cond func() bool) {
	gwtest.WaitUntil(t, 5*time.Second, what, cond)
}
