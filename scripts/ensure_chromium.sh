#!/usr/bin/env bash
# Install Debian's headless Chromium for the dashboard's browser test when it is missing.
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then exit 0; fi
if [ "$(id -u)" != "0" ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "chromium is missing and cannot be installed here (need root and apt-get)" >&2
  exit 1
fi
echo "installing chromium (Debian package) for the browser test"
apt-get update -qq >/dev/null
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null
command -v chromium >/dev/null
