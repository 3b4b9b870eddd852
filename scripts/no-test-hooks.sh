#!/usr/bin/env bash
# The shipped binaries carry no test hook. Builds talosctl-rs and talos-opsd
# as a release build configures them, without the `test-hooks` feature, and
# fails if they hold the environment variables that make the crash-safety
# tests abort the CLI or the daemon, or lock the daemon's journal.
#
# The hooks depend on the feature alone, not on the profile, so the test
# command checks the dev profile, whose dependencies its tests have built
# already (a release build of both binaries costs over 20 CPU minutes on 2
# cores); PROFILE=release checks the release binaries themselves. Run it
# after the tests: it rebuilds target/<profile>/talosctl-rs and talos-opsd
# without the hooks, which the crash tests need.
set -euo pipefail
cd "$(dirname "$0")/.."

profile="${PROFILE:-dev}"
dir="$profile"
[ "$profile" = dev ] && dir=debug
hooks='TALOSCTL_RS_TEST_CRASH|TALOS_OPSD_TEST_CRASH|TALOS_OPSD_TEST_JOURNAL_BUSY'
cargo build --locked --profile "$profile" -p talosctl-rs -p talos-opsd
for bin in talosctl-rs talos-opsd; do
	if grep -a -o -E "$hooks" "target/$dir/$bin" | sort -u | grep .; then
		echo "target/$dir/$bin holds the test hooks above: they must be behind the test-hooks feature" >&2
		exit 1
	fi
done
echo "talosctl-rs and talos-opsd built without the test-hooks feature hold no test hook ($profile profile)"
