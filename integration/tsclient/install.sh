#!/usr/bin/env bash
# Installs the TypeScript MCP SDK client the integration tests drive
# (TestSkillsTypeScriptClient), exactly as package-lock.json pins it.
set -euo pipefail
cd "$(dirname "$0")"
if ! command -v npm >/dev/null; then
	echo "npm is not installed: install Node.js 20 or later (e.g. apt-get install nodejs npm)" >&2
	exit 1
fi
npm ci --ignore-scripts --no-audit --no-fund
