#!/usr/bin/env bash
# Installs what the simulator, the tests and the benchmark need from Debian:
# etcd (etcd-server), etcdctl (etcd-client), GNU time and openssl (the
# tests check that the keys the simulator writes load in OpenSSL), age and
# zstd (the backup tests read what they store with them). Rust (cargo) and,
# for the interop tests, Go must already be on the machine.
set -euo pipefail

need=()
command -v etcd >/dev/null 2>&1 || need+=(etcd-server)
command -v etcdctl >/dev/null 2>&1 || need+=(etcd-client)
[ -x /usr/bin/time ] || need+=(time)
command -v openssl >/dev/null 2>&1 || need+=(openssl)
command -v age >/dev/null 2>&1 || need+=(age)
command -v zstd >/dev/null 2>&1 || need+=(zstd)

if ((${#need[@]})); then
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  echo "installing ${need[*]} (apt-get)" >&2
  $sudo apt-get update
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y --no-install-recommends "${need[@]}"
fi

command -v cargo >/dev/null 2>&1 || { echo "cargo not found: install Rust (https://rustup.rs)" >&2; exit 1; }
