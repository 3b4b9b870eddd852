#!/usr/bin/env bash
# Installs cargo-nextest, the test runner of scripts/test.sh, from crates.io at
# a pinned version into a cache directory, and prints the path of its binary.
# A cached binary that reports the pinned version is used as it is.
#
#   scripts/nextest.sh                    # install if needed, print the path
#   NEXTEST_CACHE=DIR scripts/nextest.sh
#
# Built with --locked (nextest's own lock file) and without the self-update
# feature: the version is the one named here, changed by a commit. About
# 5 minutes on 2 cores the first time; the binary is ~20 MB.
set -euo pipefail

version="${NEXTEST_VERSION:-0.9.151}"
cache="${NEXTEST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/talos-client/cargo-nextest-$version}"
bin="$cache/bin/cargo-nextest"

die() {
	printf 'nextest.sh: %s\n' "$*" >&2
	exit 1
}

if [ -x "$bin" ] && "$bin" nextest --version 2>/dev/null | grep -q "^cargo-nextest $version\b"; then
	echo "$bin"
	exit 0
fi

command -v cargo >/dev/null 2>&1 || die "cargo is needed to build cargo-nextest $version"
echo "nextest.sh: building cargo-nextest $version (takes a few minutes)" >&2
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# A target directory of its own: the workspace's target keeps only the
# workspace's artefacts, and a failed build leaves nothing in the cache.
CARGO_TARGET_DIR="$work/target" cargo install --locked --quiet \
	--root "$work/root" --version "=$version" \
	--no-default-features --features default-no-update cargo-nextest >&2 ||
	die "could not build cargo-nextest $version from crates.io"
mkdir -p "$cache/bin"
mv "$work/root/bin/cargo-nextest" "$bin.tmp"
mv "$bin.tmp" "$bin"
"$bin" nextest --version 2>/dev/null | grep -q "^cargo-nextest $version\b" ||
	die "$bin does not report cargo-nextest $version"
echo "$bin"
