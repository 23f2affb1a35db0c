package integration

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
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

// depRules are the module's import rules, one a line. Each holds for the
// module's packages matching pkgs (but not except): they must not depend
// on a package matching forbid, unless it matches allow. The depending is
// transitive (a chain of imports through any package) unless direct is
// set, and covers what a package's tests import directly unless binary is
// set (a rule about what a binary links). allOS rules are checked for
// every system agents run on, since build tags change imports; the others
// for the system the tests run on.
//
// Patterns are separated by spaces: "gateway" is that package alone,
// "gateway/..." it and its subpackages (both relative to the module
// unless the first element has a dot: "github.com/nats-io/nats-server/v2/..."),
// "module" any package of the module, "std" any of the standard library,
// "*" any package at all. The three forms:
//
//	X must not import Y:      {pkgs: "X/...", forbid: "Y/...", why: ...}
//	X may import only std, Y: {pkgs: "X", forbid: "*", allow: "std Y", why: ...}
//	only X may import Y:      {pkgs: "module", except: "X integration/...", forbid: "Y/...", direct: true, why: ...}
var depRules = []depRule{
	{pkgs: "gateway/...", forbid: "agent/...", why: "the gateway and the agent never import each other"},
	{pkgs: "agent/...", forbid: "gateway/...", why: "the gateway and the agent never import each other"},
	{pkgs: "protocol", forbid: "*", allow: "std", why: "it is the wire contract both sides share"},
	{pkgs: "protocol/skillmd", forbid: "*", allow: "std protocol go.yaml.in/yaml/v3/...", why: "it is a format both sides share"},
	{pkgs: "policy/...", forbid: "module", allow: "protocol policy/...", why: "policy is pure decisions over what it is given"},
	{pkgs: "gateway/access/...", forbid: "gateway/...", why: "caller access is decided apart from the gateway that applies it"},
	{pkgs: "gateway/skills/...", forbid: "gateway gateway/access/...", why: "skill rollout reaches the fleet and the signing key through small interfaces"},
	{pkgs: "gateway/audit/...", forbid: "gateway/...", allow: "gateway/internal/...", why: "the audit trail reaches the rest of the gateway through what the gateway wires in"},
	{pkgs: "gateway/enrol/...", forbid: "gateway/...", allow: "gateway/internal/...", why: "enrolment reaches credentials, revocations and the audit trail through what the gateway wires in"},
	{pkgs: "gateway/natsauth/...", forbid: "gateway/...", allow: "gateway/internal/...", why: "the NATS authority reaches the agent records and the audit trail through what the gateway wires in"},
	{pkgs: "gateway/...", except: "gateway/natsauth/...", forbid: "github.com/nats-io/nats-server/v2/...", direct: true, binary: true, why: "the NATS server is the NATS authority's concern (tests may start one)"},
	{pkgs: "gateway/signing/...", forbid: "gateway/...", allow: "gateway/internal/...", why: "the signing keys reach the fleet through what the gateway wires in"},
	{pkgs: "gateway/internal/fsutil gateway/internal/gwtest gateway/internal/loglimit gateway/internal/netutil gateway/internal/seal gateway/internal/textutil", forbid: "module", allow: "protocol", why: "the shared helpers know no gateway concern"},
	{pkgs: "module", except: "gateway/internal/gwtest", forbid: "gateway/internal/gwtest", binary: true, why: "it holds what tests share, for tests only"},
	{pkgs: "gateway/internal/jskv", forbid: "module", allow: "protocol integration/natstest", why: "the key-value helpers know no gateway concern"},
	{pkgs: "cmd/fleetctl", forbid: "*", allow: "std protocol cmd/internal/version cmd/internal/profile", why: "it speaks the admin API's wire contract, nothing more"},
	{pkgs: "agent/callauth agent/statelock agent/tasks agent/unidiff", forbid: "module", allow: "protocol policy/... agent/safefs agent/winjob", allOS: true, why: "it is a leaf the agent's tools build on"},
	{pkgs: "agent/safefs agent/winjob", forbid: "module", allow: "protocol policy/...", allOS: true, why: "it is a base the agent's leaves build on"},
	{pkgs: "cmd/fleet-agent", forbid: "github.com/nats-io/nats-server/v2/... github.com/modelcontextprotocol/go-sdk/... github.com/coreos/go-oidc/v3/... google.golang.org/grpc/... go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp/... go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc/... gateway/...", binary: true, allOS: true,
		why: "the agent stays a small binary: gRPC, which the OTLP exporters would bring, nearly doubles it; its spans go out through the small OTLP/HTTP client of cmd/internal/tracing"},
}

