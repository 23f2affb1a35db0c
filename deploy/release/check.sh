#!/usr/bin/env bash
# Checks what a release is made of, quickly enough for every CI run:
#   1. release.sh cross-compiles every release target, and every linux
#      binary is static (no ELF interpreter), the others are Mach-O / PE;
#   2. the .deb packages build, and (as root with dpkg, on a machine
#      where fleetmcp is not installed already) install: users,
#      directories, units that systemd-analyze verifies, no unit enabled
#      or started, --version; an upgrade keeps the edited configuration
#      and the gateway's data; purge removes the packages. The machine
#      is left as it was found.
#   3. in between, the installed services make a fleet as their units
#      run them (check-join.sh): fleetctl's join command enrols the
#      agent, which comes online; fleet-agent doctor and fleetctl doctor
#      pass; both stop on SIGTERM.
# usage: deploy/release/check.sh   (FLEET_CHECK_KEEP=1 keeps the output)
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH="/usr/local/go/bin:$PATH"
work="$(mktemp -d)"
cleanup() {
	if [ -z "${FLEET_CHECK_KEEP:-}" ]; then rm -rf "$work"; else echo "check: output kept in $work"; fi
}
trap cleanup EXIT
fail() {
	echo "check: FAIL: $*" >&2
	exit 1
}

if ! command -v file >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
	# A fresh machine may have no package lists yet.
	apt-get install -y --no-install-recommends file >/dev/null 2>&1 ||
		{ apt-get update -qq >/dev/null 2>&1 && apt-get install -y --no-install-recommends file >/dev/null 2>&1; } || true
fi
command -v file >/dev/null || fail "file(1) is needed to check the binaries: install it"

# 1. Every target, no packages: static binaries.
FLEET_PACKAGES="" FLEET_DIST="$work/all" deploy/release/release.sh 1.0.0 >"$work/release.log" ||
	{ cat "$work/release.log"; fail "release.sh"; }
