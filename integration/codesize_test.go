package integration

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

// Size limits of the non-test Go code: a file longer than maxFileLines or
// a function longer than maxFuncLines is split, and the gateway package
// itself (its wiring, MCP surface, registry and router) stays under
// maxGatewayLines; what grows past that belongs in one of its
// subpackages.
const (
	maxFileLines    = 800
	maxFuncLines    = 100
	maxGatewayLines = 12000
)

// codeSize is what sizeOf measured of one tree of Go files.
type codeSize struct {
	// lines counts the non-test lines of each package directory.
	lines map[string]int
	// over names each file and function past its limit.
	over []string
}

// sizeOf measures the non-test Go files under root.
func sizeOf(root string) (codeSize, error) {
	cs := codeSize{lines: map[string]int{}}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != root && (d.Name() == "testdata" || d.Name() == "node_modules" || strings.HasPrefix(d.Name(), ".")) {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		n := fset.File(f.Pos()).LineCount()
		cs.lines[filepath.ToSlash(filepath.Dir(rel))] += n
		if n > maxFileLines {
			cs.over = append(cs.over, fmt.Sprintf("%s: %d lines (at most %d: split it by concern)", rel, n, maxFileLines))
		}
		for _, decl := range f.Decls {
			fd, ok := decl.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			if n := fset.Position(fd.End()).Line - fset.Position(fd.Pos()).Line + 1; n > maxFuncLines {
				cs.over = append(cs.over, fmt.Sprintf("%s: func %s: %d lines (at most %d)", rel, fd.Name.Name, n, maxFuncLines))
			}
		}
		return nil
	})
	return cs, err
}

// TestCodeSize: no non-test file over maxFileLines, no function over
// maxFuncLines, and the gateway package itself under maxGatewayLines.
func TestCodeSize(t *testing.T) {
	cs, err := sizeOf(moduleRoot(t))
	if err != nil {
		t.Fatal(err)
	}
	if cs.lines["gateway"] == 0 {
		t.Fatal("no gateway package found: the walk is broken")
	}
	for _, o := range cs.over {
		t.Error(o)
	}
	if n := cs.lines["gateway"]; n > maxGatewayLines {
		t.Errorf("the gateway package has %d non-test lines, more than %d: move a concern into a subpackage of its own", n, maxGatewayLines)
	}
}

// TestCodeSizeFindsOverruns: the measure finds a long function and a long
// file planted in a tree of its own.
func TestCodeSizeFindsOverruns(t *testing.T) {
	dir := t.TempDir()
	var long strings.Builder
	long.WriteString("package p\n\nfunc long() {\n")
	for range maxFuncLines {
		long.WriteString("\t_ = 1\n")
	}
	long.WriteString("}\n")
	writeFile(t, filepath.Join(dir, "p", "long.go"), long.String())
	var many strings.Builder
	many.WriteString("package p\n")
	for i := range maxFileLines {
		fmt.Fprintf(&many, "\nvar v%d = %d", i, i)
	}
	writeFile(t, filepath.Join(dir, "p", "many.go"), many.String()+"\n")
	writeFile(t, filepath.Join(dir, "p", "many_test.go"), many.String()+"\n")
	cs, err := sizeOf(dir)
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Join(cs.over, "\n")
	if len(cs.over) != 2 || !strings.Contains(got, "func long") || !strings.Contains(got, "many.go:") {
		t.Errorf("found:\n%s\nwant the function long and the file many.go, not the test file", got)
	}
}
