#!/usr/bin/env bash
# Installs what the test suite needs from Debian's packages: headless Chromium for the
# report rendering test.  Best effort: without it that one test skips with a reason.
set -u
if command -v chromium >/dev/null 2>&1 || [ -x /usr/bin/chromium ]; then
  exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  echo "test-setup: installing chromium for the report rendering test"
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
    || echo "test-setup: could not install chromium; the browser test will skip"
fi
exit 0
