#!/usr/bin/env bash
# CI's share of the release images, cheap enough for every run: the image builder's tests with
# skopeo required (layouts for every platform built twice with equal digests, the amd64 image
# unpacked and a real sidecar binary started from it, every platform's image read by skopeo,
# SBOMs), then the licence, ban and source check. The static binaries for all platforms and
# their images are scripts/images.sh (tens of minutes per platform on two cores).
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v skopeo >/dev/null; then
    echo "installing skopeo"
    if [ "$(id -u)" != 0 ]; then sudo=sudo; else sudo=; fi
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends skopeo
fi

# A real sidecar in the image: the native livenessprobe, which the workspace tests built already
# (selected as the whole workspace, so that cargo reuses that build; see prometheus-test.sh).
cargo test --workspace --no-run --locked -q
IMAGE_TEST_BINARY="$PWD/target/debug/livenessprobe" IMAGE_TEST_REQUIRE_SKOPEO=1 \
    cargo test --workspace --test images --locked
bash scripts/deny.sh
