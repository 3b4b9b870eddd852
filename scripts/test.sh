#!/usr/bin/env bash
# Everything CI checks: installs what the tests need, then formatting, lints,
# the examples, the whole test suite (real etcd via talos-sim), and the
# interop tests against upstream Talos's Go client and stubs.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh
cargo fmt --all --check
cargo clippy --locked --all-targets --all-features -- -D warnings
cargo build --locked --examples
cargo test --locked
tests/interop/run.sh
