#!/usr/bin/env bash
# Checks that the installed packages make a working fleet on this machine,
# the way an operator sets one up (check.sh runs it, as root, after
# installing the .deb packages; on its own it needs them installed):
#   - /usr/bin/fleet-gateway runs as its unit would run it: User, the
#     ExecStart flags and the EnvironmentFile the installed unit names,
#     plus loopback listeners on free ports and an admin API token made
#     with fleet-gateway --new_api_token;
#   - the installed fleetctl makes a join token, and the join command it
#     prints, run as the agent unit's User with its state directory and
#     flags, enrols this machine and runs the agent;
#   - fleetctl agent list shows the host online; fleet-agent doctor (as the
#     agent's user, with the unit's flags) and fleetctl doctor exit 0;
#   - both stop on SIGTERM, within their units' TimeoutStopSec.
# Both processes are stopped and the temporary files removed on any exit.
# What the gateway and the agent write to their state directories stays:
# check.sh purges the packages and removes those after it.
set -euo pipefail

fail() {
	echo "check: FAIL: $*" >&2
	exit 1
}
[ "$(id -u)" = 0 ] || fail "check-join.sh runs the services as their users: run it as root"
for b in /usr/bin/fleet-gateway /usr/bin/fleet-agent /usr/bin/fleetctl; do
	[ -x "$b" ] || fail "$b is not installed"
done
gwunit=/usr/lib/systemd/system/fleet-gateway.service
agunit=/usr/lib/systemd/system/fleet-agent.service

tmp="$(mktemp -d)"
# The services reach their own files below it, nothing else.
chmod 0711 "$tmp"
gwpid="" agpid=""
stop_all() {
	for p in $agpid $gwpid; do kill -KILL "$p" 2>/dev/null || true; done
	for p in $agpid $gwpid; do wait "$p" 2>/dev/null || true; done
	rm -rf "$tmp"
}
trap stop_all EXIT
trap 'exit 143' TERM INT HUP

# unit_value UNIT KEY: the last KEY= setting of the [Service] section.
unit_value() {
	sed -n '/^\[Service\]/,/^\[/p' "$1" | sed -n "s/^$2=//p" | tail -n1
}

