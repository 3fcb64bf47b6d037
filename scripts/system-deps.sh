#!/usr/bin/env bash
# The Debian packages `make test` needs, installed when missing (first step of `make test`).
#
#   redis-server              the Redis store tests start their own instances on loopback ports
#   prometheus                promtool checks the Prometheus rules and alerts (tests/test_deploy.py)
#   chromium, chromium-driver the console's browser tests (tests/test_console_browser.py)
#   curl                      the README's quick start and docs/api.md's examples, run as written
#   nodejs, npm               the quick start's real MCP server (npm's server-filesystem over stdio)
#
# As root with apt-get: one `apt-get update` and one install of the missing packages, with a
# policy-rc.d that refuses every service start while apt runs (only the binaries are wanted, never a
# Redis or Prometheus daemon), removed afterwards. Otherwise: one message naming what to install, and
# exit 1 before anything slow runs. Only shell builtins are used to decide, so the check is instant.
set -euo pipefail

POLICY_RC="${SYSTEM_DEPS_POLICY_RC:-/usr/sbin/policy-rc.d}"

missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
{ command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; } \
  || missing+=(chromium)
command -v chromedriver >/dev/null 2>&1 || missing+=(chromium-driver)
command -v curl >/dev/null 2>&1 || missing+=(curl)
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)

if [ "${#missing[@]}" -eq 0 ]; then
  exit 0
fi

if [ "$EUID" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "make test needs Debian packages that are not installed: ${missing[*]}." \
       "Install them (as root: apt-get install ${missing[*]}) or run make test as root, which installs them." >&2
  exit 1
fi

echo "make test: installing ${missing[*]} (apt-get, no daemons started)" >&2
created=0
cleanup() { if [ "$created" = 1 ]; then rm -f "$POLICY_RC"; fi; }
trap cleanup EXIT
if [ ! -e "$POLICY_RC" ]; then
  created=1
  printf '#!/bin/sh\nexit 101\n' >"$POLICY_RC"
  chmod +x "$POLICY_RC"
fi
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
