#!/usr/bin/env bash
# Everything CI checks (docs/testing.md has the order, the budget of 25
# minutes on 2 cores and the measured times):
#  1. setup: the Debian tools, kube-apiserver, etcd and cargo-nextest (built once
#     into ~/.cache/talos-client, found there afterwards), formatting;
#  2. one debug build of the whole workspace with all features (the tests,
#     the examples, the interop tests' Rust side), linted by clippy as it
#     builds, and the interop tests' Go programs;
#  3. the tests, at once: the workspace's tests under nextest, each in its
#     own process, many at a time (.config/nextest.toml); beside them the
#     apply, health and migrate tests on Talos's own schedules; and, niced,
#     the published crates' packages and docs, the doc tests, the
#     library alone and its dependency rules;
#  4. that the shipped binaries hold no test hook.
# A timing summary ends every run, also a failing one.
set -euo pipefail
cd "$(dirname "$0")/.."

# A one-off build: incremental artefacts would only cost disk (GBs here).
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"

. scripts/phases.sh
phases_init
trap phases_summary EXIT

phase install-deps scripts/install-deps.sh
# The kube-apiserver the Kubernetes tests run on each simulated control-plane
# node (bin/talos-sim/tests/sim_kubernetes.rs): built from the Go module proxy
# into ~/.cache/talos-client on the first run (about 4 minutes on 2 cores),
# found there afterwards.
phase kube-apiserver scripts/kube-apiserver.sh >"$PHASES_DIR/kube-apiserver.path"
TALOS_SIM_KUBE_APISERVER="$(cat "$PHASES_DIR/kube-apiserver.path")"
export TALOS_SIM_KUBE_APISERVER
# The etcd releases talos-sim runs on a simulated control-plane node, v3.6.12
# for the Talos 1.13.9 profile and v3.7.1 for 1.14, with their etcdutl and
# etcdctl: built from the Go module proxy into the same cache on the first run
# (about a minute a binary), found there afterwards.
phase etcd scripts/etcd.sh all >"$PHASES_DIR/etcd.path"
TALOS_SIM_ETCD_CACHE="$(dirname "$(dirname "$(head -n 1 "$PHASES_DIR/etcd.path")")")"
export TALOS_SIM_ETCD_CACHE
phase nextest scripts/nextest.sh >"$PHASES_DIR/nextest.path"
nextest="$(cat "$PHASES_DIR/nextest.path")"
phase fmt cargo fmt --all --check

# One feature set for the whole workspace, clippy and the tests alike: the
# backup feature's tests, the test-only crash hooks (feature test-hooks of
# talosctl-rs and talos-opsd) and the interop tests' Rust side are in the one
# build.
features=(--locked --workspace --all-features)

# Clippy lints the workspace's crates while they are built: `cargo clippy`
# is `cargo check` with clippy-driver as the rustc of the workspace's crates
# (RUSTC_WORKSPACE_WRAPPER, its arguments in CLIPPY_ARGS), and clippy-driver
# compiles as rustc does. So the one build of every target (the libraries,
# binaries, tests and examples, as `--all-targets`; there are no benches)
# is also clippy with `-D warnings`, instead of a second, check-only pass
# over all of them (ten minutes of CPU beside the tests). Every cargo
# command below keeps the wrapper, so none rebuilds for want of it.
clippy_driver="$(rustup which clippy-driver 2>/dev/null || command -v clippy-driver || true)"
if [ -z "$clippy_driver" ]; then
	echo "clippy-driver not found: rustup component add clippy" >&2
	exit 1
fi
export RUSTC_WORKSPACE_WRAPPER="$clippy_driver"
export CLIPPY_ARGS="-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__"

phase interop-go tests/interop/build.sh >"$PHASES_DIR/interop.path"
INTEROP_BIN_DIR="$(cat "$PHASES_DIR/interop.path")"
export INTEROP_BIN_DIR

