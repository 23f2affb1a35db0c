package protocol

import (
	"encoding/json"
	"fmt"
	"unicode/utf8"
)

// Limits of an Announce. Agents keep within them: they refuse at start a
// configuration that cannot be announced (a working directory, shell or
// label over its limit) and cut their skill catalog to fit. Gateways
// ignore an announce, or a hosts-bucket record, that exceeds any of them,
// so what one host can make a gateway hold is bounded whatever its agent
// sends.
const (
	// MaxAnnounceBytes bounds an encoded Announce.
	MaxAnnounceBytes = 256 << 10
	// MaxInstanceLen bounds Instance.
	MaxInstanceLen = 64
	// MaxVersionLen bounds AgentVersion.
	MaxVersionLen = 64
	// MaxPlatformLen bounds OS and Arch.
	MaxPlatformLen = 32
	// MaxHostnameLen bounds Hostname (a DNS name is at most 253).
	MaxHostnameLen = 255
	// MaxPathLen bounds Cwd, Shell and a skill's Path (Linux's PATH_MAX).
	MaxPathLen = 4096
	// MaxPolicyDigestLen bounds PolicyDigest ("sha256:" and 64 hex digits
	// today).
	MaxPolicyDigestLen = 128
	// MaxLabels, MaxLabelKeyLen and MaxLabelValueLen bound Labels.
	MaxLabels        = 64
	MaxLabelKeyLen   = 128
	MaxLabelValueLen = 256
	// MaxTools and MaxToolNameLen bound Tools.
	MaxTools       = 64
	MaxToolNameLen = 64
	// MaxSkills bounds the skills announced. A skill's Name is its folder
	// name (at most 255 bytes on common file systems), its Description at
	// most 1024 characters (4 bytes each at most), and its Problem is cut
	// to MaxSkillProblemLen.
	MaxSkills              = 200
	MaxSkillNameLen        = 255
	MaxSkillDescriptionLen = 4096
	MaxSkillProblemLen     = 1024
	// MaxConfinementLen bounds Confinement.
	MaxConfinementLen = 256
	// MaxTrustedKeys bounds TrustedKeys.
	MaxTrustedKeys = 8
)

// excerptLen is how much of an offending value an error quotes.
const excerptLen = 100

// Excerpt returns s quoted, cut to its first 100 bytes (on a character
// boundary) with its full length noted when longer: what an error or a log
// line shows of a value that may be huge.
func Excerpt(s string) string {
	if len(s) <= excerptLen {
		return fmt.Sprintf("%q", s)
	}
	return fmt.Sprintf("%q... (%d bytes)", Clip(s, excerptLen), len(s))
}

// Clip returns s cut to at most n bytes without splitting a UTF-8
// character.
func Clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	if n <= 0 {
		return ""
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut]
}

// Ellipsis returns s cut as Clip does, with "…" after it when it was
// cut: for messages that quote what they were given.
func Ellipsis(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return Clip(s, n) + "…"
}

// DecodeAnnounce parses an announce as received and checks it against
// the limits (Validate). Data over MaxAnnounceBytes is refused before it
// is parsed.
func DecodeAnnounce(data []byte) (*Announce, error) {
	if len(data) > MaxAnnounceBytes {
		return nil, fmt.Errorf("announce is %d bytes; at most %d are allowed", len(data), MaxAnnounceBytes)
	}
	var a Announce
	if err := json.Unmarshal(data, &a); err != nil {
		return nil, fmt.Errorf("announce is not valid JSON: %s", Clip(err.Error(), 200))
	}
	if err := a.Validate(); err != nil {
		return nil, err
	}
	return &a, nil
}

// checkLen reports a field longer than max bytes.
func checkLen(field, s string, max int) error {
	if len(s) > max {
		return fmt.Errorf("%s %s is %d bytes; at most %d are allowed", field, Excerpt(s), len(s), max)
	}
	return nil
}

// Validate checks a decoded announce against the limits above, and the
// host ID against ValidateHost. Its errors name the field and quote at
// most 100 bytes of the value.
func (a *Announce) Validate() error {
	if err := ValidateHost(a.Host); err != nil {
		return fmt.Errorf("host: %w", err)
	}
	fields := [...]struct {
		name, value string
		max         int
	}{
		{"instance", a.Instance, MaxInstanceLen},
		{"agent_version", a.AgentVersion, MaxVersionLen},
		{"os", a.OS, MaxPlatformLen},
		{"arch", a.Arch, MaxPlatformLen},
		{"hostname", a.Hostname, MaxHostnameLen},
		{"cwd", a.Cwd, MaxPathLen},
		{"shell", a.Shell, MaxPathLen},
		{"policy_digest", a.PolicyDigest, MaxPolicyDigestLen},
		{"confinement", a.Confinement, MaxConfinementLen},
	}
	for _, f := range fields {
		if err := checkLen(f.name, f.value, f.max); err != nil {
			return err
		}
	}
	if err := checkLabelLimits(a.Labels); err != nil {
		return err
	}
	if len(a.Tools) > MaxTools {
		return fmt.Errorf("%d tools announced; at most %d are allowed", len(a.Tools), MaxTools)
	}
	for _, t := range a.Tools {
		if err := checkLen("tool name", t, MaxToolNameLen); err != nil {
			return err
		}
	}
	if len(a.TrustedKeys) > MaxTrustedKeys {
		return fmt.Errorf("%d trusted keys announced; at most %d are allowed", len(a.TrustedKeys), MaxTrustedKeys)
	}
	for _, k := range a.TrustedKeys {
		if err := checkLen("trusted key", k, 32); err != nil {
			return err
		}
	}
	if s := a.Stats; s != nil && (s.Queued < 0 || s.Tasks < 0 || s.RSSBytes < 0 || s.CallsFailed > s.CallsServed) {
		return fmt.Errorf("stats %+v: counts must not be negative, nor failed calls more than served ones", *s)
	}
	return validateSkills(a.Skills)
}

func validateSkills(skills []Skill) error {
	if len(skills) > MaxSkills {
		return fmt.Errorf("%d skills announced; at most %d are allowed", len(skills), MaxSkills)
	}
	for i := range skills {
		s := &skills[i]
		if err := checkLen("skill name", s.Name, MaxSkillNameLen); err != nil {
			return err
		}
		var field, value string
		var max int
		switch {
		case len(s.Description) > MaxSkillDescriptionLen:
			field, value, max = "description", s.Description, MaxSkillDescriptionLen
		case len(s.Path) > MaxPathLen:
			field, value, max = "path", s.Path, MaxPathLen
		case len(s.Problem) > MaxSkillProblemLen:
			field, value, max = "problem", s.Problem, MaxSkillProblemLen
		default:
			continue
		}
		return checkLen("skill "+Excerpt(s.Name)+" "+field, value, max)
	}
	return nil
}
