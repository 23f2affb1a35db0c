package integration

import (
	"bytes"
	"encoding/json"
	"errors"
	"go/build"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/fleetmcp/fleetmcp"

// goPackage is the part of `go list -json` output the import rules need.
type goPackage struct {
	ImportPath   string
	Name         string
	Dir          string
	Standard     bool
	Imports      []string
	TestImports  []string
	XTestImports []string
	Error        *struct{ Err string }
}

// pkgGraph is the result of one `go list -deps` run, keyed by import path.
type pkgGraph map[string]*goPackage

func goBinary(t *testing.T) string {
	t.Helper()
	exe := "go"
	if runtime.GOOS == "windows" {
		exe += ".exe"
	}
	if p := filepath.Join(build.Default.GOROOT, "bin", exe); fileExists(p) {
		return p
	}
	p, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go command to list packages with: %v", err)
	}
	return p
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// moduleRoot is the directory holding go.mod, one level above this package.
func moduleRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	if !fileExists(filepath.Join(root, "go.mod")) {
		t.Fatalf("no go.mod in %s", root)
	}
	return root
}

// goList runs `go list -e -deps -json` on patterns for goos and returns
// every package it reports.
func goList(t *testing.T, goos string, patterns ...string) pkgGraph {
	t.Helper()
	args := append([]string{"list", "-e", "-deps", "-json=ImportPath,Name,Dir,Standard,Imports,TestImports,XTestImports,Error"}, patterns...)
	cmd := exec.Command(goBinary(t), args...)
	cmd.Dir = moduleRoot(t)
	cmd.Env = append(os.Environ(), "GOOS="+goos)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("GOOS=%s go %s: %v\n%s", goos, strings.Join(args, " "), err, stderr.Bytes())
	}
	g := pkgGraph{}
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p goPackage
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("decode go list output: %v", err)
		}
		g[p.ImportPath] = &p
	}
	for path, p := range g {
		if inModule(path) && p.Error != nil {
			t.Errorf("GOOS=%s: cannot check the imports of %s: %s", goos, path, p.Error.Err)
		}
	}
	return g
}

func inModule(path string) bool { return path == module || strings.HasPrefix(path, module+"/") }

// under reports whether path is pkg or one of its subpackages.
func under(path, pkg string) bool { return path == pkg || strings.HasPrefix(path, pkg+"/") }

// chain returns the shortest import chain from root to a package for which
// match is true, or nil when root does not depend on any.
func (g pkgGraph) chain(root string, match func(string) bool) []string {
	prev := map[string]string{root: ""}
	queue := []string{root}
	for len(queue) > 0 {
		cur := queue[0]
		queue = queue[1:]
		if cur != root && match(cur) {
			var path []string
			for p := cur; p != ""; p = prev[p] {
				path = append(path, p)
			}
			slices.Reverse(path)
			return path
		}
		p := g[cur]
		if p == nil {
			continue
		}
		for _, imp := range p.Imports {
			if _, seen := prev[imp]; !seen {
				prev[imp] = cur
				queue = append(queue, imp)
			}
		}
	}
	return nil
}

// modulePackages returns the module's own packages in g, sorted.
func (g pkgGraph) modulePackages() []*goPackage {
	var out []*goPackage
	for path, p := range g {
		if inModule(path) {
			out = append(out, p)
		}
	}
	slices.SortFunc(out, func(a, b *goPackage) int { return strings.Compare(a.ImportPath, b.ImportPath) })
	return out
}

// targetOSes are the systems agents run on; the agent's dependencies are
// checked for each, since build tags can change them.
func targetOSes() []string {
	oses := []string{runtime.GOOS}
	for _, o := range []string{"linux", "darwin", "windows"} {
		if !slices.Contains(oses, o) {
			oses = append(oses, o)
		}
	}
	return oses
}

