#!/usr/bin/env bash
# Installs what the test suite needs from Debian's packages: headless Chromium for the
# report rendering test, redis-server for the fleet tests (tests/fleet).  Best effort:
# without them those tests skip with a reason.
set -u
need=""
if ! command -v chromium >/dev/null 2>&1 && [ ! -x /usr/bin/chromium ]; then
  need="$need chromium"
fi
if ! command -v redis-server >/dev/null 2>&1 && [ ! -x /usr/bin/redis-server ]; then
  need="$need redis-server"
fi
if [ -z "$need" ]; then
  exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  echo "test-setup: installing$need (report rendering test, fleet tests)"
  apt-get update -qq || true
  for pkg in $need; do
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$pkg" >/dev/null \
      || echo "test-setup: could not install $pkg; the tests that need it will skip"
  done
fi
exit 0
