package integration

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// mdLink is a Markdown link's target: ](target) with no spaces.
var mdLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// TestDocsLinks: every relative link in the project's Markdown files names
// a file that exists, and every #anchor a heading of that file. The
// reference lives in each folder's README.md and the files point at each
// other; a section moved or renamed must not leave a link to nowhere.
func TestDocsLinks(t *testing.T) {
	root := moduleRoot(t)
	docs := map[string][]string{} // path -> lines
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "node_modules" || d.Name() == "testdata" || (strings.HasPrefix(d.Name(), ".") && path != root)) {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(d.Name(), ".md") {
			data, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			docs[path] = strings.Split(string(data), "\n")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(docs) < 5 {
		t.Fatalf("found %d Markdown files under %s; the walk is broken", len(docs), root)
	}
	anchors := map[string]map[string]bool{}
	anchorsOf := func(path string) map[string]bool {
		if a, ok := anchors[path]; ok {
			return a
		}
		a := headingAnchors(docs[path])
		anchors[path] = a
		return a
	}
	links := 0
	for path, lines := range docs {
		rel, _ := filepath.Rel(root, path)
		inFence := false
		for i, line := range lines {
			if strings.HasPrefix(strings.TrimSpace(line), "```") {
				inFence = !inFence
			}
			if inFence {
				continue
			}
			for _, m := range mdLink.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				links++
				file, anchor, _ := strings.Cut(target, "#")
				dest := path
				if file != "" {
					dest = filepath.Join(filepath.Dir(path), file)
					if _, err := os.Stat(dest); err != nil {
						t.Errorf("%s:%d: link %q: no such file", rel, i+1, target)
						continue
					}
				}
				if anchor == "" {
					continue
				}
				if _, ok := docs[dest]; !ok {
					t.Errorf("%s:%d: link %q: an anchor into a file that is not Markdown", rel, i+1, target)
					continue
				}
				if !anchorsOf(dest)[anchor] {
					t.Errorf("%s:%d: link %q: %s has no heading with anchor #%s", rel, i+1, target, filepath.Base(dest), anchor)
				}
			}
		}
	}
	if links == 0 {
		t.Fatal("no relative links found: the pattern is broken")
	}
}

// headingAnchors returns the anchors GitHub makes for the headings of a
// Markdown file: lowercased, punctuation other than - and _ dropped,
// spaces made -, a repeated anchor numbered -1, -2...
func headingAnchors(lines []string) map[string]bool {
	seen := map[string]int{}
	out := map[string]bool{}
	inFence := false
	for _, line := range lines {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			inFence = !inFence
		}
		if inFence || !strings.HasPrefix(line, "#") {
			continue
		}
		text := strings.TrimSpace(strings.TrimLeft(line, "#"))
		var b strings.Builder
		for _, r := range strings.ToLower(text) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				b.WriteRune(r)
			}
		}
		a := b.String()
		if n := seen[a]; n > 0 {
			out[a+"-"+strconv.Itoa(n)] = true
		} else {
			out[a] = true
		}
		seen[a]++
	}
	return out
}