# env_file FILE ARRAY: the KEY=VALUE lines of a systemd EnvironmentFile
# (comments and blank lines skipped, one pair of quotes removed) into the
# associative array ARRAY.
env_file() {
	local f="$1" line k v
	local -n into="$2"
	f="${f#-}"
	[ -f "$f" ] || fail "EnvironmentFile $f of the unit does not exist"
	while IFS= read -r line || [ -n "$line" ]; do
		line="${line#"${line%%[![:space:]]*}"}"
		case "$line" in '' | '#'* | ';'*) continue ;; esac
		[[ "$line" =~ ^([A-Za-z_][A-Za-z0-9_]*)=(.*)$ ]] || fail "$f: not KEY=VALUE: $line"
		k="${BASH_REMATCH[1]}" v="${BASH_REMATCH[2]}"
		if [[ "$v" =~ ^\"(.*)\"$ || "$v" =~ ^\'(.*)\'$ ]]; then v="${BASH_REMATCH[1]}"; fi
		into["$k"]="$v"
	done <"$f"
}

# exec_start UNIT ARRAY ENV: the unit's ExecStart as words into ARRAY,
# $VAR (split on whitespace) and ${VAR} (one word) taken from the
# associative array ENV, as systemd expands them.
exec_start() {
	local line w
	local -n words="$2" vars="$3"
	line="$(unit_value "$1" ExecStart)"
	[ -n "$line" ] || fail "$1 has no ExecStart"
	line="${line#[-@+!:]}"
	words=()
	for w in $line; do
		if [[ "$w" =~ ^\$([A-Za-z_][A-Za-z0-9_]*)$ ]]; then
			# shellcheck disable=SC2206 # systemd splits $VAR on whitespace
			words+=(${vars[${BASH_REMATCH[1]}]:-})
		elif [[ "$w" =~ ^\$\{([A-Za-z_][A-Za-z0-9_]*)\}$ ]]; then
			words+=("${vars[${BASH_REMATCH[1]}]:-}")
		elif [[ "$w" == *'$'* ]]; then
			fail "$1: ExecStart word $w: only whole-word \$VAR and \${VAR} are understood here"
		else
			words+=("$w")
		fi
	done
}

# run_as UNIT ENV LOG ARGS...: runs ARGS in the background as the unit's
# User and Group, with its umask, working directory, Environment= and the
# variables of ENV (its EnvironmentFile) and nothing else; sets $! .
run_as() {
	local unit="$1" log="$3" user group umask dir in=/dev/null
	local -n vars="$2"
	shift 3
	# STDIN=FILE before the call: what the command reads on its standard input.
	[ -n "${STDIN:-}" ] && in="$STDIN"
	user="$(unit_value "$unit" User)" group="$(unit_value "$unit" Group)"
	umask="$(unit_value "$unit" UMask)" dir="$(unit_value "$unit" WorkingDirectory)"
	local envs=(PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin)
	local e k
	while IFS= read -r e; do [ -n "$e" ] && envs+=("$e"); done < <(unit_value "$unit" Environment | tr ' ' '\n')
	for k in "${!vars[@]}"; do envs+=("$k=${vars[$k]}"); done
	(
		umask "${umask:-0022}"
		cd "${dir:-/}"
		exec setpriv --reuid="$user" --regid="${group:-$user}" --init-groups -- env -i "${envs[@]}" "$@"
	) >"$log" 2>&1 <"$in" &
}

# free_port VAR: sets VAR to a TCP port nothing on this machine listens
# on, below the kernel's ephemeral range (which port-0 listeners and
# outgoing connections draw from, so nothing is handed it meanwhile) and
# not given out before by this script. (A function, not $(...): the
# subshell would forget what it gave out.)
taken=" "
read -r eph_lo _ </proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || eph_lo=32768
free_port() {
	local p lo=$((eph_lo > 22000 ? eph_lo - 12000 : 10000))
	for _ in $(seq 200); do
		p=$((lo + RANDOM % (eph_lo - lo)))
		if [[ "$taken" != *" $p "* ]] && ! ss -Htln "sport = :$p" | grep -q .; then
			taken+="$p "
			printf -v "$1" '%s' "$p"
			return
		fi
	done
	fail "no free TCP port found"
}

# stop NAME PID UNIT: SIGTERM, then the exit within the unit's TimeoutStopSec.
stop() {
	local name="$1" pid="$2" limit rc=0
	limit="$(unit_value "$3" TimeoutStopSec)"
	kill -TERM "$pid" || fail "$name (pid $pid) was no longer running"
	for _ in $(seq "$((${limit:-30} * 10))"); do
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.1
	done
	kill -0 "$pid" 2>/dev/null && fail "$name did not stop within ${limit:-30}s of SIGTERM"
	wait "$pid" || rc=$?
	[ "$rc" = 0 ] || fail "$name exited $rc on SIGTERM: $(tail -n 20 "$tmp/$name.log")"
}

# --- the gateway, as its unit runs it.
declare -A gwenv=()
env_file "$(unit_value "$gwunit" EnvironmentFile)" gwenv
gwcmd=()
exec_start "$gwunit" gwcmd gwenv
[ "${gwcmd[0]}" = /usr/bin/fleet-gateway ] || fail "$gwunit runs ${gwcmd[0]}, not /usr/bin/fleet-gateway"
datadir=""
for ((i = 1; i < ${#gwcmd[@]}; i++)); do
	case "${gwcmd[$i]}" in --data_dir) datadir="${gwcmd[$((i + 1))]}" ;; --data_dir=*) datadir="${gwcmd[$i]#*=}" ;; esac
done
[ -n "$datadir" ] || fail "$gwunit gives no --data_dir"
gwuser="$(unit_value "$gwunit" User)"

admin="$(/usr/bin/fleet-gateway --new_api_token fleet-check)" || fail "fleet-gateway --new_api_token"
token="$(sed -n 's/^ *\(fmcp_[A-Za-z0-9_-]*\) *$/\1/p' <<<"$admin")"
entry="$(sed -n 's/^ *\(- {name: "fleet-check".*\)}$/\1, admin: true}/p' <<<"$admin")"
[ -n "$token" ] && [ -n "$entry" ] || fail "fleet-gateway --new_api_token printed no token or entry: $admin"
install -d -m 0700 -o "$gwuser" "$tmp/gateway"
printf 'tokens:\n  %s\n' "$entry" >"$tmp/gateway/api-tokens.yaml"
chown "$gwuser" "$tmp/gateway/api-tokens.yaml"
chmod 0600 "$tmp/gateway/api-tokens.yaml"
(umask 077 && printf '%s\n' "$token" >"$tmp/admin-token")

free_port mcp
free_port natsp
free_port api
run_as "$gwunit" gwenv "$tmp/gateway.log" "${gwcmd[@]}" --listen "127.0.0.1:$mcp" --nats_listen "127.0.0.1:$natsp" \
	--api_listen "127.0.0.1:$api" --api_tokens "$tmp/gateway/api-tokens.yaml"
gwpid=$!
ctl=(/usr/bin/fleetctl --gateway "https://127.0.0.1:$api" --ca_file "$datadir/tls/ca.pem" --api_token_file "$tmp/admin-token" --timeout 5s)
for i in $(seq 150); do
	kill -0 "$gwpid" 2>/dev/null || fail "the gateway exited: $(tail -n 20 "$tmp/gateway.log")"
	[ -f "$datadir/tls/ca.pem" ] && "${ctl[@]}" agent list >/dev/null 2>&1 && break
	[ "$i" = 150 ] && fail "the gateway's fleet API did not answer within 30s: $(tail -n 20 "$tmp/gateway.log")"
	sleep 0.2
done
[ "$(ps -o user= -p "$gwpid")" = "$gwuser" ] || fail "the gateway runs as $(ps -o user= -p "$gwpid"), not $gwuser"
echo "check: installed gateway runs as $gwuser as its unit starts it (${gwcmd[*]}), fleet API answers fleetctl"

# --- a join token, and the join command fleetctl prints, as the agent's unit runs it.
out="$("${ctl[@]}" token create --name fleet-check-host --ttl 10m)" || fail "fleetctl token create: $out"
join="$(grep -m1 '^ *fleet-agent join ' <<<"$out")" || fail "fleetctl token create printed no join command: $out"
read -ra joincmd <<<"$join"
# The printed command reads the token on its standard input (--token_file -),
# as someone pasting it at the prompt or piping it in gives it.
jointoken="$(sed -n 's/^ *\(fmcp1\.[A-Za-z0-9._-]*\) *$/\1/p' <<<"$out")"
[ -n "$jointoken" ] || fail "fleetctl token create printed no token: $out"
(umask 077 && printf '%s\n' "$jointoken" >"$tmp/join-token")
declare -A agenv=()
env_file "$(unit_value "$agunit" EnvironmentFile)" agenv
agcmd=()
exec_start "$agunit" agcmd agenv
[ "${agcmd[0]}" = /usr/bin/fleet-agent ] || fail "$agunit runs ${agcmd[0]}, not /usr/bin/fleet-agent"
aguser="$(unit_value "$agunit" User)"
STDIN="$tmp/join-token" run_as "$agunit" agenv "$tmp/agent.log" /usr/bin/fleet-agent "${joincmd[@]:1}" "${agcmd[@]:1}"
agpid=$!
for i in $(seq 150); do
	kill -0 "$agpid" 2>/dev/null || fail "fleet-agent join exited: $(tail -n 20 "$tmp/agent.log")"
	"${ctl[@]}" agent list 2>/dev/null | grep -Eq '^fleet-check-host +online ' && break
	[ "$i" = 150 ] && fail "the host is not online in fleetctl agent list within 30s: $("${ctl[@]}" agent list 2>&1) $(tail -n 20 "$tmp/agent.log")"
	sleep 0.2
done
[ "$(ps -o user= -p "$agpid")" = "$aguser" ] || fail "the agent runs as $(ps -o user= -p "$agpid"), not $aguser"
echo "check: fleetctl token create's join command enrolled the host as $aguser (${agcmd[*]:1}); fleetctl agent list shows it online"

# --- the doctors.
run_as "$agunit" agenv "$tmp/agent-doctor.log" /usr/bin/fleet-agent doctor "${agcmd[@]:1}"
rc=0
wait $! || rc=$?
[ "$rc" = 0 ] || fail "fleet-agent doctor exited $rc: $(tail -n 20 "$tmp/agent-doctor.log")"
rc=0
"${ctl[@]}" doctor --mcp_url "http://127.0.0.1:$mcp/mcp" >"$tmp/fleetctl-doctor.log" 2>&1 || rc=$?
[ "$rc" = 0 ] || fail "fleetctl doctor exited $rc: $(tail -n 20 "$tmp/fleetctl-doctor.log")"
echo "check: fleet-agent doctor (as $aguser) and fleetctl doctor pass"

# --- SIGTERM stops both cleanly.
stop agent "$agpid" "$agunit"
agpid=""
stop gateway "$gwpid" "$gwunit"
gwpid=""
echo "check: agent and gateway stopped on SIGTERM, exit 0"
