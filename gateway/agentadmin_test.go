package gateway

import (
	"errors"
	"maps"
	"testing"
	"time"
)

// What an enrolment does to the record of its host: the same key again
// is a re-enrolment (new labels, an expiry that never goes down);
// another key takes the name only when replacing, and the key it
// replaces joins the revoked ones; a revoked key never comes back.
func TestEnrolmentApply(t *testing.T) {
	now := time.Date(2026, 1, 10, 12, 0, 0, 0, time.UTC)
	later, earlier := now.Add(720*time.Hour), now.Add(time.Hour)
	active := func() *AgentRecord {
		return &AgentRecord{Host: "web-1", PublicKey: "Uold", Labels: map[string]string{"env": "prod"}, EnrolledAt: now.Add(-time.Hour),
			CredentialExpiresAt: later}
	}
	revoked := func() *AgentRecord {
		r := active()
		r.RevokedAt, r.RevokedBy = now.Add(-time.Minute), "ops"
		return r
	}
	withOldKey := func() *AgentRecord {
		r := active()
		r.RevokedKeys = []RevokedKey{{PublicKey: "Ugone", RevokedAt: now.Add(-48 * time.Hour)}}
		return r
	}
	for _, tc := range []struct {
		name       string
		rec        *AgentRecord
		e          enrolment
		expires    time.Time
		err        error
		revokedOld bool
		check      func(t *testing.T, r *AgentRecord)
	}{
		{name: "same key again", rec: active(), e: enrolment{host: "web-1", userPub: "Uold", labels: map[string]string{"env": "staging"}}, expires: earlier,
			check: func(t *testing.T, r *AgentRecord) {
				if r.Labels["env"] != "staging" || !r.CredentialExpiresAt.Equal(later) || r.PublicKey != "Uold" {
					t.Errorf("record %+v: want the new labels, the later expiry kept", r)
				}
			}},
		{name: "another key", rec: active(), e: enrolment{host: "web-1", userPub: "Unew"}, err: ErrNameTaken},
		{name: "same key, revoked", rec: revoked(), e: enrolment{host: "web-1", userPub: "Uold"}, err: ErrHostRevoked},
		{name: "same key, revoked, replacing", rec: revoked(), e: enrolment{host: "web-1", userPub: "Uold", replace: true}, err: ErrKeyRevoked},
		{name: "another key, revoked", rec: revoked(), e: enrolment{host: "web-1", userPub: "Unew"}, err: ErrHostRevoked},
		{name: "an earlier revoked key", rec: withOldKey(), e: enrolment{host: "web-1", userPub: "Ugone", replace: true}, err: ErrKeyRevoked},
		{name: "replacing an active key", rec: active(), e: enrolment{host: "web-1", userPub: "Unew", replace: true, by: "ops"}, expires: earlier, revokedOld: true,
			check: func(t *testing.T, r *AgentRecord) {
				if r.PublicKey != "Unew" || r.Revoked() || !r.EnrolledAt.Equal(now) || !r.CredentialExpiresAt.Equal(earlier) || len(r.Labels) != 0 {
					t.Errorf("record %+v: want the new key, enrolled now", r)
				}
				if len(r.RevokedKeys) != 1 || r.RevokedKeys[0].PublicKey != "Uold" || !r.RevokedKeys[0].RevokedAt.Equal(now) ||
					!r.RevokedKeys[0].CredentialExpiresAt.Equal(later) {
					t.Errorf("revoked keys %+v: want Uold revoked now, with its credentials' expiry", r.RevokedKeys)
				}
			}},
		{name: "replacing a revoked key", rec: revoked(), e: enrolment{host: "web-1", userPub: "Unew", replace: true}, expires: earlier,
			check: func(t *testing.T, r *AgentRecord) {
				if len(r.RevokedKeys) != 1 || !r.RevokedKeys[0].RevokedAt.Equal(now.Add(-time.Minute)) || r.RevokedKeys[0].RevokedBy != "ops" {
					t.Errorf("revoked keys %+v: want Uold with its revocation as it was", r.RevokedKeys)
				}
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := tc.rec.clone()
			revokedOld, err := tc.e.apply(tc.rec, now, tc.expires)
			if !errors.Is(err, tc.err) || (tc.err == nil) != (err == nil) {
				t.Fatalf("apply = %v, want %v", err, tc.err)
			}
			if err != nil {
				if tc.rec.PublicKey != before.PublicKey || !maps.Equal(tc.rec.Labels, before.Labels) {
					t.Errorf("a refused enrolment changed the record: %+v", tc.rec)
				}
				return
			}
			if revokedOld != tc.revokedOld {
				t.Errorf("revokedOld = %v, want %v", revokedOld, tc.revokedOld)
			}
			tc.check(t, tc.rec)
		})
	}
}

// A record's revoked keys: its earlier keys, and its key once revoked.
func TestRecordRevokedKeys(t *testing.T) {
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	r := AgentRecord{Host: "h", PublicKey: "Ucur", CredentialExpiresAt: at.Add(time.Hour),
		RevokedKeys: []RevokedKey{{PublicKey: "Uold", RevokedAt: at, CredentialExpiresAt: at.Add(2 * time.Hour)}}}
	if keys := r.revokedKeys(); len(keys) != 1 || keys[0].Pub != "Uold" || !keys[0].Expires.Equal(at.Add(2*time.Hour)) {
		t.Errorf("active record: %+v", keys)
	}
	r.RevokedAt = at.Add(time.Minute)
	if keys := r.revokedKeys(); len(keys) != 2 || keys[1].Pub != "Ucur" || !keys[1].RevokedAt.Equal(r.RevokedAt) {
		t.Errorf("revoked record: %+v", keys)
	}
}
