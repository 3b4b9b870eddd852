#!/usr/bin/env bash
# Checks and builds the Go programs of the interop tests (pinned
# github.com/siderolabs/talos/pkg/machinery, see go.mod and
# proto/README.md) into tests/interop/bin and prints that directory, which
# the Rust side reads from INTEROP_BIN_DIR. Used by run.sh and by
# scripts/test.sh, whose workspace run (--all-features turns on the
# `interop` feature of talos-test-support) runs the Rust side.
#
# It needs Go (the version in go.mod or newer) and, unless the Go module
# cache already holds every module in go.sum, the Go module proxy. Missing
# either is an error: these tests fail, they never skip.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

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

cd "$here"
echo "interop: $(go version), module proxy $(go env GOPROXY)" >&2

log="$(mktemp)"
trap 'rm -f "$log"' EXIT
if ! go mod download >"$log" 2>&1; then
	cat "$log" >&2
	die "cannot download the Go modules pinned in go.sum: the module proxy ($(go env GOPROXY)) is unreachable or refused them, and the module cache ($(go env GOMODCACHE)) does not hold them. The interop tests need them and do not skip."
fi
go mod verify >&2

unformatted="$(gofmt -l .)"
[ -z "$unformatted" ] || die "gofmt would change: $unformatted"
go vet ./... >&2

mkdir -p "$here/bin"
go build -o "$here/bin/" ./cmd/...
echo "interop: built $(ls "$here/bin" | tr '\n' ' ')against $(go list -m -f '{{.Path}} {{.Version}}' github.com/siderolabs/talos/pkg/machinery)" >&2
echo "$here/bin"
