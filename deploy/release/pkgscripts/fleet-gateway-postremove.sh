#!/bin/sh
# fleet-gateway package: after removal or upgrade.
set -e
if [ -d /run/systemd/system ]; then
	systemctl daemon-reload || true
fi