// depRule is one import rule; see depRules.
type depRule struct {
	pkgs, except, forbid, allow string
	direct, binary, allOS       bool
	why                         string
}

// depPattern reports whether path matches the pattern pat (see
// depRules); g tells standard library packages apart.
func depPattern(g pkgGraph, pat, path string) bool {
	switch pat {
	case "*":
		return true
	case "module":
		return inModule(path)
	case "std":
		if p := g[path]; p != nil {
			return p.Standard
		}
		// A test-only import go list did not resolve: judge by its path
		// (standard library paths have no dot in their first element).
		first, _, _ := strings.Cut(path, "/")
		return !strings.Contains(first, ".")
	}
	tree := strings.HasSuffix(pat, "/...")
	pat = strings.TrimSuffix(pat, "/...")
	if first, _, _ := strings.Cut(pat, "/"); !strings.Contains(first, ".") {
		pat = module + "/" + pat
	}
	if tree {
		return under(path, pat)
	}
	return path == pat
}

func depAny(g pkgGraph, pats, path string) bool {
	for _, pat := range strings.Fields(pats) {
		if depPattern(g, pat, path) {
			return true
		}
	}
	return false
}

// holds reports whether the rule holds for the package path.
func (r depRule) holds(g pkgGraph, path string) bool {
	return inModule(path) && depAny(g, r.pkgs, path) && !depAny(g, r.except, path)
}

// bad reports whether the rule forbids imp to the package path.
func (r depRule) bad(g pkgGraph, path, imp string) bool {
	return imp != path && depAny(g, r.forbid, imp) && !depAny(g, r.allow, imp)
}

// String says what the rule asks, for messages.
func (r depRule) String() string {
	what := "must not import " + strings.Join(strings.Fields(r.forbid), ", ")
	if r.allow != "" {
		what = "may import only " + strings.Join(strings.Fields(r.allow), ", ")
		if r.forbid != "*" {
			what += " from " + strings.Join(strings.Fields(r.forbid), ", ")
		}
	}
	if r.except != "" {
		what += " (only " + strings.Join(strings.Fields(r.except), ", ") + " may)"
	}
	return what + ": " + r.why
}

// check returns the violations of rule r in g, and whether r holds for
// any package of g (a rule for no package is a rule not checked).
func (r depRule) check(g pkgGraph, goos string) (problems []string, matched bool) {
	for _, p := range g.modulePackages() {
		if !r.holds(g, p.ImportPath) {
			continue
		}
		matched = true
		bad := func(imp string) bool { return r.bad(g, p.ImportPath, imp) }
		if r.direct {
			for _, imp := range p.Imports {
				if bad(imp) {
					problems = append(problems, fmt.Sprintf("GOOS=%s: %s %s, but imports %s", goos, p.ImportPath, r, imp))
				}
			}
		} else if c := g.chain(p.ImportPath, bad); c != nil {
			problems = append(problems, fmt.Sprintf("GOOS=%s: %s %s, but imports %s: %s", goos, p.ImportPath, r, c[len(c)-1], strings.Join(c, " -> ")))
		}
		if r.binary {
			continue
		}
		// Test files are held to the same rules: they are compiled into
		// the package and show what it is allowed to know about.
		for _, imp := range slices.Concat(p.TestImports, p.XTestImports) {
			if bad(imp) {
				problems = append(problems, fmt.Sprintf("GOOS=%s: %s %s, but its tests import %s", goos, p.ImportPath, r, imp))
			}
		}
	}
	return problems, matched
}

// checkDeps checks rules against g and returns every violation, and a
// problem for each rule that held for no package.
func checkDeps(g pkgGraph, goos string, rules []depRule) []string {
	var problems []string
	for _, r := range rules {
		p, matched := r.check(g, goos)
		problems = append(problems, p...)
		if !matched {
			problems = append(problems, fmt.Sprintf("GOOS=%s: no package matches %q, so the rule that it %s was not checked", goos, r.pkgs, r))
		}
	}
	return problems
}

// listPatterns are the go list arguments naming the packages a rule
// holds for.
func (r depRule) listPatterns() []string {
	var out []string
	for _, pat := range strings.Fields(r.pkgs) {
		switch pat {
		case "*", "module", "std":
			out = append(out, "./...")
		default:
			out = append(out, "./"+pat)
		}
	}
	return out
}

