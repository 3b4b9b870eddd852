#!/usr/bin/env bash
# Builds the kube-apiserver that talos-sim runs on each simulated control-plane
# node, from the Go module proxy, into a cache directory, and prints its path.
# A cached binary that reports the pinned version is used as it is.
#
#   scripts/kube-apiserver.sh            # build if needed, print the path
#   KUBE_APISERVER_CACHE=DIR scripts/kube-apiserver.sh
#
# The Kubernetes module cannot be built straight from the proxy: its go.mod
# points every k8s.io/* staging module at ./staging, which the module zip
# leaves out. A copy of the module with those replaces dropped and each
# staging module required at the matching v0 release builds as published.
# About 4 minutes on 2 cores; the binary is ~150 MB.
set -euo pipefail

version="${KUBE_VERSION:-v1.34.4}"
staging="v0.${version#v1.}"
cache="${KUBE_APISERVER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/talos-client/kube-apiserver-$version}"
bin="$cache/kube-apiserver"

die() {
	printf 'kube-apiserver.sh: %s\n' "$*" >&2
	exit 1
}

if [ -x "$bin" ] && "$bin" --version 2>/dev/null | grep -qx "Kubernetes $version"; then
	echo "$bin"
	exit 0
fi

command -v go >/dev/null 2>&1 || die "Go is needed to build kube-apiserver $version ('go' is not on PATH)"
export GOTOOLCHAIN=local GOFLAGS=-mod=mod GOWORK=off

src="$(go mod download -json "k8s.io/kubernetes@$version" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
[ -n "$src" ] && [ -d "$src" ] || die "could not download k8s.io/kubernetes@$version from the Go module proxy ($(go env GOPROXY))"

work="$(mktemp -d)"
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT
echo "kube-apiserver.sh: building kube-apiserver $version (takes a few minutes)" >&2
cp -r "$src/." "$work/"
chmod -R u+w "$work"
rm -rf "$work/staging" "$work/vendor" "$work/go.work" "$work/go.work.sum"
sed -i -e '/^[[:space:]]*k8s\.io\/[^ ]* => \.\/staging\//d' \
	-e "s#^\([[:space:]]*k8s\.io/[^ ]*\) v0\.0\.0\$#\1 $staging#" "$work/go.mod"
mkdir -p "$cache"
(
	cd "$work"
	go build -trimpath \
		-ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$version -X k8s.io/client-go/pkg/version.gitVersion=$version" \
		-o "$bin.tmp" ./cmd/kube-apiserver
)
mv "$bin.tmp" "$bin"
"$bin" --version | grep -qx "Kubernetes $version" || die "$bin does not report Kubernetes $version"
echo "$bin"
