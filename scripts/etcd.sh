#!/usr/bin/env bash
# Builds the etcd that talos-sim runs on each simulated control-plane node,
# with the etcdutl and etcdctl of the same release, from the Go module proxy
# into a cache directory, and prints the path of the etcd binary (etcdutl and
# etcdctl sit beside it). A cached build that reports the version is used as
# it is.
#
#   scripts/etcd.sh v3.6.12        # what Talos 1.13.9 runs (DefaultEtcdVersion)
#   scripts/etcd.sh v3.7.1         # what Talos 1.14 runs
#   scripts/etcd.sh all            # both, one path a line (1.13.9's first)
#   ETCD_CACHE=DIR scripts/etcd.sh v3.7.1
#
# talos-sim finds the builds in the same cache by itself (see
# docs/talos-sim.md): the demo and the test commands run this script first.
#
# etcd 3.5 and later are several Go modules in one repository (server/ holds
# the etcd binary, etcdctl/ and etcdutl/ the tools); each module's go.mod
# points its siblings at ../api, ../server and so on, which a module copy
# from the proxy lacks. A copy with those replaces dropped and every sibling
# required at the release builds as published.
#
# The proxy this project builds from serves no etcdctl or etcdutl module at
# v3.6.12 (server, api, client and pkg are there). For that release the tools'
# command code is taken from the nearest published patch release, v3.6.11,
# and built against the v3.6.12 libraries (snapshot, backend, version): the
# file formats and the reported version are 3.6.12's.
# About a minute per binary on 2 cores; ~30 MB each.
set -euo pipefail

die() {
	printf 'etcd.sh: %s\n' "$*" >&2
	exit 1
}

[ $# -eq 1 ] || die "usage: scripts/etcd.sh VERSION|all (VERSION: v3.6.12 or v3.7.1)"
if [ "$1" = all ]; then
	"$0" v3.6.12
	"$0" v3.7.1
	exit 0
fi
version="v${1#v}"
case "$version" in
v3.6.12) tools_version=v3.6.11 ;;
v3.*.*) tools_version="$version" ;;
*) die "not an etcd release: $1 (expected e.g. v3.6.12)" ;;
esac

cache="${ETCD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/talos-client}/etcd-$version"
plain="${version#v}"

# reports BINARY: whether BINARY (etcd, etcdutl or etcdctl) says it is
# $version.
reports() {
	local arg=version
	[ "${1##*/}" = etcd ] && arg=--version
	local out
	# Read all of it first: grep -q stops reading at its match, and the
	# binary's SIGPIPE would fail the pipeline (pipefail).
	[ -x "$1" ] && out="$("$1" "$arg" 2>/dev/null)" &&
		grep -qiE "^(etcd|etcdctl|etcdutl) version: $plain\$" <<<"$out"
}

if reports "$cache/etcd" && reports "$cache/etcdutl" && reports "$cache/etcdctl"; then
	echo "$cache/etcd"
	exit 0
fi

command -v go >/dev/null 2>&1 || die "Go is needed to build etcd $version ('go' is not on PATH)"
export GOTOOLCHAIN=local GOFLAGS=-mod=mod GOWORK=off

# module_dir MODULE VERSION: the module's unpacked copy in the module cache.
module_dir() {
	local dir
	dir="$(go mod download -json "$1@$2" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
	[ -n "$dir" ] && [ -d "$dir" ] || die "could not download $1@$2 from the Go module proxy ($(go env GOPROXY))"
	echo "$dir"
}

work="$(mktemp -d)"
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT

# build NAME MODULE MODULE_VERSION PACKAGE: builds one binary from a copy of
# MODULE with its sibling modules required at $version.
build() {
	local name="$1" module="$2" module_version="$3" package="$4" dir
	dir="$work/$name"
	mkdir -p "$dir"
	cp -r "$(module_dir "$module" "$module_version")/." "$dir/"
	chmod -R u+w "$dir"
	sed -i -e '/^[[:space:]]*go\.etcd\.io\/etcd\/[^ ]* => \.\.\//d' \
		-e "s#^\([[:space:]]*go\.etcd\.io/etcd/[a-z/]*v3\) v3\.[0-9]*\.[0-9]*\$#\1 $version#" "$dir/go.mod"
	rm -f "$dir/go.sum"
	echo "etcd.sh: building $name $version" >&2
	(
		cd "$dir"
		go mod tidy >/dev/null 2>&1 || true
		go build -trimpath -ldflags "-s -w" -o "$cache/$name.tmp" "$package"
	)
	mv "$cache/$name.tmp" "$cache/$name"
}

mkdir -p "$cache"
build etcd go.etcd.io/etcd/server/v3 "$version" .
build etcdutl go.etcd.io/etcd/etcdutl/v3 "$tools_version" .
build etcdctl go.etcd.io/etcd/etcdctl/v3 "$tools_version" .
for b in etcd etcdutl etcdctl; do
	reports "$cache/$b" || die "$cache/$b does not report version $plain"
done
echo "$cache/etcd"
