package version

import (
	"go/build"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
)

func TestFromBuildInfoVCS(t *testing.T) {
	bi := &debug.BuildInfo{
		GoVersion: "go1.26.8",
		Main:      debug.Module{Path: "github.com/fleetmcp/fleetmcp", Version: "(devel)"},
		Settings: []debug.BuildSetting{
			{Key: "vcs", Value: "git"},
			{Key: "vcs.revision", Value: "0123456789abcdef0123456789abcdef01234567"},
			{Key: "vcs.time", Value: "2026-11-30T10:00:00Z"},
			{Key: "vcs.modified", Value: "true"},
		},
	}
	got := fromBuildInfo(bi, "", "", "")
	want := Info{Version: Base + "-dev", Commit: "0123456789abcdef0123456789abcdef01234567", Modified: true,
		Date: "2026-11-30T10:00:00Z", GoVersion: "go1.26.8", Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if got != want {
		t.Errorf("got %+v\nwant %+v", got, want)
	}
}

func TestFromBuildInfoModuleVersion(t *testing.T) {
	// What `go install github.com/fleetmcp/fleetmcp/cmd/...@v1.4.0` stamps:
	// the module version, no VCS settings.
	bi := &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "github.com/fleetmcp/fleetmcp", Version: "v1.4.0"}}
	got := fromBuildInfo(bi, "", "", "")
	if got.Version != "v1.4.0" || got.Commit != "unknown" || got.Date != "unknown" || got.Modified {
		t.Errorf("got %+v", got)
	}
}

func TestFromBuildInfoLdflagsWin(t *testing.T) {
	bi := &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"},
		Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "aaaa"}, {Key: "vcs.time", Value: "2020-01-01T00:00:00Z"}, {Key: "vcs.modified", Value: "true"}}}
	got := fromBuildInfo(bi, "1.2.0", "bbbb", "2026-12-01T18:00:00Z")
	if got.Version != "1.2.0" || got.Commit != "bbbb" || got.Date != "2026-12-01T18:00:00Z" || got.Modified {
		t.Errorf("got %+v", got)
	}
	// The same commit as the tree's keeps the tree's modified state.
	if got := fromBuildInfo(bi, "1.2.0", "aaaa", ""); !got.Modified || got.Date != "2020-01-01T00:00:00Z" {
		t.Errorf("same commit: got %+v", got)
	}
	if got := fromBuildInfo(nil, "", "", ""); got.Version != Base+"-dev" || got.GoVersion != runtime.Version() {
		t.Errorf("no build info: got %+v", got)
	}
}

// TestBinariesPrintVersion builds every binary the way a release does and
// runs its --version.
func TestBinariesPrintVersion(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binaries")
	}
	goBin := filepath.Join(build.Default.GOROOT, "bin", "go")
	const pkg = "github.com/fleetmcp/fleetmcp/cmd/internal/version"
	ldflags := "-X " + pkg + ".version=9.8.7-test -X " + pkg + ".commit=feedfacefeedfacefeedfacefeedfacefeedface -X " + pkg + ".date=2026-12-01T18:00:00Z"
	for _, name := range []string{"fleet-gateway", "fleet-agent", "fleetctl"} {
		t.Run(name, func(t *testing.T) {
			if _, err := os.Stat("../../" + name); err != nil {
				t.Skipf("no cmd/%s in this tree", name)
			}
			exe := filepath.Join(t.TempDir(), name)
			build := exec.Command(goBin, "build", "-trimpath", "-ldflags", ldflags, "-o", exe, "../../"+name)
			build.Env = append(build.Environ(), "CGO_ENABLED=0")
			if out, err := build.CombinedOutput(); err != nil {
				t.Fatalf("go build: %v\n%s", err, out)
			}
			out, err := exec.Command(exe, "--version").Output()
			if err != nil {
				t.Fatalf("%s --version: %v", name, err)
			}
			want := name + " 9.8.7-test\n" +
				"  commit:  feedfacefeedfacefeedfacefeedfacefeedface\n" +
				"  built:   2026-12-01T18:00:00Z\n" +
				"  go:      " + runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH + "\n"
			if string(out) != want {
				t.Errorf("%s --version printed\n%s\nwant\n%s", name, out, want)
			}
			// Without -ldflags the build information speaks: a local build
			// says it is not a release (or, from a tagged checkout, the
			// toolchain's version of it).
			plain := filepath.Join(t.TempDir(), name)
			if out, err := exec.Command(goBin, "build", "-o", plain, "../../"+name).CombinedOutput(); err != nil {
				t.Fatalf("go build: %v\n%s", err, out)
			}
			out, err = exec.Command(plain, "--version").Output()
			if err != nil || !strings.HasPrefix(string(out), name+" "+Base+"-dev\n") && !strings.HasPrefix(string(out), name+" v") {
				t.Errorf("%s --version without ldflags: %v\n%s", name, err, out)
			}
		})
	}
}
