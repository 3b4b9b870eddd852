#!/usr/bin/env bash
# Interop tests against upstream Talos's own Go code: checks and builds the
# Go programs of this module (build.sh), then runs the Rust side,
# `cargo test -p talos-test-support --features interop --test interop`, with
# them. Extra arguments go to cargo test (e.g. `-- --nocapture`).
# scripts/test.sh runs the same tests in its workspace run instead.
#
# It needs Go (the version in go.mod or newer) and, unless the Go module
# cache already holds every module in go.sum, the Go module proxy. Missing
# either is an error: these tests fail, they never skip.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"

command -v cargo >/dev/null 2>&1 || { echo "interop: cargo is required, but it is not on PATH" >&2; exit 1; }
bin="$("$here/build.sh")"
cd "$root"
INTEROP_BIN_DIR="$bin" cargo test --locked -p talos-test-support --features interop --test interop "$@"
