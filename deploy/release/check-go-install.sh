#!/usr/bin/env bash
# Checks that `go install github.com/fleetmcp/fleetmcp/cmd/...@latest`
# works for the committed tree as it would from the module proxy: the
# module zip made from HEAD is served by a file:// proxy in front of the
# real one (which serves the dependencies), installed outside any
# checkout, and the binaries report the module version. .ci/run runs it.
# What it cannot check is the module's own fetch from the public proxy
# and its checksum database entry: that needs the module published (the
# repository public at its module path, a v* tag the proxy has seen).
# It builds with CGO_ENABLED=0, as the release does, so that the
# dependencies come from the build cache release.sh filled.
# usage: deploy/release/check-go-install.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH="/usr/local/go/bin:$PATH"
mod="$(go list -m)"
[ "$mod" = github.com/fleetmcp/fleetmcp ] || { echo "check: module path is $mod" >&2; exit 1; }
if grep -q '^replace\|^[[:space:]]*replace ' go.mod; then
	echo "check: go.mod has a replace directive: go install ...@latest ignores it and fails" >&2
	exit 1
fi
# A version of its own per tree: the module cache never changes what it
# holds for a version, so a fixed one would install a tree checked before.
v="v0.0.1-installcheck.t$(git rev-parse --short=12 'HEAD^{tree}')"
work="$(mktemp -d)"
modcache="$(go env GOMODCACHE)"
cleanup() {
	rm -rf "$work"
	chmod -R u+w "$modcache/$mod@$v" 2>/dev/null || true
	rm -rf "$modcache/$mod@$v" "$modcache/cache/download/$mod"
	rmdir "$modcache/${mod%/*}" "$modcache/cache/download/${mod%/*}" 2>/dev/null || true
}
trap cleanup EXIT
mkdir -p "$work/proxy/$mod/@v" "$work/bin" "$work/outside"
git archive --format=zip --prefix="$mod@$v/" -o "$work/proxy/$mod/@v/$v.zip" HEAD
cp go.mod "$work/proxy/$mod/@v/$v.mod"
echo "$v" >"$work/proxy/$mod/@v/list"
printf '{"Version":"%s","Time":"%s"}\n' "$v" "$(git log -1 --format=%cI)" >"$work/proxy/$mod/@v/$v.info"
(cd "$work/outside" && CGO_ENABLED=0 GOBIN="$work/bin" GOPROXY="file://$work/proxy,$(go env GOPROXY)" GONOSUMDB="$mod" \
	GOFLAGS=-trimpath go install "$mod/cmd/...@latest")
for c in cmd/*/; do
	c="$(basename "$c")"
	[ "$c" = internal ] && continue
	"$work/bin/$c" --version | grep -qx "$c $v" || { echo "check: $c --version: $("$work/bin/$c" --version)" >&2; exit 1; }
done
echo "check: go install $mod/cmd/...@latest installs $(ls "$work/bin" | tr '\n' ' ')at $v"