grep 'skipping' "$work/release.log" || true
n=0
for f in "$work"/all/*-1.0.0-*; do
	desc="$(file -b "$f")"
	case "$f" in
	*-linux-*)
		[[ "$desc" == ELF*"statically linked"* ]] || fail "$(basename "$f") is not a static ELF: $desc"
		if command -v readelf >/dev/null && readelf -lW "$f" | grep -q INTERP; then
			fail "$(basename "$f") asks for a dynamic loader"
		fi
		;;
	*-darwin-*) [[ "$desc" == Mach-O* ]] || fail "$(basename "$f"): $desc" ;;
	*-windows-*) [[ "$desc" == PE32+* ]] || fail "$(basename "$f"): $desc" ;;
	esac
	n=$((n + 1))
done
[ "$n" -ge 10 ] || fail "only $n binaries built, want 2 commands x 5 targets at least"
(cd "$work/all" && sha256sum --quiet -c SHA256SUMS) || fail "SHA256SUMS does not match"
native="$work/all/fleet-gateway-1.0.0-$(go env GOOS)-$(go env GOARCH)"
"$native" --version | grep -qx "fleet-gateway 1.0.0" || fail "$native --version: $("$native" --version)"
echo "check: $n binaries for every target, linux ones static, SHA256SUMS right"

# 2. The .deb packages, at two versions for the upgrade.
arch="$(go env GOARCH)"
for v in 1.0.0 1.0.1; do
	FLEET_TARGETS="linux/$arch" FLEET_PACKAGES=deb FLEET_PKG_ARCHS="$arch" FLEET_DIST="$work/$v" \
		deploy/release/release.sh "$v" >"$work/release-$v.log" || { cat "$work/release-$v.log"; fail "release.sh $v"; }
done
for p in fleet-gateway fleet-agent; do
	deb="$(echo "$work/1.0.0/${p}_1.0.0-1_$arch.deb")"
	[ -f "$deb" ] || fail "no $deb"
	dpkg-deb -f "$deb" Package | grep -qx "$p" || fail "$deb is not package $p"
done
echo "check: .deb packages of fleet-gateway and fleet-agent built"

if [ "$(id -u)" != 0 ] || ! command -v dpkg >/dev/null; then
	echo "check: not root on a dpkg system: package installation not tried"
	exit 0
fi
for p in fleet-gateway fleet-agent fleetctl; do
	if dpkg -s "$p" >/dev/null 2>&1; then
		echo "check: $p is installed on this machine: package installation not tried"
		exit 0
	fi
done
# What the packages make and purge leaves (users, state): removed after
# the check when it was not there before.
created=()
for u in fleetmcp fleetmcp-agent; do getent passwd "$u" >/dev/null || created+=("$u"); done
leftovers=()
for d in /var/lib/fleetmcp /var/log/fleetmcp /var/lib/fleetmcp-agent /var/lib/fleetmcp-agent-home /etc/fleetmcp; do
	[ -e "$d" ] || leftovers+=("$d")
done
restore() {
	dpkg --purge fleet-gateway fleet-agent fleetctl >/dev/null 2>&1 || true
	for u in "${created[@]}"; do userdel "$u" >/dev/null 2>&1 || true; done
	for u in "${created[@]}"; do groupdel "$u" >/dev/null 2>&1 || true; done
	for d in "${leftovers[@]}"; do rm -rf "$d"; done
	cleanup
}
trap restore EXIT

debs=("$work/1.0.0/fleet-gateway_1.0.0-1_$arch.deb" "$work/1.0.0/fleet-agent_1.0.0-1_$arch.deb")
fleetctl="$work/1.0.0/fleetctl_1.0.0-1_$arch.deb"
[ -f "$fleetctl" ] && debs+=("$fleetctl")
dpkg -i "${debs[@]}" >"$work/dpkg.log" 2>&1 || { cat "$work/dpkg.log"; fail "dpkg -i"; }
if [ -f "$fleetctl" ]; then
	/usr/bin/fleetctl --version | grep -qx "fleetctl 1.0.0" ||
		fail "installed fleetctl --version must print \"fleetctl 1.0.0\" first (cmd/internal/version.Print)"
fi
/usr/bin/fleet-gateway --version | grep -qx "fleet-gateway 1.0.0" || fail "installed fleet-gateway --version: $(/usr/bin/fleet-gateway --version)"
/usr/bin/fleet-agent --version | grep -qx "fleet-agent 1.0.0" || fail "installed fleet-agent --version"
for want in "fleetmcp /var/lib/fleetmcp 700" "fleetmcp /var/log/fleetmcp 750" \
	"fleetmcp-agent /var/lib/fleetmcp-agent 700" "fleetmcp-agent /var/lib/fleetmcp-agent-home 700"; do
	set -- $want
	getent passwd "$1" >/dev/null || fail "no user $1"
	[ "$(stat -c '%U %a' "$2")" = "$1 $3" ] || fail "$2 is $(stat -c '%U %a' "$2"), want $1 $3"
done
for f in /etc/fleetmcp/gateway.env /etc/fleetmcp/agent.env; do
	[ "$(stat -c '%U %a' "$f")" = "root 600" ] || fail "$f is $(stat -c '%U %a' "$f"), want root 600"
done
for u in fleet-gateway fleet-agent; do
	if ls /etc/systemd/system/*.wants/"$u.service" >/dev/null 2>&1; then fail "installing enabled $u.service"; fi
	if command -v systemd-analyze >/dev/null; then
		systemd-analyze verify "/usr/lib/systemd/system/$u.service" || fail "systemd-analyze verify $u.service"
	fi
done
echo "check: packages installed: users, directories, config 0600, units verified and not enabled"

# The installed gateway, fleetctl and agent make a fleet, as their units
# run them: join, online, both doctors pass, SIGTERM stops them. They write
# their state directories: only when this check made them.
fresh=" ${leftovers[*]} "
if [[ "$fresh" == *" /var/lib/fleetmcp "* && "$fresh" == *" /var/lib/fleetmcp-agent "* ]]; then
	[ -f "$fleetctl" ] || fail "no fleetctl package: the join check needs it"
	timeout -k 5 120 deploy/release/check-join.sh || fail "check-join.sh (exit $?)"
else
	echo "check: /var/lib/fleetmcp or /var/lib/fleetmcp-agent was here before the check: the join check not tried"
fi

# An upgrade keeps the operator's configuration and the gateway's data.
echo "JWT_ISSUER=https://login.example.com/check" >>/etc/fleetmcp/gateway.env
echo data >/var/lib/fleetmcp/check-data
dpkg -i "$work/1.0.1/fleet-gateway_1.0.1-1_$arch.deb" >"$work/dpkg.log" 2>&1 </dev/null || { cat "$work/dpkg.log"; fail "upgrade"; }
/usr/bin/fleet-gateway --version | grep -qx "fleet-gateway 1.0.1" || fail "upgraded fleet-gateway --version"
grep -q "login.example.com/check" /etc/fleetmcp/gateway.env || fail "the upgrade replaced the edited gateway.env"
[ -f /var/lib/fleetmcp/check-data ] || fail "the upgrade lost /var/lib/fleetmcp"
echo "check: upgrade to 1.0.1 kept the edited gateway.env and the data directory"

dpkg --purge fleet-gateway fleet-agent $([ -f "$fleetctl" ] && echo fleetctl) >"$work/dpkg.log" 2>&1 || { cat "$work/dpkg.log"; fail "dpkg --purge"; }
[ ! -e /usr/bin/fleet-gateway ] && [ ! -e /etc/fleetmcp/gateway.env ] || fail "purge left the binary or gateway.env"
echo "check: purged"
