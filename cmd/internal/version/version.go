// Package version tells which build of a fleetmcp binary is running, for
// every binary's --version: a bug report or an upgrade starts from it.
// Release builds set the version (and may set the commit and the date)
// with -ldflags -X; any other build reports what the Go toolchain stamped
// into it (the module version of `go install ...@v1.2.3`, the VCS revision
// and time of a build in a git checkout).
package version

import (
	"cmp"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
)

// Set by release builds, e.g.
//
//	-ldflags "-X github.com/fleetmcp/fleetmcp/cmd/internal/version.version=1.2.0
//	          -X github.com/fleetmcp/fleetmcp/cmd/internal/version.commit=$(git rev-parse HEAD)
//	          -X github.com/fleetmcp/fleetmcp/cmd/internal/version.date=2026-12-01T18:00:00Z"
//
// An empty one falls back to the build information.
var version, commit, date string

// Base is the version the source tree is at. A build that is neither a
// release (-ldflags) nor a go install of a tagged module reports
// Base-dev, and its MCP server and agents the same.
const Base = "0.1.0"

// devel is what the Go toolchain stamps into a build from a working tree.
const devel = "(devel)"

// Info is what --version prints.
type Info struct {
	Version   string // release version, module version, or Base-dev
	Commit    string // VCS revision, or "unknown"
	Modified  bool   // built from a working tree with uncommitted changes
	Date      string // commit time (RFC 3339) or the release build's date, or "unknown"
	GoVersion string // toolchain the binary was built with
	Platform  string // GOOS/GOARCH
}

// Release returns the build's version when it has one (a release, or a
// module version from go install), and ok false for a development build
// (whose version is Base-dev).
func Release() (v string, ok bool) {
	v = Get().Version
	return v, v != Base+"-dev"
}

// Get returns the running binary's Info.
func Get() Info {
	bi, _ := debug.ReadBuildInfo()
	return fromBuildInfo(bi, version, commit, date)
}

// fromBuildInfo merges the -ldflags values (which win) with the build
// information bi (nil when the binary has none).
func fromBuildInfo(bi *debug.BuildInfo, ldVersion, ldCommit, ldDate string) Info {
	in := Info{GoVersion: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	var vcsRev, vcsTime, modVersion string
	if bi != nil {
		in.GoVersion = cmp.Or(bi.GoVersion, in.GoVersion)
		modVersion = bi.Main.Version
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				vcsRev = s.Value
			case "vcs.time":
				vcsTime = s.Value
			case "vcs.modified":
				in.Modified = s.Value == "true"
			}
		}
	}
	if modVersion == "" || modVersion == devel {
		modVersion = Base + "-dev"
	}
	in.Version = cmp.Or(ldVersion, modVersion)
	in.Commit = cmp.Or(ldCommit, vcsRev, "unknown")
	in.Date = cmp.Or(ldDate, vcsTime, "unknown")
	if ldCommit != "" && ldCommit != vcsRev {
		// The release build named its commit; the tree's state is the
		// build information's only when it describes the same commit.
		in.Modified = false
	}
	return in
}

// Print writes --version's output for the binary called name.
func Print(w io.Writer, name string) {
	in := Get()
	mod := ""
	if in.Modified {
		mod = " (modified)"
	}
	fmt.Fprintf(w, "%s %s\n  commit:  %s%s\n  built:   %s\n  go:      %s %s\n",
		name, in.Version, in.Commit, mod, in.Date, in.GoVersion, in.Platform)
}
