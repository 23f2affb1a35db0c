package integration

import (
	"bufio"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestRedirectEscapes: through the gateway, bash redirections are held to
// the path rules where the kernel puts their files (".." after a link to
// a directory climbs out of the link's destination), input redirections
// to the read rules, and /dev/tcp is refused.
func TestRedirectEscapes(t *testing.T) {
	env := NewEnv(t, Options{Agents: []string{}})
	cwd := policyHost(t, env, "guarded", `
bash: {allow: ["echo *", "cat *"]}
paths: {read: {allow: ["CWD/work/**"]}, write: {allow: ["CWD/work/**"]}}
`)
	writeFile(t, filepath.Join(cwd, "work/ok.txt"), "ok\n")
	writeFile(t, filepath.Join(cwd, "secret.txt"), "TOPSECRET\n")
	if err := os.Symlink(".", filepath.Join(cwd, "work/self")); err != nil {
		t.Fatal(err)
	}
	cs := env.Client("", nil)
	bash := func(command string) string {
		return text(call(t, cs, "bash", map[string]any{"host": "guarded", "command": command}))
	}

	for _, line := range []string{"echo x > work/self/../escaped", "echo x > " + cwd + "/work/self/self/../escaped"} {
		if got := bash(line); !strings.Contains(got, "denied by host policy") || !strings.Contains(got, "outside paths.write.allow") {
			t.Errorf("%s: %q, want a refusal", line, got)
		}
	}
	if _, err := os.Lstat(filepath.Join(cwd, "escaped")); !os.IsNotExist(err) {
		t.Errorf("a redirection escaped the allowed tree: %v", err)
	}
	if got := bash("cat < work/self/../secret.txt"); strings.Contains(got, "TOPSECRET") || !strings.Contains(got, "outside paths.read.allow") {
		t.Errorf("input redirection out of the read rules: %q", got)
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if got := bash("cat < /dev/tcp/127.0.0.1/" + strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)); !strings.Contains(got, "network connections") {
		t.Errorf("/dev/tcp: %q, want a refusal", got)
	}
	// Had the shell connected, its connection would be first in the
	// listen queue.
	probe, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer probe.Close()
	if _, err := probe.Write([]byte("probe\n")); err != nil {
		t.Fatal(err)
	}
	first, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	if line, _ := bufio.NewReader(first).ReadString('\n'); line != "probe\n" {
		t.Errorf("first connection sent %q: the refused line connected", line)
	}
	if got := mustOK(t, call(t, cs, "bash", map[string]any{"host": "guarded", "command": "echo x > work/self/in && cat < work/self/../work/in"})); got != "x\n" {
		t.Errorf("allowed redirections through the link: %q", got)
	}
}

// TestSkillLinkOutOfPolicy: a SKILL.md that links out of the allowed
// paths neither shows its description in the fleet's skill catalog nor
// comes back from the skill tool.
func TestSkillLinkOutOfPolicy(t *testing.T) {
	env := NewEnv(t, Options{Agents: []string{}})
	cwd := policyHost(t, env, "guarded", `paths: {allow: ["CWD/**"]}`)
	secret := filepath.Join(t.TempDir(), "notes.md")
	writeFile(t, secret, "---\nname: leak\ndescription: SECRET-DESCRIPTION\n---\nSECRET-BODY\n")
	skillDir := filepath.Join(cwd, ".agents", "skills", "leak")
	if err := os.MkdirAll(skillDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secret, filepath.Join(skillDir, "SKILL.md")); err != nil {
		t.Fatal(err)
	}
	cs := env.Client("", nil)
	var doc skillsDoc
	waitFor(t, 10*time.Second, "the linked skill in the catalog", func() bool {
		doc = skillsDoc{}
		readJSON(t, cs, "resource://skills", &doc)
		_, valid := doc.Skills["leak"]
		return valid || slices.ContainsFunc(doc.Invalid, func(s struct{ Name, Host, Path, Problem string }) bool { return s.Name == "leak" })
	})
	catalog := readResource(t, cs, "resource://skills").Text
	if strings.Contains(catalog, "SECRET") || !strings.Contains(catalog, "refused by the host policy") {
		t.Errorf("skills catalog:\n%s", catalog)
	}
	if hosts := text(call(t, cs, "hosts", nil)); strings.Contains(hosts, "SECRET") {
		t.Errorf("hosts shows the secret:\n%s", hosts)
	}
	res := call(t, cs, "skill", map[string]any{"host": "guarded", "name": "leak"})
	if got := text(res); !res.IsError || strings.Contains(got, "SECRET") {
		t.Errorf("skill leak: %q (error %v)", got, res.IsError)
	}
}

// TestAuditRedactsCommands: secrets in command lines stay out of the
// audit trail, in each of their common shapes.
func TestAuditRedactsCommands(t *testing.T) {
	env := NewEnv(t, Options{})
	cs := env.Client("", nil)
	lines := []string{
		": mysql -u root -pS3cretA shop",
		": curl -H 'Authorization: Bearer S3cretB' https://api.example.com",
		"PGPASSWORD=S3cretC true",
		": git clone https://bob:S3cretD@git.example.com/r.git",
		": aws configure set aws_secret_access_key wJalrXUtnFEMI/K7MDENG/bPxRfiS3cretEKEYEX",
		": psql --password=S3cretF; : sshpass -p S3cretG ssh h",
		"ENCRYPTION_KEY=S3cretH true",
		": openssl enc -aes256 -k S3cretI -in f; : sqlplus scott/S3cretJ@db",
		": curl 'https://maps.example.com/api?key=S3cretK&q=x'",
		": fleet-agent join fmcp1.abcdefghij.S3cretLW8PKz1m2nQ3oR4sT5uV6wX7yZ8aB9cD0e",
		": echo '-----BEGIN USER NKEY SEED-----\nSUAS3cretM\n------END USER NKEY SEED------'",
	}
	for _, line := range lines {
		mustOK(t, call(t, cs, "bash", map[string]any{"host": "alpha", "command": line}))
	}
	var recs []string
	waitFor(t, 10*time.Second, "the audit records", func() bool {
		recs = recs[:0]
		for _, r := range auditRecords(t, cs, map[string]any{"tool": "bash"}) {
			recs = append(recs, r.Args["command"].(string))
		}
		return len(recs) == len(lines)
	})
	for _, r := range recs {
		if strings.Contains(r, "S3cret") || !strings.Contains(r, "[redacted") {
			t.Errorf("audit record of a command: %q", r)
		}
	}
	if !slices.Contains(recs, ": mysql -u root -p[redacted] shop") || !slices.Contains(recs, ": git clone https://bob:[redacted]@git.example.com/r.git") {
		t.Errorf("records lost what is not secret: %q", recs)
	}
}
