package policy

import (
	"bufio"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// archive is a txtar file: a comment, then files introduced by
// "-- name --" lines.
type archive struct {
	comment string
	files   map[string]string
}

func readArchive(t *testing.T, path string) archive {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	a := archive{files: map[string]string{}}
	name := ""
	var cur strings.Builder
	flush := func() {
		if name == "" {
			a.comment = cur.String()
		} else {
			a.files[name] = cur.String()
		}
		cur.Reset()
	}
	for _, line := range strings.SplitAfter(string(data), "\n") {
		trimmed := strings.TrimRight(line, "\n")
		if strings.HasPrefix(trimmed, "-- ") && strings.HasSuffix(trimmed, " --") && len(trimmed) > 6 {
			flush()
			name = strings.TrimSpace(trimmed[3 : len(trimmed)-3])
			continue
		}
		cur.WriteString(line)
	}
	flush()
	return a
}

// testCase is one line of a cases file: "ok LINE" or "no LINE => WANT",
// where WANT is text the refusal must contain. A LINE that is a whole
// Go-quoted string stands for its value (for newlines).
type testCase struct {
	pos, line, want string
	allow           bool
}

func readCases(t *testing.T, file, text string) []testCase {
	t.Helper()
	var cases []testCase
	sc := bufio.NewScanner(strings.NewReader(text))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		verdict, rest, _ := strings.Cut(line, " ")
		tc := testCase{pos: file + ":cases:" + strconv.Itoa(n), allow: verdict == "ok"}
		if verdict != "ok" && verdict != "no" {
			t.Fatalf("%s: want ok or no, not %q", tc.pos, verdict)
		}
		rest, tc.want, _ = strings.Cut(strings.TrimSpace(rest), " => ")
		tc.line = strings.TrimSpace(rest)
		if s, err := strconv.Unquote(tc.line); err == nil && strings.HasPrefix(tc.line, `"`) {
			tc.line = s // a Go string, for lines with newlines
		}
		cases = append(cases, tc)
	}
	return cases
}

// archiveEnv reads an archive's optional "env" file of key: value lines.
func archiveEnv(t *testing.T, a archive) Env {
	env := Env{Cwd: "/srv/app", Home: "/home/agent", Tools: testTools, GitGuarded: true}
	for _, line := range strings.Split(a.files["env"], "\n") {
		k, v, ok := strings.Cut(line, ":")
		v = strings.TrimSpace(v)
		switch strings.TrimSpace(k) {
		case "cwd":
			env.Cwd = v
		case "home":
			env.Home = v
		case "shell":
			env.Shell = v
		case "fold":
			if v != "case" {
				t.Fatalf("env: fold: %q; the only value is case", v)
			}
			env.FoldCase = true
		case "git":
			if v != "unguarded" {
				t.Fatalf("env: git: %q; the only value is unguarded", v)
			}
			env.GitGuarded = false
		case "":
		default:
			if ok {
				t.Fatalf("env: unknown key %q", k)
			}
		}
	}
	return env
}

func archives(t *testing.T, dir string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("testdata", dir, "*.txtar"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no testdata/%s/*.txtar (%v)", dir, err)
	}
	return files
}
