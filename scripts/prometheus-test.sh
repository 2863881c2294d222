#!/usr/bin/env bash
# Runs the Prometheus test (testkit/tests/prometheus.rs): `promtool check metrics` on every
# sidecar's /metrics, then a real Prometheus server scraping the sandbox's sidecars.
# Installs Debian's `prometheus` package (prometheus and promtool) when either is missing.
#
#   scripts/prometheus-test.sh
#
# The test starts its own Prometheus on a free 127.0.0.1 port; a daemon the package may have
# started on its default port is neither needed nor used.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null; then
    echo "installing prometheus"
    if [ "$(id -u)" != 0 ]; then sudo=sudo; else sudo=; fi
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends prometheus
fi
prometheus --version 2>&1 | head -n 1

# The test runs the sidecar binaries of target/debug. Built, like the test, as part of the whole
# workspace's tests: cargo resolves features per selection of packages, so `-p testkit` or
# `--bins` would compile every dependency once more (a gigabyte) instead of reusing that build.
cargo test --workspace --no-run --locked
# With PROMETHEUS and PROMTOOL set the test cannot skip: a missing tool or sidecar fails it.
PROMETHEUS="$(command -v prometheus)" PROMTOOL="$(command -v promtool)" \
    cargo test --workspace --test prometheus --locked -- --nocapture
