#!/usr/bin/env bash
# Fuzzing of the parsers and renderers with cargo-fuzz (libFuzzer); see fuzz/README.md.
#
#   scripts/fuzz.sh build                     compile every target (sanitizer build)
#   scripts/fuzz.sh run [SECONDS] [TARGET…]   fuzz the targets one after another (default:
#                                             all, 600 s each), niced; logs in fuzz/logs/
#   scripts/fuzz.sh ci                        compile every target without cargo-fuzz or
#                                             sanitizers, from the committed lock file
#
# cargo-fuzz needs nightly compiler flags: the stable toolchain is used with RUSTC_BOOTSTRAP=1.
set -euo pipefail
script="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
cd "$(dirname "$0")/../fuzz"

ensure_cargo_fuzz() {
    if ! cargo fuzz --version >/dev/null 2>&1; then
        cargo install cargo-fuzz --locked
    fi
}

targets() {
    sed -n 's/^name = "\(.*\)"$/\1/p' Cargo.toml | grep -v '^csi-sidecars-fuzz$'
}

case "${1:-}" in
build)
    ensure_cargo_fuzz
    RUSTC_BOOTSTRAP=1 cargo fuzz build
    ;;
ci)
    # Proves that the targets compile against the crates' current APIs; libFuzzer still
    # links, without coverage instrumentation. The workspace's target directory and dev
    # profile (as the caller's environment sets it) let it reuse most of what
    # `cargo test --workspace` compiled.
    CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/../target}" cargo build --locked --bins
    ;;
run)
    ensure_cargo_fuzz
    seconds="${2:-600}"
    shift $(($# < 2 ? $# : 2))
    if [ "$#" -eq 0 ]; then
        mapfile -t selected < <(targets)
    else
        selected=("$@")
    fi
    mkdir -p logs
    status=0
    for target in "${selected[@]}"; do
        echo "== $target ($seconds s)"
        # One process, niced: the machine is shared with builds.
        if ! RUSTC_BOOTSTRAP=1 nice -n 10 cargo fuzz run "$target" -- \
            -max_total_time="$seconds" -print_final_stats=1 >"logs/$target.log" 2>&1; then
            echo "$target: FAILED, see fuzz/logs/$target.log and fuzz/artifacts/$target/"
            status=1
        fi
        grep -E '^#[0-9]+[[:space:]]+DONE|^stat::(number_of_executed_units|average_exec_per_sec)' \
            "logs/$target.log" || true
    done
    exit "$status"
    ;;
*)
    sed -n '2,10p' "$script" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
