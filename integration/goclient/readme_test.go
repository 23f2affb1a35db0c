package goclient

import (
	"fmt"
	"os"
	"strings"
	"testing"
)

// readmeHeading is the line of the top README.md the Go snippet follows.
const readmeHeading = "- **Go (go-sdk):**"

// exampleMarker starts, in client_example_test.go, the lines that are
// the README's snippet; "// Output:" ends them.
const exampleMarker = "// README.md, Go (go-sdk):"

// TestREADMESnippet: the Go snippet of the top README.md is the code
// Example runs, white space aside, so neither changes without the other.
func TestREADMESnippet(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	snippet, err := readmeGoBlock(string(readme))
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("client_example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	example, ok := between(string(src), exampleMarker, "// Output:")
	if !ok {
		t.Fatalf("client_example_test.go has no %q ... // Output: section", exampleMarker)
	}
	if normalise(snippet) != normalise(example) {
		t.Errorf("README.md's Go snippet and Example differ; make them the same code.\nREADME.md:\n%s\nclient_example_test.go:\n%s", snippet, example)
	}
}

// TestREADMESnippetCatches: a snippet one word away from the example is
// told apart from it, and white space alone is not.
func TestREADMESnippetCatches(t *testing.T) {
	readme := "# x\n\n" + readmeHeading + " words\n\n  ```go\n  a := f(1,\n  \tb)\n  ```\n"
	got, err := readmeGoBlock(readme)
	if err != nil {
		t.Fatal(err)
	}
	if normalise(got) != normalise("a := f(1, b)") || normalise(got) == normalise("a := f(2, b)") {
		t.Errorf("readmeGoBlock = %q, normalised %q", got, normalise(got))
	}
	if _, err := readmeGoBlock("# x\n"); err == nil {
		t.Error("a README without the snippet was not refused")
	}
}

// readmeGoBlock returns the first ```go block after readmeHeading.
func readmeGoBlock(readme string) (string, error) {
	_, rest, ok := strings.Cut(readme, "\n"+readmeHeading)
	if !ok {
		return "", fmt.Errorf("README.md has no line starting %q", readmeHeading)
	}
	block, ok := between(rest, "```go\n", "```")
	if !ok {
		return "", fmt.Errorf("README.md has no ```go block after %q", readmeHeading)
	}
	return block, nil
}

// between returns the text of s after the first start and before the
// next end.
func between(s, start, end string) (string, bool) {
	_, rest, ok := strings.Cut(s, start)
	if !ok {
		return "", false
	}
	text, _, ok := strings.Cut(rest, end)
	return text, ok
}

// normalise makes runs of white space one space, and drops the white
// space next to brackets and commas, where gofmt may put a line break.
func normalise(code string) string {
	s := strings.Join(strings.Fields(code), " ")
	for _, p := range []string{"( ", "{ ", "[ ", ", "} {
		s = strings.ReplaceAll(s, p, strings.TrimSpace(p))
	}
	for _, p := range []string{" )", " }", " ]"} {
		s = strings.ReplaceAll(s, p, strings.TrimSpace(p))
	}
	return s
}
