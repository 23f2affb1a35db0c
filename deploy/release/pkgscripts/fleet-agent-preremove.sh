#!/bin/sh
# fleet-agent package: before removal (not before an upgrade). The state and
# the configuration stay (deploy/README.md says how to remove them).
set -e
case "$1" in
remove | 0) ;; # deb: remove; rpm: 0 erase (1 is an upgrade)
*) exit 0 ;;
esac
if [ -d /run/systemd/system ]; then
	systemctl disable --now fleet-agent.service || true
fi
