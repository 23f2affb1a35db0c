package skillmd

import (
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	for _, tt := range []struct{ text, wantErr string }{
		{"---\nname: deploy\ndescription: Deploys.\n---\nbody", ""},
		{"\xef\xbb\xbf---\r\nname: deploy\r\ndescription: Deploys.\r\n---\r\n", ""},
		{"name: deploy\n", "does not start with YAML frontmatter"},
		{"---\nname: deploy\ndescription: x\n", "not closed"},
		{"---\nname: other\ndescription: x\n---\n", "differs from its folder name"},
		{"---\nname: deploy\n---\n", "description is missing"},
		{"---\nname: deploy\ndescription: x\nowner: me\n---\n", "unknown key(s) owner"},
		{"---\n- a\n---\n", "not a YAML mapping"},
		{"---\nname: Deploy\ndescription: x\n---\n", "lowercase"},
		{"---\nname: deploy\ndescription: " + strings.Repeat("d", MaxDescription+1) + "\n---\n", "limit is 1024"},
	} {
		_, err := Parse("deploy", []byte(tt.text))
		if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
			t.Errorf("Parse(%q) = %v, want %q", tt.text, err, tt.wantErr)
		}
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte("---\nname: deploy\ndescription: Deploys.\n---\nbody"))
	f.Add([]byte("---\nname: deploy\nmetadata: {a: b}\n---\n"))
	f.Add([]byte("---\n---\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := Parse("deploy", data)
		if err == nil && (m.Name != "deploy" || strings.TrimSpace(m.Description) == "") {
			t.Fatalf("accepted %q as %+v", data, m)
		}
	})
}
