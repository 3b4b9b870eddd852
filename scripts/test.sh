#!/usr/bin/env bash
# Everything CI checks: installs what the tests need, then formatting, lints,
# the library alone (and that it pulls in none of the tools' dependencies),
# the examples, the whole workspace's tests (real etcd via talos-sim), the
# memory tests on optimised code, and the interop tests against upstream
# Talos's Go client and stubs.
set -euo pipefail
cd "$(dirname "$0")/.."

# A one-off build: incremental artefacts would only cost disk (GBs here).
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"

scripts/install-deps.sh
# The kube-apiserver the Kubernetes tests run on each simulated control-plane
# node (bin/talos-sim/tests/sim_kubernetes.rs): built from the Go module proxy
# into ~/.cache/talos-client on the first run (about 4 minutes on 2 cores),
# found there afterwards.
TALOS_SIM_KUBE_APISERVER="$(scripts/kube-apiserver.sh)"
export TALOS_SIM_KUBE_APISERVER
cargo fmt --all --check
cargo clippy --locked --workspace --all-targets --all-features -- -D warnings

# The published crates: their packages hold what they need and build on
# their own (cargo 1.90 and later resolve talos-opsd-api's dependency on the
# unpublished talos-client from the package beside it), and the docs build
# without a warning.
cargo publish --locked --dry-run --allow-dirty -p talos-client -p talos-opsd-api
RUSTDOCFLAGS="-D warnings" cargo doc --locked --no-deps --all-features --workspace

# `cargo add talos-client` must bring a client and nothing else.
cargo build --locked -p talos-client
heavy=$(cargo tree --locked -p talos-client -e normal,no-proc-macro --prefix none |
  grep -E '^(clap|anyhow|indicatif|rcgen|similar|tempfile|tracing-subscriber|rusqlite|talos-sim) ' || true)
if [ -n "$heavy" ]; then
  echo "talos-client's normal dependencies include tool-only crates:" >&2
  echo "$heavy" >&2
  exit 1
fi

# The CLI talks to talos-opsd through its API crate, never the daemon's own
# dependencies (metrics, scheduler, configuration file).
daemon_only=$(cargo tree --locked -p talosctl-rs -e normal,no-proc-macro --prefix none |
  grep -E '^(prometheus-client|croner|toml|talos-opsd) ' || true)
if [ -n "$daemon_only" ]; then
  echo "talosctl-rs depends on the daemon's own crates:" >&2
  echo "$daemon_only" >&2
  exit 1
fi

cargo build --locked --examples
# The test-only crash hooks (feature test-hooks) are on for the tests only.
cargo test --locked --workspace --features talosctl-rs/test-hooks,talos-opsd/test-hooks
# The apply, health and migrate (join + retire) tests once more on Talos's own
# schedules (talos-sim's timing divisor 1 instead of the tests' 10): a
# promotion after the 15 s retry, etcd health checked every 20 s.
TALOS_SIM_TIMING_DIVISOR=1 cargo test --locked -p talosctl-rs --features test-hooks \
  --test cli_ops_apply --test cli_health --test cli_ops_migrate
# Off-host backups (feature `backup`): a real S3 server on loopback, age,
# zstd and a throwaway etcd.
cargo test --locked -p talos-client --features backup --lib \
  --test backup_s3 --test backup_drill --test backup_catalogue
cargo test --locked -p talos-client --features backup --doc
# Peak-memory checks measure the optimised code that users run.
cargo test --locked --release -p talos-client --test snapshot_memory --test client_snapshot_memory
cargo test --locked --release -p talos-client --features backup --test backup_memory
# The shipped binaries hold no test hook (after the tests: it rebuilds the
# CLI and the daemon without them).
scripts/no-test-hooks.sh
tests/interop/run.sh
