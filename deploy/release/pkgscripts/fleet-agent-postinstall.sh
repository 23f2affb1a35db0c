#!/bin/sh
# fleet-agent package: after installation or upgrade. Creates the service user
# and its directories; starts nothing that was not running.
set -e
case "$1" in
configure | 1 | 2) ;; # deb: configure; rpm: 1 install, 2 upgrade
*) exit 0 ;;
esac
if command -v systemd-sysusers >/dev/null 2>&1; then
	systemd-sysusers fleet-agent.conf
elif ! getent passwd fleetmcp-agent >/dev/null; then
	useradd --system --user-group --home-dir /var/lib/fleetmcp-agent-home --no-create-home \
		--shell /usr/sbin/nologin fleetmcp-agent
fi
if command -v systemd-tmpfiles >/dev/null 2>&1; then
	systemd-tmpfiles --create fleet-agent.conf
else
	for d in /var/lib/fleetmcp-agent /var/lib/fleetmcp-agent-home; do
		install -d -m 0700 -o fleetmcp-agent -g fleetmcp-agent "$d"
	done
fi
if [ -d /run/systemd/system ]; then
	systemctl daemon-reload
	# An upgrade restarts a running fleet-agent with the new binary.
	systemctl try-restart fleet-agent.service
fi
