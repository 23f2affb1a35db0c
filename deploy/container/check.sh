#!/usr/bin/env bash
# Builds the container images where a container engine answers (docker or
# podman) and checks them: both images build from the repository; the
# gateway image prints its --version and, started with authentication off
# on the host's loopback, answers /healthz and /readyz; the agent image
# prints its --version. The images and containers are removed afterwards.
#
# Without an engine that answers (no docker or podman command, or a
# command with no daemon behind it) nothing is built and it says so: the
# container files are then only checked statically (integration
# TestContainerFiles). Building needs the base images (golang, distroless,
# debian) from a registry the engine can pull from, or already in its
# store.
# usage: deploy/container/check.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
fail() {
	echo "container check: FAIL: $*" >&2
	exit 1
}

engine=""
for e in docker podman; do
	command -v "$e" >/dev/null || continue
	if out="$(timeout 20 "$e" info 2>&1 >/dev/null)"; then
		engine="$e"
		break
	fi
	echo "container check: $(command -v "$e") is here, but no engine answers it: ${out##*$'\n'}"
done
if [ -z "$engine" ]; then
	echo "container check: no container engine (docker or podman) answers on this machine: images not built (the container files are checked statically by the integration tests)"
	exit 0
fi

version=0.0.0-check
tag="fleetmcp-check-$$"
gw="$tag/fleet-gateway:$version" ag="$tag/fleet-agent:$version"
running=""
cleanup() {
	[ -n "$running" ] && "$engine" rm -f "$running" >/dev/null 2>&1
	"$engine" rmi -f "$gw" "$ag" >/dev/null 2>&1 || true
}
trap cleanup EXIT

for image in gateway:"$gw" agent:"$ag"; do
	name="${image%%:*}" ref="${image#*:}"
	echo "container check: $engine build deploy/container/Dockerfile.$name"
	if ! log="$("$engine" build -f "deploy/container/Dockerfile.$name" --build-arg VERSION="$version" \
		--build-arg COMMIT="$(git rev-parse HEAD 2>/dev/null || echo unknown)" -t "$ref" . 2>&1)"; then
		echo "$log" | tail -30 >&2
		if grep -qiE 'pull|registry|manifest|dial tcp|no such host|i/o timeout' <<<"$log"; then
			echo "container check: the engine cannot fetch the base images (no registry reachable from here?): images not built"
			exit 0
		fi
		fail "$engine build of Dockerfile.$name"
	fi
done

out="$("$engine" run --rm "$gw" --version)" || fail "the gateway image's --version"
head -1 <<<"$out" | grep -qx "fleet-gateway $version" || fail "the gateway image's --version: $out"
out="$("$engine" run --rm "$ag" --version)" || fail "the agent image's --version"
head -1 <<<"$out" | grep -qx "fleet-agent $version" || fail "the agent image's --version: $out"

# The gateway as the image runs it, on the host's loopback: with the
# host's network a port on 127.0.0.1 is reachable from here.
port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' 2>/dev/null || echo 18080)"
running="$("$engine" run -d --network host "$gw" --no_auth --listen "127.0.0.1:$port" \
	--nats_listen 127.0.0.1:0 --api_listen off)" || fail "start the gateway image"
for path in healthz readyz; do
	ok=""
	for _ in $(seq 1 60); do
		if curl -fsS --max-time 2 "http://127.0.0.1:$port/$path" >/dev/null 2>&1; then
			ok=1
			break
		fi
		sleep 0.5
	done
	if [ -z "$ok" ]; then
		"$engine" logs "$running" 2>&1 | tail -20 >&2
		fail "the gateway container did not answer /$path on 127.0.0.1:$port within 30 s"
	fi
done
"$engine" stop -t 10 "$running" >/dev/null || fail "stop the gateway container"
code="$("$engine" inspect -f '{{.State.ExitCode}}' "$running")"
[ "$code" = 0 ] || fail "the gateway container exited with $code on stop (SIGTERM should drain it)"
echo "container check: both images built with $engine; --version, /healthz and /readyz answer; the gateway stops cleanly"
