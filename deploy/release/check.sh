#!/usr/bin/env bash
# Checks what a release is made of, quickly enough for every CI run:
#   1. release.sh cross-compiles every release target (every command for
#      linux, darwin and windows, amd64 and arm64), each binary of the
#      right format and architecture, the linux ones static (no ELF
#      interpreter);
#   2. the .deb and .rpm packages build, and each .rpm holds what its
#      .deb holds (check-rpm.sh: files, modes, contents, %config
#      noreplace, scripts);
#   3. (as root with dpkg, on a machine where fleetmcp is not installed
#      already) the .deb packages install: users, directories, units that
#      systemd-analyze verifies, no unit enabled or started, --version;
#      an upgrade keeps the edited configuration and the gateway's data;
#      purge removes the packages. The machine is left as it was found.
#   4. in between, the installed services make a fleet as their units
#      run them (check-join.sh): fleetctl's join command enrols the
#      agent, which comes online; fleet-agent doctor and fleetctl doctor
#      pass; both stop on SIGTERM.
#   5. then the .rpm packages install with rpm(8) the same way: users,
#      directories, modes, --version; an upgrade keeps the edited
#      configuration; erase removes them. On Debian rpm keeps a database
#      of its own that knows none of the system's packages, so they are
#      installed with --nodeps, and systemd and the join are not tried
#      again: what the .rpm runs at install is byte for byte what the
#      .deb runs (2.), and the .deb's run is checked in full.
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

# aptInstall installs Debian packages when root on apt; a fresh machine
# may have no package lists yet.
aptInstall() {
	[ "$(id -u)" = 0 ] && command -v apt-get >/dev/null || return 0
	apt-get install -y --no-install-recommends "$@" >/dev/null 2>&1 ||
		{ apt-get update -qq >/dev/null 2>&1 && apt-get install -y --no-install-recommends "$@" >/dev/null 2>&1; } || true
}
command -v file >/dev/null || aptInstall file
command -v file >/dev/null || fail "file(1) is needed to check the binaries: install it"
command -v rpm >/dev/null || aptInstall rpm

# 1. Every target, no packages: static binaries.
FLEET_PACKAGES="" FLEET_DIST="$work/all" deploy/release/release.sh 1.0.0 >"$work/release.log" ||
	{ cat "$work/release.log"; fail "release.sh"; }
grep 'skipping' "$work/release.log" && fail "release.sh skipped a command"
n=0
for target in linux/amd64 linux/arm64 darwin/amd64 darwin/arm64 windows/amd64 windows/arm64; do
	goos="${target%/*}" goarch="${target#*/}"
	for c in fleet-gateway fleet-agent fleetctl; do
		f="$work/all/$c-1.0.0-$goos-$goarch"
		[ "$goos" = windows ] && f="$f.exe"
		[ -f "$f" ] || fail "release.sh built no $(basename "$f")"
		desc="$(file -b "$f")"
		case "$goos/$goarch" in
		linux/amd64) want="ELF 64-bit*x86-64*statically linked*" ;;
		linux/arm64) want="ELF 64-bit*ARM aarch64*statically linked*" ;;
		darwin/amd64) want="Mach-O 64-bit*x86_64*" ;;
		darwin/arm64) want="Mach-O 64-bit*arm64*" ;;
		windows/amd64) want="PE32+ executable*x86-64*" ;;
		windows/arm64) want="PE32+ executable*Aarch64*" ;;
		esac
		# shellcheck disable=SC2053 # want is a pattern
		[[ "$desc" == $want ]] || fail "$(basename "$f") is \"$desc\", want $want"
		if [ "$goos" = linux ] && command -v readelf >/dev/null && readelf -lW "$f" | grep -q INTERP; then
			fail "$(basename "$f") asks for a dynamic loader"
		fi
		n=$((n + 1))
	done
done
extra="$(find "$work/all" -maxdepth 1 -type f -name '*-1.0.0-*' | wc -l)"
[ "$extra" = "$n" ] || fail "release.sh built $extra binaries, $n expected"
(cd "$work/all" && sha256sum --quiet -c SHA256SUMS) || fail "SHA256SUMS does not match"
native="$work/all/fleet-gateway-1.0.0-$(go env GOOS)-$(go env GOARCH)"
"$native" --version | grep -qx "fleet-gateway 1.0.0" || fail "$native --version: $("$native" --version)"
echo "check: $n binaries, 3 commands for 6 targets, each of its format and architecture, linux ones static, SHA256SUMS right"

# 2. The .deb and .rpm packages, at two versions for the upgrade.
arch="$(go env GOARCH)"
rarch="$(case "$arch" in amd64) echo x86_64 ;; arm64) echo aarch64 ;; *) echo "$arch" ;; esac)"
for v in 1.0.0 1.0.1; do
	FLEET_TARGETS="linux/$arch" FLEET_PACKAGES="deb rpm" FLEET_PKG_ARCHS="$arch" FLEET_DIST="$work/$v" \
		deploy/release/release.sh "$v" >"$work/release-$v.log" || { cat "$work/release-$v.log"; fail "release.sh $v"; }
