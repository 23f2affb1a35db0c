package gateway

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestRedactText(t *testing.T) {
	r := newRedactor()
	tests := []struct {
		in, want string
	}{
		{"uptime", "uptime"},
		{"ls -la /etc && cat /var/log/syslog", "ls -la /etc && cat /var/log/syslog"},
		{"export GITHUB_TOKEN=abc123 && make", "export GITHUB_TOKEN=[redacted] && make"},
		{"export API_TOKEN=abc;run", "export API_TOKEN=[redacted];run"},
		{"DB_PASSWORD='s3cr et' ./run", "DB_PASSWORD=[redacted] ./run"},
		{`curl -H "Authorization: Bearer eyJabc.def.ghi" https://x`, `curl -H "Authorization: [redacted]" https://x`},
		{"curl -u admin:hunter2 https://admin:hunter2@example.com/x", "curl -u admin:hunter2 https://admin:[redacted]@example.com/x"},
		{"mysql --password hunter2 db", "mysql --password [redacted] db"},
		{"tool --api-key=k-123 run", "tool --api-key=[redacted] run"},
		{"echo ghp_abcdefghijklmnopqrstuvwxyz0123", "echo [redacted]"},
		{"aws s3 ls # AKIAABCDEFGHIJKLMNOP", "aws s3 ls # [redacted]"},
		{"cat <<EOF\n-----BEGIN RSA PRIVATE KEY-----\nMIIB\n-----END RSA PRIVATE KEY-----\nEOF", "cat <<EOF\n[redacted private key]\nEOF"},
		{"use " + apiTokenPrefix + "abcdefghijklmnopqrstuvwxyz", "use [redacted]"},
	}
	for _, tc := range tests {
		if got := r.text(tc.in); got != tc.want {
			t.Errorf("text(%q)\n got %q\nwant %q", tc.in, got, tc.want)
		}
	}
	long := strings.Repeat("é", 5000)
	if got := r.text(long); len(got) > maxSummaryText+40 || !strings.Contains(got, "more bytes]") {
		t.Errorf("a long text was kept at %d bytes", len(got))
	}
}

func TestRedactArgs(t *testing.T) {
	r := newRedactor()
	raw := json.RawMessage(`{"host":"web-1","path":"/etc/app.conf","content":"password=x\nline2","offset":3,
		"edits":[{"old_string":"a","new_string":"b"}],"api_key":"k","opts":{"x":1},"tags":["a","b"],"token":"t"}`)
	got := r.args(raw)
	want := map[string]any{
		"host": "web-1", "path": "/etc/app.conf", "content_bytes": 16, "offset": 3.0,
		"edits_bytes": 37, "api_key": "[redacted]", "opts": "[object, 7 bytes]", "tags": "[2 items, 9 bytes]", "token": "[redacted]",
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("args[%q] = %#v, want %#v", k, got[k], v)
		}
	}
	if len(got) != len(want) {
		t.Errorf("args = %v, want exactly the keys of %v", got, want)
	}
	if got := r.args(json.RawMessage(`[1,2]`)); got["unreadable_bytes"] != 5 {
		t.Errorf("non-object arguments = %v", got)
	}
	if got := r.args(nil); got != nil {
		t.Errorf("no arguments = %v, want nil", got)
	}
}
