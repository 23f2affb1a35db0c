#!/usr/bin/env bash
# Checks that each .rpm of a release holds what its .deb holds, as rpm(8)
# reads it: the same files with the same modes, owners and contents (the
# binary, the units, the sysusers.d and tmpfiles.d entries that make the
# service users, the configuration and the examples); the same
# configuration files, each %config(noreplace) where the .deb has a
# conffile; and the same install and removal scripts. The .rpm is not
# installed here (check.sh installs it where it may).
# usage: deploy/release/check-rpm.sh DIST VERSION ARCH
#   DIST holds the .deb and .rpm packages release.sh made of VERSION for
#   linux/ARCH (amd64 or arm64); rpm(8) and dpkg-deb(1) must be there.
set -euo pipefail
cd "$(dirname "$0")/../.."
dist="$1" version="$2" arch="$3"
fail() {
	echo "check-rpm: FAIL: $*" >&2
	exit 1
}
case "$arch" in
amd64) rarch=x86_64 ;;
arm64) rarch=aarch64 ;;
*) fail "architecture $arch: want amd64 or arm64" ;;
esac
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# The package's files (not directories): mode, owner:group, digest, path.
deb_files() { # deb algo
	local x="$work/x"
	rm -rf "$x" && mkdir "$x" && dpkg-deb -x "$1" "$x"
	# dpkg-deb -c shows the owners as the archive has them.
	dpkg-deb -c "$1" | awk '$1 !~ /^d/ {sub(/^\./, "", $6); print $1, $2, $6}' | LC_ALL=C sort -k3 >"$work/owners"
	while read -r mode owner path; do
		printf '%s %s %s %s\n' "$mode" "$owner" "$("$2sum" "$x$path" | cut -d' ' -f1)" "$path"
	done <"$work/owners"
}
rpm_files() { # rpm
	rpm -qp --qf '[%{FILEMODES:perms} %{FILEUSERNAME}/%{FILEGROUPNAME} %{FILEDIGESTS} %{FILENAMES}\n]' "$1" 2>/dev/null |
		awk '$1 !~ /^d/' | LC_ALL=C sort -k4
}

n=0
for p in fleet-gateway fleet-agent fleetctl; do
	deb="$dist/${p}_${version}-1_${arch}.deb"
	rpm="$dist/${p}-${version}-1.${rarch}.rpm"
	[ -f "$deb" ] || fail "no $deb"
	[ -f "$rpm" ] || fail "no $rpm"
	got="$(rpm -qp --qf '%{NAME} %{VERSION}-%{RELEASE} %{ARCH} %{OS}' "$rpm" 2>/dev/null)"
	[ "$got" = "$p $version-1 $rarch linux" ] || fail "$rpm is \"$got\", want \"$p $version-1 $rarch linux\""

	# Contents: rpm digests them with SHA-256 (algorithm 8) or MD5 (1).
	case "$(rpm -qp --qf '%{FILEDIGESTALGO}' "$rpm" 2>/dev/null)" in
	8) algo=sha256 ;;
	1 | "(none)") algo=md5 ;;
	*) fail "$rpm: unknown file digest algorithm $(rpm -qp --qf '%{FILEDIGESTALGO}' "$rpm")" ;;
	esac
	deb_files "$deb" "$algo" >"$work/deb.list"
	rpm_files "$rpm" >"$work/rpm.list"
	if ! diff -u "$work/deb.list" "$work/rpm.list" >"$work/diff"; then
		cat "$work/diff" >&2
		fail "$p: the .rpm's files (mode, owner, digest, path) differ from the .deb's (- .deb, + .rpm)"
	fi
	grep -q . "$work/rpm.list" || fail "$rpm lists no files"

	# Configuration: the .deb's conffiles are the .rpm's %config files,
	# every one noreplace (an upgrade keeps the operator's edits).
	dpkg-deb -e "$deb" "$work/ctl"
	{ [ -f "$work/ctl/conffiles" ] && LC_ALL=C sort "$work/ctl/conffiles"; } >"$work/deb.conf" || true
	rpm -qp --qf '[%{FILEFLAGS:fflags}|%{FILENAMES}\n]' "$rpm" 2>/dev/null | awk -F'|' '$1 ~ /c/' | LC_ALL=C sort -t'|' -k2 >"$work/rpm.flags"
	awk -F'|' '{print $2}' "$work/rpm.flags" >"$work/rpm.conf"
	diff -u "$work/deb.conf" "$work/rpm.conf" >&2 || fail "$p: the .rpm's %config files differ from the .deb's conffiles"
	if awk -F'|' '$1 !~ /n/ {bad=1} END {exit !bad}' "$work/rpm.flags"; then
		fail "$p: %config files without noreplace: $(awk -F'|' '$1 !~ /n/ {print $2}' "$work/rpm.flags")"
	fi

	# Scripts: the same ones, byte for byte, under each format's name.
	for s in postinstall:postinst:POSTIN preremove:prerm:PREUN postremove:postrm:POSTUN; do
		IFS=: read -r nfpm debname tag <<<"$s"
		src="deploy/release/pkgscripts/$p-$nfpm.sh"
		rpm -qp --qf "%{$tag}" "$rpm" 2>/dev/null >"$work/rpm.script"
		if [ -f "$src" ]; then
			cmp -s "$work/ctl/$debname" "$src" || fail "$p: the .deb's $debname is not $src"
			# rpm keeps a scriptlet without its last newline.
			cmp -s <(cat "$work/rpm.script"; echo) "$src" || cmp -s "$work/rpm.script" "$src" ||
				fail "$p: the .rpm's %{$tag} is not $src"
			[ "$(rpm -qp --qf "%{${tag}PROG}" "$rpm" 2>/dev/null)" = /bin/sh ] || fail "$p: the .rpm's %{$tag} does not run with /bin/sh"
		else
			[ ! -e "$work/ctl/$debname" ] || fail "$p: the .deb has a $debname, and there is no $src"
			[ "$(cat "$work/rpm.script")" = "(none)" ] || fail "$p: the .rpm has a %{$tag} scriptlet, and there is no $src"
		fi
	done
	rm -rf "$work/ctl"
	n=$((n + 1))
	echo "check-rpm: $p: $(wc -l <"$work/rpm.list") files, $(wc -l <"$work/rpm.conf") %config(noreplace), scripts as the .deb's"
done
echo "check-rpm: the $n .rpm packages of $version for linux/$arch hold what their .deb packages hold"
