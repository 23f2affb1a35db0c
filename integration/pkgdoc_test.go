package integration

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"go/parser"
	"go/token"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// listedPackage is the part of `go list -json` output the package doc
// check needs.
type listedPackage struct {
	ImportPath, Name, Dir                          string
	GoFiles, CgoFiles, IgnoredGoFiles, TestGoFiles []string
}

// pkgDocProblems checks the package comment of the package p: exactly one
// of its files (any build tag; its test files only when it has no other)
// carries one, and it starts "Package NAME " or, for a command (package
// main), "Command DIR " where DIR is the command's folder. It returns
// what is wrong, naming the package, or nothing.
func pkgDocProblems(p listedPackage) []string {
	files := slices.Concat(p.GoFiles, p.CgoFiles, p.IgnoredGoFiles)
	if len(p.GoFiles)+len(p.CgoFiles) == 0 {
		files = append(files, p.TestGoFiles...) // a package of tests only
	}
	want := "Package " + p.Name + " "
	if p.Name == "main" {
		want = "Command " + filepath.Base(p.Dir) + " "
	}
	var docs []string
	var problems []string
	for _, name := range files {
		f, err := parser.ParseFile(token.NewFileSet(), filepath.Join(p.Dir, name), nil, parser.PackageClauseOnly|parser.ParseComments)
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: %v", p.ImportPath, err))
			continue
		}
		// Files of another package in the folder (an external test
		// package, a "package ignore" program) do not document this one.
		if f.Name.Name != p.Name || f.Doc == nil {
			continue
		}
		docs = append(docs, name)
		if text := f.Doc.Text(); !strings.HasPrefix(text, want) {
			first, _, _ := strings.Cut(text, "\n")
			problems = append(problems, fmt.Sprintf("%s: the package comment in %s starts %q; start it %q, then say what the package is for", p.ImportPath, name, first, want+"..."))
		}
	}
	switch {
	case len(docs) == 0:
		problems = append(problems, fmt.Sprintf("%s has no package comment: add a doc.go (or a comment above the package clause of its main file) that starts %q and says what the package is for and what it must not import", p.ImportPath, want+"..."))
	case len(docs) > 1:
		problems = append(problems, fmt.Sprintf("%s has a package comment in %d files (%s): keep one, in doc.go or the main file", p.ImportPath, len(docs), strings.Join(docs, ", ")))
	}
	return problems
}

// TestPkgDoc: every package of the module (commands, test helpers and
// packages of tests only included) says what it is for, in one package
// comment that starts "Package name" ("Command name" for a command), as
// go doc shows it.
func TestPkgDoc(t *testing.T) {
	cmd := exec.Command(goBinary(t), "list", "-e", "-json=ImportPath,Name,Dir,GoFiles,CgoFiles,IgnoredGoFiles,TestGoFiles", "./...")
	cmd.Dir = moduleRoot(t)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list ./...: %v\n%s", err, stderr.Bytes())
	}
	n := 0
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p listedPackage
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("decode go list output: %v", err)
		}
		n++
		for _, problem := range pkgDocProblems(p) {
			t.Error(problem)
		}
	}
	if n < 10 {
		t.Fatalf("go list ./... reported %d packages; the module has more", n)
	}
}

// TestPkgDocCatches plants packages that break the rule in a temporary
// folder and checks that each is reported, and that a good one is not.
func TestPkgDocCatches(t *testing.T) {
	dir := t.TempDir()
	write := func(pkg, name, src string) listedPackage {
		t.Helper()
		d := filepath.Join(dir, pkg)
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, name), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		return listedPackage{ImportPath: "example.com/" + pkg, Dir: d}
	}
	good := write("good", "doc.go", "// Package good does one thing.\npackage good\n")
	good.Name, good.GoFiles = "good", []string{"doc.go"}
	bare := write("bare", "bare.go", "package bare\n")
	bare.Name, bare.GoFiles = "bare", []string{"bare.go"}
	wrong := write("wrong", "wrong.go", "// This package does things.\npackage wrong\n")
	wrong.Name, wrong.GoFiles = "wrong", []string{"wrong.go"}
	twice := write("twice", "a.go", "// Package twice is documented here.\npackage twice\n")
	write("twice", "b.go", "// Package twice is documented again.\npackage twice\n")
	twice.Name, twice.GoFiles = "twice", []string{"a.go", "b.go"}
	cmdPkg := write("cmd/tool", "main.go", "// Package main runs a tool.\npackage main\n")
	cmdPkg.Name, cmdPkg.GoFiles = "main", []string{"main.go"}
	testsOnly := write("testsonly", "x_test.go", "package testsonly\n")
	testsOnly.Name, testsOnly.TestGoFiles = "testsonly", []string{"x_test.go"}
	tagged := write("tagged", "doc_linux.go", "// Package tagged is documented in a file of one system.\npackage tagged\n")
	tagged.Name, tagged.IgnoredGoFiles = "tagged", []string{"doc_linux.go"}

	for _, tc := range []struct {
		p    listedPackage
		want string // "" for no problem
	}{
		{good, ""},
		{tagged, ""},
		{bare, "example.com/bare has no package comment"},
		{wrong, `starts "This package does things."`},
		{twice, "in 2 files (a.go, b.go)"},
		{cmdPkg, `start it "Command tool ..."`},
		{testsOnly, "example.com/testsonly has no package comment"},
	} {
		got := strings.Join(pkgDocProblems(tc.p), "\n")
		switch {
		case tc.want == "" && got != "":
			t.Errorf("%s: %s, want no problem", tc.p.ImportPath, got)
		case tc.want != "" && !strings.Contains(got, tc.want):
			t.Errorf("%s: %q, want a problem saying %q", tc.p.ImportPath, got, tc.want)
		}
	}
}
