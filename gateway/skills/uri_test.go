package skills

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/fleetmcp/fleetmcp/protocol"
)

func TestSkillURIRoundTrip(t *testing.T) {
	for _, c := range []struct{ name, path, uri string }{
		{"deploy", "SKILL.md", "skill://deploy/SKILL.md"},
		{"deploy", "scripts/run.sh", "skill://deploy/scripts/run.sh"},
		{"deploy", "templates/my file.md", "skill://deploy/templates/my%20file.md"},
		{"deploy", "notes/résumé.txt", "skill://deploy/notes/r%C3%A9sum%C3%A9.txt"},
		{"a1", "x/100%.md", "skill://a1/x/100%25.md"},
		{"a1", "q;a=b,c&d+e.md", "skill://a1/q%3Ba=b%2Cc&d+e.md"},
		{"a1", "#tag.md", "skill://a1/%23tag.md"},
	} {
		if got := FileURI(c.name, c.path); got != c.uri {
			t.Errorf("FileURI(%q, %q) = %q, want %q", c.name, c.path, got, c.uri)
		}
		name, path, err := ParseURI(c.uri)
		if err != nil || name != c.name || path != c.path {
			t.Errorf("ParseURI(%q) = %q, %q, %v", c.uri, name, path, err)
		}
	}
}

// Every URI that is not the canonical spelling of a valid bundle path
// of a valid skill is refused, with a message saying what is wrong.
func TestParseSkillURIRefuses(t *testing.T) {
	for uri, want := range map[string]string{
		"resource://skills":                                "not a skill:// URI",
		"SKILL://deploy/SKILL.md":                          "not a skill:// URI",
		"skill://":                                         "name is missing",
		"skill:///SKILL.md":                                "name is missing",
		"skill://Deploy/SKILL.md":                          "lowercase",
		"skill://deploy":                                   "names no file",
		"skill://deploy/":                                  "names no file",
		"skill://deploy//SKILL.md":                         "absolute",
		"skill://deploy/a//SKILL.md":                       "empty part",
		"skill://deploy/../x/SKILL.md":                     ". or .. part",
		"skill://deploy/%2E%2E/SKILL.md":                   ". or .. part",
		"skill://deploy/a%2Fb.md":                          "not spelled as the gateway spells it",
		"skill://deploy/SKILL%2Emd":                        "not spelled as the gateway spells it",
		"skill://deploy/my file.md":                        "not spelled as the gateway spells it",
		"skill://deploy/x%zz":                              "bad percent-encoding",
		"skill://deploy/a%5Cb":                             `has '\\'`,
		"skill://deploy/CON.txt":                           "device",
		"skill://deploy/%00":                               "has '\\x00'",
		"skill://deploy/SKILL.md?x=1":                      "has '?'",
		"skill://deploy/SKILL.md#x":                        "not spelled",
		"skill://user@deploy/SKILL.md":                     "has '@'",
		"skill://deploy:80/SKILL.md":                       "has ':'",
		"skill://" + strings.Repeat("a", 65) + "/SKILL.md": "limit is 64",
	} {
		_, _, err := ParseURI(uri)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseURI(%q) = %v, want an error containing %q", uri, err, want)
		}
	}
}

func FuzzParseSkillURI(f *testing.F) {
	for _, s := range []string{"skill://deploy/SKILL.md", "skill://a/b%20c/d.md", "skill://a/%2E%2E/x", "skill://a//b",
		"skill://a/r%C3%A9.txt", "skill://A/x", "resource://hosts", "skill://a/x%zz"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, uri string) {
		name, path, err := ParseURI(uri)
		if err != nil {
			return
		}
		// What is accepted is a valid skill and bundle path, and the one
		// spelling of it.
		if protocol.ValidateSkillName(name) != nil || protocol.CheckBundlePath(path) != nil {
			t.Fatalf("%q accepted as %q, %q", uri, name, path)
		}
		if FileURI(name, path) != uri {
			t.Fatalf("%q accepted but spelled %q", uri, FileURI(name, path))
		}
	})
}

func TestSkillCursor(t *testing.T) {
	c := EncodeCursor("tiny-07")
	if name, err := DecodeCursor(c); err != nil || name != "tiny-07" {
		t.Fatalf("decode(encode) = %q, %v", name, err)
	}
	for _, bad := range []string{"", "!!", "dGlueS0wNw", EncodeCursor("Bad Name"), "djE6"} {
		if _, err := DecodeCursor(bad); err == nil || !strings.Contains(err.Error(), "invalid cursor") {
			t.Errorf("DecodeCursor(%q) = %v, want invalid cursor", bad, err)
		}
	}
}

func FuzzDecodeSkillCursor(f *testing.F) {
	f.Add(EncodeCursor("a"))
	f.Add("djE6LWE")
	f.Add("")
	f.Fuzz(func(t *testing.T, cursor string) {
		name, err := DecodeCursor(cursor)
		if err == nil && protocol.ValidateSkillName(name) != nil {
			t.Fatalf("%q decoded to invalid name %q", cursor, name)
		}
	})
}

func TestParseFrontmatter(t *testing.T) {
	fm, err := parseFrontmatter([]byte("\xef\xbb\xbf---\r\nname: x\r\ndescription: \"d: e\"\r\nn: 1.5\r\nt: 2024-01-02\r\nts: 2001-12-14t21:59:43.10-05:00\r\nm: {1: a, true: b}\r\nl: [1, null]\r\n---\r\nbody"))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"name": "x", "description": "d: e", "n": 1.5, "t": "2024-01-02", "ts": "2001-12-14T21:59:43.1-05:00",
		"m": map[string]any{"1": "a", "true": "b"}, "l": []any{1, nil}}
	if !reflect.DeepEqual(fm, want) {
		t.Fatalf("got %#v\nwant %#v", fm, want)
	}
	for doc, msg := range map[string]string{
		"no frontmatter":               "first line must be",
		"---\nname: x\n":               "not closed",
		"---\n- a\n- b\n---\n":         "not a YAML mapping",
		"---\nname: [\n---\n":          "not valid YAML",
		"---\nname: x\nn: .nan\n---\n": "no JSON form",
	} {
		if _, err := parseFrontmatter([]byte(doc)); err == nil || !strings.Contains(err.Error(), msg) {
			t.Errorf("parseFrontmatter(%q) = %v, want %q", doc, err, msg)
		}
	}
}

func FuzzParseFrontmatter(f *testing.F) {
	f.Add([]byte("---\nname: x\ndescription: y\n---\n"))
	f.Add([]byte("---\nm: {1: [a, {b: c}]}\n---"))
	f.Add([]byte("---\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		fm, err := parseFrontmatter(data)
		if err != nil {
			return
		}
		// Whatever is accepted has a JSON form.
		if _, err := json.Marshal(fm); err != nil {
			t.Fatalf("frontmatter of %q has no JSON form: %v", data, err)
		}
	})
}

func FuzzParseSkillDirURI(f *testing.F) {
	for _, s := range []string{"skill://deploy", "skill://deploy/templates", "skill://deploy/", "skill://a/b%20c", "skill://A"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, uri string) {
		name, dir, err := ParseDirURI(uri)
		if err != nil {
			return
		}
		if protocol.ValidateSkillName(name) != nil || (dir != "" && protocol.CheckBundlePath(dir) != nil) {
			t.Fatalf("%q accepted as %q, %q", uri, name, dir)
		}
		if DirURI(name, dir) != uri {
			t.Fatalf("%q accepted but spelled %q", uri, DirURI(name, dir))
		}
	})
}