done
for p in fleet-gateway fleet-agent fleetctl; do
	deb="$work/1.0.0/${p}_1.0.0-1_$arch.deb"
	[ -f "$deb" ] || fail "no $deb"
	dpkg-deb -f "$deb" Package | grep -qx "$p" || fail "$deb is not package $p"
	[ -f "$work/1.0.0/$p-1.0.0-1.$rarch.rpm" ] || fail "no $p-1.0.0-1.$rarch.rpm"
done
echo "check: .deb and .rpm packages of fleet-gateway, fleet-agent and fleetctl built"
if command -v rpm >/dev/null; then
	deploy/release/check-rpm.sh "$work/1.0.0" 1.0.0 "$arch" || fail "check-rpm.sh"
else
	echo "check: no rpm(8) here (not root on apt to install it): the .rpm packages are built but not inspected"
fi

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
# unmake removes the users and directories the check made.
unmake() {
	for u in "${created[@]}"; do userdel "$u" >/dev/null 2>&1 || true; done
	for u in "${created[@]}"; do groupdel "$u" >/dev/null 2>&1 || true; done
	for d in "${leftovers[@]}"; do rm -rf "$d"; done
}
restore() {
	dpkg --purge fleet-gateway fleet-agent fleetctl >/dev/null 2>&1 || true
	unmake
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

# 5. The .rpm packages, installed with rpm(8) on this dpkg system: see
# the top of this file for what that leaves out.
if ! command -v rpm >/dev/null; then
	echo "check: no rpm(8): the .rpm packages not installed"
	exit 0
fi
# What the .deb packages made goes first, so that the .rpm makes it again.
unmake
rpmdb_was=""
[ -e /var/lib/rpm ] && rpmdb_was=1
for p in fleet-gateway fleet-agent fleetctl; do
	if rpm -q "$p" >/dev/null 2>&1; then
		echo "check: rpm says $p is installed on this machine: the .rpm installation not tried"
		exit 0
	fi
done
restore_rpm() {
	rpm -e --nodeps fleet-gateway fleet-agent fleetctl >/dev/null 2>&1 || true
	[ -n "$rpmdb_was" ] || rm -rf /var/lib/rpm
	restore
}
trap restore_rpm EXIT
rpms=()
for p in fleet-gateway fleet-agent fleetctl; do rpms+=("$work/1.0.0/$p-1.0.0-1.$rarch.rpm"); done
rpm -i --nodeps "${rpms[@]}" >"$work/rpm.log" 2>&1 || { cat "$work/rpm.log"; fail "rpm -i"; }
for c in fleet-gateway fleet-agent fleetctl; do
	"/usr/bin/$c" --version | head -1 | grep -qx "$c 1.0.0" || fail "$c --version from the .rpm: $("/usr/bin/$c" --version)"
done
for want in "fleetmcp /var/lib/fleetmcp 700" "fleetmcp /var/log/fleetmcp 750" \
	"fleetmcp-agent /var/lib/fleetmcp-agent 700" "fleetmcp-agent /var/lib/fleetmcp-agent-home 700"; do
	set -- $want
	getent passwd "$1" >/dev/null || fail "the .rpm made no user $1"
	[ "$(stat -c '%U %a' "$2")" = "$1 $3" ] || fail "after the .rpm, $2 is $(stat -c '%U %a' "$2"), want $1 $3"
done
for f in /etc/fleetmcp/gateway.env /etc/fleetmcp/agent.env; do
	[ "$(stat -c '%U %a' "$f")" = "root 600" ] || fail "after the .rpm, $f is $(stat -c '%U %a' "$f"), want root 600"
done
rpm -V fleet-gateway fleet-agent fleetctl >"$work/rpmv.log" 2>&1 || { cat "$work/rpmv.log"; fail "rpm -V: the installed files differ from the packages"; }
echo "JWT_ISSUER=https://login.example.com/check" >>/etc/fleetmcp/gateway.env
rpm -U --nodeps "$work/1.0.1/fleet-gateway-1.0.1-1.$rarch.rpm" >"$work/rpm.log" 2>&1 </dev/null || { cat "$work/rpm.log"; fail "rpm -U"; }
/usr/bin/fleet-gateway --version | head -1 | grep -qx "fleet-gateway 1.0.1" || fail "upgraded fleet-gateway (.rpm) --version"
grep -q "login.example.com/check" /etc/fleetmcp/gateway.env || fail "the .rpm upgrade replaced the edited gateway.env"
[ -d /var/lib/fleetmcp ] || fail "the .rpm upgrade lost /var/lib/fleetmcp"
rpm -e fleet-gateway fleet-agent fleetctl >"$work/rpm.log" 2>&1 || { cat "$work/rpm.log"; fail "rpm -e"; }
[ ! -e /usr/bin/fleet-gateway ] && [ ! -e /usr/bin/fleet-agent ] || fail "rpm -e left the binaries"
echo "check: .rpm packages installed (users, directories, modes, rpm -V), upgraded keeping the edited gateway.env, erased"
