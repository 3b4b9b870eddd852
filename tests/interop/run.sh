#!/usr/bin/env bash
# Interop tests against upstream Talos's own Go code: vets and builds the Go
# programs of this module (pinned github.com/siderolabs/talos/pkg/machinery,
# see go.mod and proto/README.md) into tests/interop/bin, then runs the Rust
# side, `cargo test -p talos-test-support --features interop --test interop`, with them. Extra arguments go to cargo
# test (e.g. `-- --nocapture`).
#
# It needs Go (the version in go.mod or newer) and, unless the Go module
# cache already holds every module in go.sum, the Go module proxy. Missing
# either is an error: these tests fail, they never skip.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"

die() {
	printf 'interop: %s\n' "$*" >&2
	exit 1
}

# Use the installed toolchain only (never download another one) and never
# rewrite go.mod or go.sum.
export GOTOOLCHAIN=local
export GOFLAGS=-mod=readonly

want_go="$(sed -n 's/^go //p' "$here/go.mod")"
command -v go >/dev/null 2>&1 ||
	die "the Go toolchain is required (go $want_go or newer), but 'go' is not on PATH"
command -v cargo >/dev/null 2>&1 || die "cargo is required, but it is not on PATH"

cd "$here"
echo "interop: $(go version), module proxy $(go env GOPROXY)"

log="$(mktemp)"
trap 'rm -f "$log"' EXIT
if ! go mod download >"$log" 2>&1; then
	cat "$log" >&2
	die "cannot download the Go modules pinned in go.sum: the module proxy ($(go env GOPROXY)) is unreachable or refused them, and the module cache ($(go env GOMODCACHE)) does not hold them. The interop tests need them and do not skip."
fi
go mod verify

unformatted="$(gofmt -l .)"
[ -z "$unformatted" ] || die "gofmt would change: $unformatted"
go vet ./...

mkdir -p "$here/bin"
go build -o "$here/bin/" ./cmd/...
echo "interop: built $(ls "$here/bin" | tr '\n' ' ')against $(go list -m -f '{{.Path}} {{.Version}}' github.com/siderolabs/talos/pkg/machinery)"

cd "$root"
INTEROP_BIN_DIR="$here/bin" cargo test --locked -p talos-test-support --features interop --test interop "$@"
