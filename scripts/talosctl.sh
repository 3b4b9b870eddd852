#!/usr/bin/env bash
# Builds the official talosctl from upstream source (the Go module proxy's
# github.com/siderolabs/talos) into a cache directory and prints its path.
# A cached binary that reports the pinned version is used as it is.
#
#   scripts/talosctl.sh                 # v1.13.9, build if needed, print the path
#   TALOSCTL_VERSION=v1.14.0-rc.1 scripts/talosctl.sh
#   TALOSCTL_CACHE=DIR scripts/talosctl.sh
#
# The Talos module cannot be built straight from the proxy: its go.mod
# points github.com/siderolabs/talos/pkg/machinery at ./pkg/machinery, a
# nested module the module zip leaves out. A copy of the module with that
# replace dropped and pkg/machinery required at the same release builds as
# published (the other replaces name published forks and stay).
#
# The module proxy this project builds from lacks three of v1.13.9's
# dependencies at the versions its go.mod pins; each is taken at the
# nearest release the proxy serves (none is on the path of the commands
# tests/interop/talosctl.sh runs, except etcdutl's snapshot status, which
# is the same code in both patch releases):
#   github.com/siderolabs/go-kubernetes v0.2.38 -> v0.2.39
#   go.etcd.io/etcd/etcdutl/v3 v3.6.12          -> v3.6.11
#   github.com/smira/containerd/v2 (a fork of containerd v2.2.3, not on the
#     proxy at all) -> github.com/containerd/containerd/v2 v2.2.8
# A few minutes on 2 cores; the binary is ~90 MB.
set -euo pipefail

version="${TALOSCTL_VERSION:-v1.13.9}"
cache="${TALOSCTL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/talos-client/talosctl-$version}"
bin="$cache/talosctl"

die() {
	printf 'talosctl.sh: %s\n' "$*" >&2
	exit 1
}

# reports: whether the cached binary says it is $version (its output read
# whole before grep: grep -q's early exit would SIGPIPE it under pipefail).
reports() {
	local out
	[ -x "$bin" ] && out="$("$bin" version --client --short 2>/dev/null)" && grep -q "Talos $version\$" <<<"$out"
}

if reports; then
	echo "$bin"
	exit 0
fi

command -v go >/dev/null 2>&1 || die "Go is needed to build talosctl $version ('go' is not on PATH)"
export GOTOOLCHAIN=local GOFLAGS=-mod=mod GOWORK=off

src="$(go mod download -json "github.com/siderolabs/talos@$version" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
[ -n "$src" ] && [ -d "$src" ] || die "could not download github.com/siderolabs/talos@$version from the Go module proxy ($(go env GOPROXY))"

work="$(mktemp -d)"
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT
echo "talosctl.sh: building talosctl $version (takes a few minutes)" >&2
cp -r "$src/." "$work/"
chmod -R u+w "$work"
sed -i -e '/^[[:space:]]*github\.com\/siderolabs\/talos\/pkg\/machinery => \.\/pkg\/machinery/d' "$work/go.mod"
grep -q 'github.com/siderolabs/talos/pkg/machinery => ./' "$work/go.mod" &&
	die "the ./pkg/machinery replace is still in go.mod"
mkdir -p "$cache"
(
	cd "$work"
	go mod edit -require="github.com/siderolabs/talos/pkg/machinery@$version"
	if [ "$version" = v1.13.9 ]; then
		go mod edit \
			-dropreplace=github.com/containerd/containerd/v2 \
			-require=github.com/containerd/containerd/v2@v2.2.8 \
			-require=github.com/siderolabs/go-kubernetes@v0.2.39 \
			-replace=go.etcd.io/etcd/etcdutl/v3=go.etcd.io/etcd/etcdutl/v3@v3.6.11
	fi
	go build -trimpath \
		-ldflags "-s -w" \
		-o "$bin.tmp" ./cmd/talosctl
)
mv "$bin.tmp" "$bin"
reports || die "$bin does not report $version: $("$bin" version --client --short 2>&1)"
echo "$bin"
