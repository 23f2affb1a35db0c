package protocol

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

func validAnnounce() Announce {
	return Announce{
		Host: "web-1", Instance: strings.Repeat("a", MaxInstanceLen), Protocol: Version, AgentVersion: "0.1.0",
		Labels: map[string]string{"role": "web"}, OS: "linux", Arch: "amd64", Hostname: "web-1.example.com",
		Cwd: "/srv", Shell: "/bin/bash", Tools: []string{"bash", "read"}, PolicyDigest: "sha256:" + strings.Repeat("0", 64),
		HeartbeatMS: 5000, Skills: []Skill{{Name: "deploy", Description: "Deploys.", Path: "/srv/.agents/skills/deploy/SKILL.md"}},
	}
}

// TestAnnounceLimits: every field of an announce is bounded, at its limit
// it passes, one byte (or item) beyond it fails with an error that names
// the field and quotes at most about 100 bytes of the value.
func TestAnnounceLimits(t *testing.T) {
	big := func(n int) string { return strings.Repeat("x", n) }
	labels := func(n int) map[string]string {
		m := make(map[string]string, n)
		for i := range n {
			m[fmt.Sprintf("k%d", i)] = "v"
		}
		return m
	}
	skills := func(n int) []Skill {
		s := make([]Skill, n)
		for i := range s {
			s[i] = Skill{Name: fmt.Sprintf("s%d", i), Path: "/p"}
		}
		return s
	}
	tests := []struct {
		name  string
		field string // in the error; "" for an announce that passes
		mod   func(*Announce)
	}{
		{"valid", "", func(*Announce) {}},
		{"every field at its limit", "", func(a *Announce) {
			a.Instance, a.AgentVersion, a.OS, a.Arch = big(MaxInstanceLen), big(MaxVersionLen), big(MaxPlatformLen), big(MaxPlatformLen)
			a.Hostname, a.Cwd, a.Shell, a.PolicyDigest = big(MaxHostnameLen), big(MaxPathLen), big(MaxPathLen), big(MaxPolicyDigestLen)
			a.Labels = labels(MaxLabels)
			a.Labels[big(MaxLabelKeyLen)] = big(MaxLabelValueLen)
			delete(a.Labels, "k0")
			a.Tools = strings.Fields(strings.Repeat("t ", MaxTools))
			a.Tools[0] = big(MaxToolNameLen)
			a.Skills = skills(MaxSkills)
			a.Skills[0] = Skill{Name: big(MaxSkillNameLen), Description: big(MaxSkillDescriptionLen), Path: big(MaxPathLen), Problem: big(MaxSkillProblemLen)}
		}},
		{"host invalid", "host", func(a *Announce) { a.Host = "web.1" }},
		{"host too long", "host", func(a *Announce) { a.Host = big(900 << 10) }},
		{"instance", "instance", func(a *Announce) { a.Instance = big(MaxInstanceLen + 1) }},
		{"agent_version", "agent_version", func(a *Announce) { a.AgentVersion = big(MaxVersionLen + 1) }},
		{"os", "os", func(a *Announce) { a.OS = big(MaxPlatformLen + 1) }},
		{"arch", "arch", func(a *Announce) { a.Arch = big(MaxPlatformLen + 1) }},
		{"hostname", "hostname", func(a *Announce) { a.Hostname = big(MaxHostnameLen + 1) }},
		{"cwd", "cwd", func(a *Announce) { a.Cwd = big(MaxPathLen + 1) }},
		{"cwd of 900 KB", "cwd", func(a *Announce) { a.Cwd = big(900 << 10) }},
		{"shell", "shell", func(a *Announce) { a.Shell = big(MaxPathLen + 1) }},
		{"policy_digest", "policy_digest", func(a *Announce) { a.PolicyDigest = big(MaxPolicyDigestLen + 1) }},
		{"confinement", "confinement", func(a *Announce) { a.Confinement = big(MaxConfinementLen + 1) }},
		{"too many labels", "labels", func(a *Announce) { a.Labels = labels(MaxLabels + 1) }},
		{"label key", "label key", func(a *Announce) { a.Labels = map[string]string{big(MaxLabelKeyLen + 1): "v"} }},
		{"empty label key", "empty key", func(a *Announce) { a.Labels = map[string]string{"": "v"} }},
		{"label value", "value of label", func(a *Announce) { a.Labels = map[string]string{"k": big(MaxLabelValueLen + 1)} }},
		{"too many tools", "tools", func(a *Announce) { a.Tools = strings.Fields(strings.Repeat("t ", MaxTools+1)) }},
		{"tool name", "tool name", func(a *Announce) { a.Tools = []string{big(MaxToolNameLen + 1)} }},
		{"too many skills", "skills", func(a *Announce) { a.Skills = skills(MaxSkills + 1) }},
		{"skill name", "skill name", func(a *Announce) { a.Skills[0].Name = big(MaxSkillNameLen + 1) }},
		{"skill description", "description", func(a *Announce) { a.Skills[0].Description = big(MaxSkillDescriptionLen + 1) }},
		{"skill path", "path", func(a *Announce) { a.Skills[0].Path = big(MaxPathLen + 1) }},
		{"skill problem", "problem", func(a *Announce) { a.Skills[0].Problem = big(MaxSkillProblemLen + 1) }},
		{"stats", "", func(a *Announce) {
			a.Stats = &AgentStats{CallsServed: 9, CallsFailed: 2, CallsRefused: 1, Queued: 3, Tasks: 1, RSSBytes: 20 << 20}
		}},
		{"stats negative queue", "stats", func(a *Announce) { a.Stats = &AgentStats{Queued: -1} }},
		{"stats negative tasks", "stats", func(a *Announce) { a.Stats = &AgentStats{Tasks: -1} }},
		{"stats negative memory", "stats", func(a *Announce) { a.Stats = &AgentStats{RSSBytes: -1} }},
		{"stats more failed than served", "stats", func(a *Announce) { a.Stats = &AgentStats{CallsServed: 1, CallsFailed: 2} }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a := validAnnounce()
			tc.mod(&a)
			err := a.Validate()
			if tc.field == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("Validate accepted it")
			}
			if !strings.Contains(err.Error(), tc.field) {
				t.Errorf("error %q does not name %q", err, tc.field)
			}
			if len(err.Error()) > 400 {
				t.Errorf("error is %d bytes long: it must quote the value cut short: %.300s", len(err.Error()), err)
			}
		})
	}
}

