#!/bin/sh
# Make sure Debian's Chromium and its WebDriver are installed, for the test
# that loads the admin endpoint's status page in a real browser
# (tests/tests/status_page.rs). Idempotent: does nothing when both are
# there. The test runs Chromium headless, with a profile of its own, and
# nothing of the machine's network.
set -eu
here=$(dirname "$0")
"$here/ensure-debian-package" chromium /usr/bin/chromium
"$here/ensure-debian-package" chromium-driver /usr/bin/chromedriver