// TestDepsModuleRules checks every rule of depRules on the module's
// packages, and the allOS rules again for each other system agents run
// on.
func TestDepsModuleRules(t *testing.T) {
	g := goList(t, runtime.GOOS, "./...")
	if len(g.modulePackages()) == 0 {
		t.Fatal("go list reported no packages of the module")
	}
	for _, problem := range checkDeps(g, runtime.GOOS, depRules) {
		t.Error(problem)
	}
	var rules []depRule
	var patterns []string
	for _, r := range depRules {
		if r.allOS {
			rules = append(rules, r)
			patterns = append(patterns, r.listPatterns()...)
		}
	}
	slices.Sort(patterns)
	for _, goos := range targetOSes()[1:] {
		for _, problem := range checkDeps(goList(t, goos, slices.Compact(patterns)...), goos, rules) {
			t.Error(problem)
		}
	}
}

// TestDepsRulesCatch plants violations of each form of rule in a made-up
// package graph and checks that each is reported, and nothing else.
func TestDepsRulesCatch(t *testing.T) {
	m := func(p string) string { return module + "/" + p }
	nats := "github.com/nats-io/nats-server/v2/server"
	pkg := func(path string, std bool, imports ...string) *goPackage {
		return &goPackage{ImportPath: path, Standard: std, Imports: imports}
	}
	g := pkgGraph{}
	for _, p := range []*goPackage{
		pkg("fmt", true), pkg("os", true),
		pkg(nats, false, "fmt"),
		pkg("github.com/other/lib", false, "fmt"),
		pkg(m("wire"), false, "fmt"),
		pkg(m("wire/sub"), false, "fmt", "github.com/other/lib"),
		pkg(m("core"), false, m("wire"), m("core/keys")),
		pkg(m("core/keys"), false, nats),
		pkg(m("core/access"), false, m("core/helper")),
		pkg(m("core/helper"), false, m("core")), // core/access -> core, through a helper
		pkg(m("edge"), false, m("wire"), nats),
		pkg(m("cli"), false, m("wire"), "os"),
	} {
		g[p.ImportPath] = p
	}
	g[m("cli")].TestImports = []string{m("core")}

	for _, tc := range []struct {
		name string
		rule depRule
		want []string // substrings, one a violation; none: the graph keeps the rule
	}{
		{"must not, kept", depRule{pkgs: "wire/...", forbid: "core/...", why: "w"}, nil},
		{"must not, through a chain", depRule{pkgs: "core/access", forbid: "core", why: "w"},
			[]string{"core/access must not import core: w, but imports " + m("core") + ": " + m("core/access") + " -> " + m("core/helper") + " -> " + m("core")}},
		{"may only, kept", depRule{pkgs: "wire", forbid: "*", allow: "std", why: "w"}, nil},
		{"may only, broken", depRule{pkgs: "wire/...", forbid: "*", allow: "std", why: "w"},
			[]string{"wire/sub may import only std: w, but imports github.com/other/lib"}},
		{"may only from the module", depRule{pkgs: "cli", forbid: "module", allow: "wire", why: "w"},
			[]string{"cli may import only wire from module: w, but its tests import " + m("core")}},
		{"tests not held for a binary", depRule{pkgs: "cli", forbid: "module", allow: "wire", binary: true, why: "w"}, nil},
		{"only X may import Y", depRule{pkgs: "module", except: "core/keys", forbid: "github.com/nats-io/nats-server/v2/...", direct: true, why: "w"},
			[]string{m("edge") + " must not import github.com/nats-io/nats-server/v2/... (only core/keys may): w, but imports " + nats}},
		{"transitive Y", depRule{pkgs: "core", forbid: "github.com/nats-io/nats-server/v2/...", why: "w"},
			[]string{m("core") + " -> " + m("core/keys") + " -> " + nats}},
		{"a rule for no package", depRule{pkgs: "gone/...", forbid: "*", why: "w"}, []string{`no package matches "gone/..."`}},
	} {
		got := checkDeps(g, "plan9", []depRule{tc.rule})
		if len(got) != len(tc.want) {
			t.Errorf("%s: %d problems, want %d:\n%s", tc.name, len(got), len(tc.want), strings.Join(got, "\n"))
			continue
		}
		for i := range got {
			if !strings.Contains(got[i], tc.want[i]) {
				t.Errorf("%s: %q\nwant it to say %q", tc.name, got[i], tc.want[i])
			}
		}
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