func TestDecodeAnnounce(t *testing.T) {
	good, _ := json.Marshal(validAnnounce())
	if a, err := DecodeAnnounce(good); err != nil || a.Host != "web-1" {
		t.Fatalf("DecodeAnnounce(valid) = %+v, %v", a, err)
	}
	tooBig := append(append([]byte(nil), good[:len(good)-1]...), []byte(`,"x":"`+strings.Repeat("y", MaxAnnounceBytes)+`"}`)...)
	for name, tc := range map[string]struct {
		data []byte
		want string
	}{
		"too large":   {tooBig, "bytes; at most"},
		"not JSON":    {[]byte("{"), "not valid JSON"},
		"wrong type":  {[]byte(`{"host":1}`), "not valid JSON"},
		"no host":     {[]byte(`{}`), "host"},
		"bad field":   {[]byte(`{"host":"a","cwd":"` + strings.Repeat("c", MaxPathLen+1) + `"}`), "cwd"},
		"JSON array":  {[]byte(`[]`), "not valid JSON"},
		"JSON null":   {[]byte(`null`), "host"},
		"empty input": {nil, "not valid JSON"},
	} {
		if _, err := DecodeAnnounce(tc.data); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want one containing %q", name, err, tc.want)
		} else if len(err.Error()) > 400 {
			t.Errorf("%s: error of %d bytes", name, len(err.Error()))
		}
	}
}

func TestExcerptAndClip(t *testing.T) {
	if got := Excerpt("short"); got != `"short"` {
		t.Errorf("Excerpt(short) = %s", got)
	}
	long := strings.Repeat("é", 200) // 400 bytes
	got := Excerpt(long)
	if !strings.HasSuffix(got, "... (400 bytes)") || len(got) > 130 {
		t.Errorf("Excerpt(long) = %s", got)
	}
	if c := Clip(long, 101); len(c) != 100 || !strings.HasPrefix(long, c) {
		t.Errorf("Clip split a character: %d bytes", len(c))
	}
	if Clip("abc", 0) != "" || Clip("abc", 5) != "abc" {
		t.Error("Clip edge cases")
	}
	if e := Ellipsis(long, 101); e != long[:100]+"…" {
		t.Errorf("Ellipsis(long, 101) = %q", e)
	}
	if Ellipsis("abc", 3) != "abc" || Ellipsis("abcd", 3) != "abc…" {
		t.Error("Ellipsis edge cases")
	}
}

// FuzzDecodeAnnounce: DecodeAnnounce never panics, and what it accepts is
// within every limit.
func FuzzDecodeAnnounce(f *testing.F) {
	good, _ := json.Marshal(validAnnounce())
	f.Add(good)
	f.Add([]byte(`{"host":"a","labels":{"":""}}`))
	f.Add([]byte(`{"host":"a","skills":[{"name":"x","description":"` + strings.Repeat("d", 5000) + `"}]}`))
	f.Add([]byte(`{"host":"a\u0000"}`))
	f.Add([]byte(`{"host":"a","tools":null,"labels":null}`))
	f.Add([]byte(`{"host":"a","stats":{"calls_served":3,"calls_failed":1,"calls_refused":2,"queued":1,"tasks":0,"rss_bytes":1048576}}`))
	f.Add([]byte(`{"host":"a","stats":{"queued":-1,"calls_failed":9}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		a, err := DecodeAnnounce(data)
		if err != nil {
			if a != nil || err.Error() == "" {
				t.Fatalf("DecodeAnnounce failed with %v but returned %+v", err, a)
			}
			if len(err.Error()) > 600 {
				t.Fatalf("error of %d bytes: %.200s", len(err.Error()), err)
			}
			return
		}
		if len(data) > MaxAnnounceBytes || ValidateHost(a.Host) != nil || len(a.Cwd) > MaxPathLen || len(a.Labels) > MaxLabels || len(a.Confinement) > MaxConfinementLen ||
			len(a.Tools) > MaxTools || len(a.Skills) > MaxSkills {
			t.Fatalf("DecodeAnnounce accepted an announce beyond the limits: %+v", a)
		}
		for _, s := range a.Skills {
			if len(s.Description) > MaxSkillDescriptionLen || len(s.Name) > MaxSkillNameLen {
				t.Fatalf("accepted skill %+v", s)
			}
		}
		if s := a.Stats; s != nil && (s.Queued < 0 || s.Tasks < 0 || s.RSSBytes < 0 || s.CallsFailed > s.CallsServed) {
			t.Fatalf("accepted stats %+v", *s)
		}
	})
}