// TestDepsAgentBinary: fleet-agent must stay a small binary that links
// neither the NATS server, the MCP SDK, OIDC nor the gateway; nor gRPC,
// which the OpenTelemetry OTLP exporters (HTTP and gRPC alike) would
// bring, nearly doubling it: its spans go out through the small OTLP/HTTP
// client of cmd/internal/tracing.
func TestDepsAgentBinary(t *testing.T) {
	root := module + "/cmd/fleet-agent"
	forbidden := []string{
		"github.com/nats-io/nats-server/v2",
		"github.com/modelcontextprotocol/go-sdk",
		"github.com/coreos/go-oidc/v3",
		"google.golang.org/grpc",
		"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp",
		"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc",
		module + "/gateway",
	}
	for _, goos := range targetOSes() {
		g := goList(t, goos, "./cmd/fleet-agent")
		if g[root] == nil {
			t.Fatalf("GOOS=%s: go list did not report %s", goos, root)
		}
		for _, bad := range forbidden {
			if c := g.chain(root, func(p string) bool { return under(p, bad) }); c != nil {
				t.Errorf("GOOS=%s: fleet-agent depends on %s: %s", goos, c[len(c)-1], strings.Join(c, " -> "))
			}
		}
	}
}

// agentLeaves are the packages below agent that the tools build on. Each
// stands alone: it imports neither the agent nor the gateway, and from
// this module at most policy, protocol and the agent's base (agentBase).
var agentLeaves = []string{
	module + "/agent/callauth",
	module + "/agent/safefs",
	module + "/agent/statelock",
	module + "/agent/tasks",
	module + "/agent/unidiff",
	module + "/agent/winjob",
}

// agentBase are the leaves the others may build on: the link-refusing
// file layer and the Windows job object calls. They import no leaf.
var agentBase = []string{module + "/agent/safefs", module + "/agent/winjob"}

// leafImportBad reports whether leaf, one of agentLeaves, may not import
// imp.
func leafImportBad(leaf, imp string) bool {
	switch {
	case !inModule(imp) || imp == leaf || imp == module+"/protocol" || under(imp, module+"/policy"):
		return false
	case slices.Contains(agentBase, imp):
		return slices.Contains(agentBase, leaf)
	}
	return true
}

const leafRule = "may import only policy, protocol and (unless it is one of them) safefs and winjob from this module: it is a leaf the agent's tools build on"

// TestDepsAgentLeaves holds the agent's leaves to their rule on every
// system agents run on: build tags change what a package imports.
func TestDepsAgentLeaves(t *testing.T) {
	for _, goos := range targetOSes() {
		g := goList(t, goos, "./agent/...")
		for _, leaf := range agentLeaves {
			if g[leaf] == nil {
				t.Errorf("GOOS=%s: go list did not report %s, so its rule was not checked", goos, leaf)
				continue
			}
			if c := g.chain(leaf, func(imp string) bool { return leafImportBad(leaf, imp) }); c != nil {
				t.Errorf("GOOS=%s: %s %s, but imports %s: %s", goos, leaf, leafRule, c[len(c)-1], strings.Join(c, " -> "))
			}
		}
	}
}