# The build (and clippy, see above), then the list of test binaries nextest runs from it: the test
# runs below start no cargo, so the cargo commands beside them do not wait
# for the build directory's lock.
build_tests() {
	"$nextest" nextest list "${features[@]}" --list-type binaries-only \
		--message-format json >"$PHASES_DIR/binaries.json"
	cargo metadata --locked --format-version 1 --all-features --no-deps >"$PHASES_DIR/cargo-metadata.json"
}
phase build-tests build_tests
run_tests() { # PROFILE [nextest run arguments]
	local profile=$1
	shift
	"$nextest" nextest run --profile "$profile" \
		--binaries-metadata "$PHASES_DIR/binaries.json" \
		--cargo-metadata "$PHASES_DIR/cargo-metadata.json" "$@"
}

# Talos's own schedules (talos-sim's timing divisor 1 instead of the tests'
# 10) for the apply, health and migrate tests, which the profile `upstream`
# picks: a promotion after the 15 s retry, etcd health checked every 20 s.
upstream_tests() {
	export TALOS_SIM_TIMING_DIVISOR=1
	run_tests upstream
}

# What needs the CPU more than the clock, one after another and niced, so
# the tests' timers keep their pace. Each runs even if one before failed.
cpu_checks() {
	local status=0
	renice -n 10 -p "$BASHPID" >/dev/null
	# The published crates: their packages hold what they need and build
	# on their own (cargo 1.90 and later resolve talos-opsd-api's
	# dependency on the unpublished talos-client from the package beside
	# it), and the docs build without a warning.
	phase publish-dry-run publish_dry_run || status=1
	phase rustdoc env RUSTDOCFLAGS="-D warnings" cargo doc --locked --no-deps --all-features --workspace || status=1
	# nextest does not run doc tests.
	phase doc-tests cargo test "${features[@]}" --doc || status=1
	phase library-alone library_alone || status=1
	return "$status"
}

# cargo unpacks the packaged talos-client into the registry's source
# directory as if it came from crates.io, and reuses a directory of that
# name it finds there without comparing checksums: an earlier run's package
# (same version, older code) would be built instead of this one. Our crates
# are not on crates.io, so their unpacked copies are only ever ours.
publish_dry_run() {
	rm -rf "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/talos-client-* \
		"${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/talos-opsd-api-*
	cargo publish --locked --dry-run --allow-dirty -p talos-client -p talos-opsd-api
}

# `cargo add talos-client` must bring a client and nothing else, and the CLI
# talks to talos-opsd through its API crate, never the daemon's own
# dependencies (metrics, scheduler, configuration file).
library_alone() {
	cargo build --locked -p talos-client
	local heavy daemon_only
	heavy=$(cargo tree --locked -p talos-client -e normal,no-proc-macro --prefix none |
		grep -E '^(clap|anyhow|indicatif|rcgen|similar|tempfile|tracing-subscriber|rusqlite|talos-sim) ' || true)
	if [ -n "$heavy" ]; then
		echo "talos-client's normal dependencies include tool-only crates:" >&2
		echo "$heavy" >&2
		return 1
	fi
	daemon_only=$(cargo tree --locked -p talosctl-rs -e normal,no-proc-macro --prefix none |
		grep -E '^(prometheus-client|croner|toml|talos-opsd) ' || true)
	if [ -n "$daemon_only" ]; then
		echo "talosctl-rs depends on the daemon's own crates:" >&2
		echo "$daemon_only" >&2
		return 1
	fi
}

phase_bg tests-upstream upstream_tests
phase_bg cpu-checks cpu_checks
status=0
phase tests run_tests default || status=1
phase_wait tests-upstream cpu-checks || status=1
# The shipped binaries hold no test hook: last, as it rebuilds the CLI and
# the daemon in target/debug without the hooks the crash tests need.
phase no-test-hooks scripts/no-test-hooks.sh || status=1
exit "$status"
