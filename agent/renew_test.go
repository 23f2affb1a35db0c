package agent

import (
	"testing"
	"time"
)

// A credential is due for renewal when a third of its lifetime is left;
// one that never expires never is.
func TestRenewAt(t *testing.T) {
	issued := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name            string
		issued, expires time.Time
		want            time.Time
	}{
		{"30 days", issued, issued.Add(30 * 24 * time.Hour), issued.Add(20 * 24 * time.Hour)},
		{"3 hours", issued, issued.Add(3 * time.Hour), issued.Add(2 * time.Hour)},
		{"never expires", issued, time.Time{}, time.Time{}},
		{"no issue date", time.Time{}, issued.Add(30 * 24 * time.Hour), issued.Add(20 * 24 * time.Hour)},
		{"issued after it expires", issued.Add(time.Hour), issued, issued.Add(-renewUnknownLifetime)},
	} {
		if got := renewAt(tc.issued, tc.expires); !got.Equal(tc.want) {
			t.Errorf("%s: renewAt = %s, want %s", tc.name, got, tc.want)
		}
	}
}

// The loop looks about hourly (jittered), sooner when the credential is
// due sooner, at once (a second) when it is overdue.
func TestRenewCheckDelay(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	month := now.Add(30 * 24 * time.Hour)
	for _, tc := range []struct {
		name            string
		issued, expires time.Time
		r               float64
		want            time.Duration
	}{
		{"fresh, no jitter", now, month, 0.5, time.Hour},
		{"fresh, earliest", now, month, 0, 45 * time.Minute},
		{"fresh, latest", now, month, 1, 75 * time.Minute},
		{"never expires", now, time.Time{}, 0.5, time.Hour},
		{"due in ten minutes", now.Add(-2*time.Hour + 10*time.Minute), now.Add(time.Hour + 10*time.Minute), 1, 10 * time.Minute},
		{"overdue", now.Add(-time.Hour), now.Add(time.Minute), 0.5, time.Second},
		{"expired", now.Add(-time.Hour), now.Add(-time.Minute), 0.5, time.Second},
	} {
		if got := renewCheckDelay(now, tc.issued, tc.expires, tc.r); got != tc.want {
			t.Errorf("%s: renewCheckDelay = %s, want %s", tc.name, got, tc.want)
		}
	}
}

// Failed renewals back off from the first wait, doubling, up to an
// hour, at a random moment in the upper half of each ceiling.
func TestRenewRetryDelay(t *testing.T) {
	for _, tc := range []struct {
		failures int
		r        float64
		want     time.Duration
	}{
		{1, 0, 30 * time.Second},
		{1, 1, time.Minute},
		{2, 1, 2 * time.Minute},
		{3, 0, 2 * time.Minute},
		{7, 1, renewRetryMax},
		{100, 0, renewRetryMax / 2},
	} {
		if got := renewRetryDelay(tc.failures, renewRetryMin, tc.r); got != tc.want {
			t.Errorf("renewRetryDelay(%d, %v) = %s, want %s", tc.failures, tc.r, got, tc.want)
		}
	}
}