// TestDepsModuleRules checks the import rules between the module's own
// packages, on every package of the module.
func TestDepsModuleRules(t *testing.T) {
	g := goList(t, runtime.GOOS, "./...")
	pkgs := g.modulePackages()
	if len(pkgs) == 0 {
		t.Fatal("go list reported no packages of the module")
	}
	gateway, agent, protocol, policy := module+"/gateway", module+"/agent", module+"/protocol", module+"/policy"
	checked := map[string]bool{}

	for _, p := range pkgs {
		// Test files are held to the same rules: they are compiled into
		// the package and show what it is allowed to know about.
		var testImports []string
		testImports = append(testImports, p.TestImports...)
		testImports = append(testImports, p.XTestImports...)
		rule := func(what string, bad func(string) bool) {
			if c := g.chain(p.ImportPath, bad); c != nil {
				t.Errorf("%s %s, but imports %s: %s", p.ImportPath, what, c[len(c)-1], strings.Join(c, " -> "))
			}
			for _, imp := range testImports {
				if imp != p.ImportPath && bad(imp) {
					t.Errorf("%s %s, but its tests import %s", p.ImportPath, what, imp)
				}
			}
		}
		switch {
		case p.ImportPath == gateway+"/audit":
			checked["gateway/audit"] = true
			rule("must not import the agent", func(imp string) bool { return under(imp, agent) })
			rule("may import from the gateway only gateway/internal/jskv (the gateway wires the rest in)", func(imp string) bool {
				return under(imp, gateway) && imp != p.ImportPath && imp != gateway+"/internal/jskv"
			})
		case under(p.ImportPath, gateway):
			checked["gateway"] = true
			rule("must not import the agent", func(imp string) bool { return under(imp, agent) })
		case slices.Contains(agentLeaves, p.ImportPath):
			checked[p.ImportPath] = true
			rule(leafRule, func(imp string) bool { return leafImportBad(p.ImportPath, imp) })
		case under(p.ImportPath, agent):
			checked["agent"] = true
			rule("must not import the gateway", func(imp string) bool { return under(imp, gateway) })
		case p.ImportPath == protocol:
			checked["protocol"] = true
			rule("must import only the standard library", func(imp string) bool {
				q := g[imp]
				if q == nil {
					// A test-only import go list did not resolve: judge
					// by its path (standard library paths have no dot in
					// their first element).
					first, _, _ := strings.Cut(imp, "/")
					return strings.Contains(first, ".")
				}
				return !q.Standard
			})
		case p.ImportPath == module+"/cmd/fleetctl":
			checked["fleetctl"] = true
			rule("may import only protocol, the version and profile packages and the standard library (it speaks the admin API's wire contract, nothing more)", func(imp string) bool {
				if imp == protocol || imp == p.ImportPath || imp == module+"/cmd/internal/version" || imp == module+"/cmd/internal/profile" {
					return false
				}
				if q := g[imp]; q != nil {
					return !q.Standard
				}
				first, _, _ := strings.Cut(imp, "/")
				return strings.Contains(first, ".")
			})
		case p.ImportPath == protocol+"/skillmd":
			checked["skillmd"] = true
			rule("may import only protocol, the YAML parser and the standard library (it is a format both sides share)", func(imp string) bool {
				if imp == protocol || imp == p.ImportPath || imp == "go.yaml.in/yaml/v3" || strings.HasPrefix(imp, "go.yaml.in/yaml/v3/") {
					return false
				}
				if q := g[imp]; q != nil {
					return !q.Standard
				}
				first, _, _ := strings.Cut(imp, "/")
				return strings.Contains(first, ".")
			})
		case under(p.ImportPath, policy):
			checked["policy"] = true
			rule("may import only protocol from this module", func(imp string) bool {
				return inModule(imp) && imp != protocol && !under(imp, policy)
			})
		}
	}
	for _, name := range append([]string{"gateway", "gateway/audit", "agent", "protocol", "skillmd", "fleetctl"}, agentLeaves...) {
		if !checked[name] {
			t.Errorf("package %s was not found, so its import rule was not checked", name)
		}
	}
	if fileExists(filepath.Join(moduleRoot(t), "policy")) && !checked["policy"] {
		t.Errorf("./policy exists but go list reported no package there, so its import rule was not checked")
	}
}

// TestDepsTopLevel: the top level of the module is fixed; everything
// else lives under one of these folders.
func TestDepsTopLevel(t *testing.T) {
	fixed := []string{"agent", "cmd", "deploy", "gateway", "integration", "policy", "protocol"}
	entries, err := os.ReadDir(moduleRoot(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.IsDir() && !strings.HasPrefix(e.Name(), ".") && !slices.Contains(fixed, e.Name()) {
			t.Errorf("top-level folder %s: the top level is fixed (%s); put it under one of them", e.Name(), strings.Join(fixed, ", "))
		}
	}
}

// TestDepsPackageNames: names that say nothing about what a package is
// for are banned.
func TestDepsPackageNames(t *testing.T) {
	banned := []string{"util", "common", "helpers", "types", "models"}
	g := goList(t, runtime.GOOS, "./...")
	for _, p := range g.modulePackages() {
		name := strings.TrimSuffix(p.Name, "_test")
		if slices.Contains(banned, name) {
			t.Errorf("package %s is named %s: name it for what it provides", p.ImportPath, p.Name)
		}
		if dir := filepath.Base(p.ImportPath); dir != name && slices.Contains(banned, dir) {
			t.Errorf("package %s lives in a directory named %s: name it for what it provides", p.ImportPath, dir)
		}
	}
}
