#!/usr/bin/env bash
# Builds a fleetmcp release into dist/ (or $FLEET_DIST):
#   - static binaries (CGO_ENABLED=0, -trimpath) of every command for
#     linux amd64/arm64, darwin amd64/arm64 and windows amd64/arm64,
#     named NAME-VERSION-OS-ARCH[.exe];
#   - .deb and .rpm packages of fleet-gateway and fleet-agent (and
#     fleetctl) for linux amd64/arm64, made by nfpm;
#   - SHA256SUMS of all of them.
#
# usage: deploy/release/release.sh [VERSION]
#   VERSION (a leading v is dropped: packages want 1.2.0) defaults to one
#   made from `git describe --tags --dirty`, or 0.0.0+git.HASH untagged. The commit and build date stamped into
#   the binaries (--version) are HEAD's, so two builds of one commit are
#   the same bytes.
# Environment, for CI and partial builds:
#   FLEET_TARGETS    "os/arch ..." to build (default: all of the above)
#   FLEET_PACKAGES   "deb rpm" formats to make, "" for none
#   FLEET_PKG_ARCHS  "amd64 arm64" linux architectures to package
#   FLEET_DIST       output directory (emptied first)
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH="/usr/local/go/bin:$PATH"

# nfpm, pinned: run from the module proxy, no install needed.
NFPM="go run github.com/goreleaser/nfpm/v2/cmd/nfpm@v2.45.2"
# Every command of the release (one missing from the tree is skipped,
# with a note).
COMMANDS="fleet-gateway fleet-agent fleetctl"
TARGETS="${FLEET_TARGETS-linux/amd64 linux/arm64 darwin/amd64 darwin/arm64 windows/amd64 windows/arm64}"
PACKAGES="${FLEET_PACKAGES-deb rpm}"
PKG_ARCHS="${FLEET_PKG_ARCHS-amd64 arm64}"
DIST="${FLEET_DIST:-dist}"

if [ $# -gt 0 ]; then
	version="${1#v}"
	# Debian and RPM both accept these; a pre-release is 1.3.0~rc1.
	if ! [[ "$version" =~ ^[0-9][0-9A-Za-z.+~]*$ ]]; then
		echo "release: version \"$1\": want digits, letters, '.', '+' or '~' (e.g. 1.2.0, 1.3.0~rc1)" >&2
		exit 2
	fi
elif described="$(git describe --tags --match 'v[0-9]*' --dirty 2>/dev/null)"; then
	# v1.2.0-3-gabc1234-dirty: 1.2.0+3.gabc1234.dirty
	version="${described#v}"
	if [[ "$version" == *-* ]]; then
		rest="${version#*-}"
		version="${version%%-*}+${rest//-/.}"
	fi
else
	version="0.0.0+git.$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
fi
commit="$(git rev-parse HEAD 2>/dev/null || echo unknown)"
if [ "$commit" != unknown ] && [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then
	commit="$commit-modified"
fi
date="$(git log -1 --format=%cI 2>/dev/null || date -u +%Y-%m-%dT%H:%M:%SZ)"
pkg=github.com/fleetmcp/fleetmcp/cmd/internal/version
ldflags="-s -w -X $pkg.version=$version -X $pkg.commit=$commit -X $pkg.date=$date"

commands=""
for c in $COMMANDS; do
	if [ -d "cmd/$c" ]; then
		commands="$commands $c"
	else
		echo "release: skipping $c: cmd/$c does not exist in this tree"
	fi
done

rm -rf "$DIST"
mkdir -p "$DIST"

for target in $TARGETS; do
	goos="${target%/*}" goarch="${target#*/}"
	ext=""
	[ "$goos" = windows ] && ext=.exe
	for c in $commands; do
		out="$DIST/$c-$version-$goos-$goarch$ext"
		CGO_ENABLED=0 GOOS="$goos" GOARCH="$goarch" \
			go build -trimpath -buildvcs=false -ldflags "$ldflags" -o "$out" "./cmd/$c"
		echo "release: built $out"
	done
done

for arch in $PKG_ARCHS; do
	for format in $PACKAGES; do
		for c in $commands; do
			config="deploy/release/nfpm-${c#fleet-}.yaml"
			if [ ! -f "$DIST/$c-$version-linux-$arch" ]; then
				echo "release: no linux/$arch build of $c to package: add linux/$arch to FLEET_TARGETS" >&2
				exit 1
			fi
			sed -e "s|@ARCH@|$arch|" -e "s|@VERSION@|$version|" \
				-e "s|@BINARY@|$DIST/$c-$version-linux-$arch|" "$config" >"$DIST/.nfpm.yaml"
			# nfpm names architectures as Go does and maps them per format.
			if ! log="$($NFPM package --config "$DIST/.nfpm.yaml" --packager "$format" --target "$DIST/" 2>&1)"; then
				echo "release: nfpm failed on $config ($format, linux/$arch):" >&2
				echo "$log" >&2
				exit 1
			fi
			rm "$DIST/.nfpm.yaml"
			echo "release: packaged $c ($format, linux/$arch)"
		done
	done
done

(cd "$DIST" && find . -maxdepth 1 -type f ! -name SHA256SUMS -printf '%f\n' | LC_ALL=C sort |
	xargs sha256sum >SHA256SUMS)
echo "release: $version ($commit) in $DIST:"
ls -l "$DIST"
