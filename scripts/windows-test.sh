#!/usr/bin/env bash
# Cross-compiles every binary for x86_64-pc-windows-gnu and runs the tests of the crates with
# Windows code paths under Wine. Installs what it needs from Debian's packages when missing.
#
#   scripts/windows-test.sh            build all binaries, run the tests, build release binaries
#   scripts/windows-test.sh build      only build (debug) all binaries
#   scripts/windows-test.sh test       build (debug) all binaries and run the tests
#   scripts/windows-test.sh release    only build the release binaries and check what the
#                                      Dockerfile.windows files copy (for scripts/images.sh)
#
# With WINDOWS_QUICK=1 (what CI runs) the release binaries are built with the quick-release
# profile (no optimisation, no LTO), which checks the same and takes a fraction of the time.
#
# Uses Debian's rustc-web toolchain (it can build std for the target with -Zbuild-std), never
# the rustup toolchain first in PATH.
set -euo pipefail
cd "$(dirname "$0")/.."

target=x86_64-pc-windows-gnu
cargo_bin=/usr/bin/cargo
packages=(rustc-web cargo-web rust-web-src gcc-mingw-w64-x86-64 wine wine64)
# Crates whose Windows code paths are exercised by their tests.
test_crates=(csi-proto sidecar-kit testkit livenessprobe node-driver-registrar)

missing=()
for package in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if ((${#missing[@]})); then
    echo "installing ${missing[*]}"
    if [ "$(id -u)" != 0 ]; then sudo=sudo; else sudo=; fi
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

export WINEPREFIX="${WINEPREFIX:-$PWD/target/windows/wineprefix}"
export WINEDEBUG="${WINEDEBUG:--all}"
export WINEDLLOVERRIDES="${WINEDLLOVERRIDES:-mscoree,mshtml=}"
if [ ! -d "$WINEPREFIX/drive_c/windows/system32" ]; then
    echo "preparing the Wine prefix $WINEPREFIX"
    mkdir -p "$WINEPREFIX"
    wineboot -i >/dev/null 2>&1
    wineserver -w
fi
stand_in="$WINEPREFIX/drive_c/windows/system32/bcryptprimitives.dll"
if [ ! -f "$stand_in" ]; then
    x86_64-w64-mingw32-gcc -shared -O2 -o "$stand_in" \
        scripts/windows/bcryptprimitives.c scripts/windows/bcryptprimitives.def -ladvapi32
fi

# Scoped to this script: the nightly switch that -Zbuild-std needs.
export RUSTC_BOOTSTRAP=1
export RUSTC=/usr/bin/rustc RUSTDOC=/usr/bin/rustdoc
export CARGO_TARGET_DIR="$PWD/target/windows"
export CARGO_TARGET_X86_64_PC_WINDOWS_GNU_LINKER=x86_64-w64-mingw32-gcc
export CARGO_TARGET_X86_64_PC_WINDOWS_GNU_RUNNER=wine
export CARGO_PROFILE_DEV_DEBUG="${CARGO_PROFILE_DEV_DEBUG:-line-tables-only}"
build_std=(-Zbuild-std=std,panic_unwind,test --target "$target")
# The release profile aborts on panic.
build_std_release=(-Zbuild-std=std,panic_abort --target "$target")
profile=release
if [ "${WINDOWS_QUICK:-}" = 1 ]; then profile=quick-release; fi

if [ "${1:-}" != release ]; then
    "$cargo_bin" build --locked "${build_std[@]}" --workspace --bins
    if [ "${1:-}" = build ]; then
        exit 0
    fi

    test_args=()
    for crate in "${test_crates[@]}"; do test_args+=(-p "$crate"); done
    "$cargo_bin" test --locked "${build_std[@]}" "${test_args[@]}"
    if [ "${1:-}" = test ]; then
        exit 0
    fi
fi

"$cargo_bin" build --locked --profile "$profile" "${build_std_release[@]}" --workspace --bins
release="$CARGO_TARGET_DIR/$target/$profile"
echo "release binaries for $target:"
for exe in "$release/"*.exe; do
    stripped="$CARGO_TARGET_DIR/$(basename "$exe" .exe)-stripped.exe"
    x86_64-w64-mingw32-strip -o "$stripped" "$exe"
    printf '  %-32s %9d bytes, stripped %9d bytes; imports: %s\n' "$(basename "$exe")" \
        "$(stat -c %s "$exe")" "$(stat -c %s "$stripped")" \
        "$(x86_64-w64-mingw32-objdump -p "$exe" | awk '/DLL Name:/ {print $3}' | sort -u | tr '\n' ' ')"
done

# The Windows images cannot be built here (no Docker engine); check what they copy instead:
# every binary exists and starts.
for dockerfile in */Dockerfile.windows; do
    for exe in $(awk '$1 == "COPY" {print $2}' "$dockerfile"); do
        if [ ! -f "$release/$exe" ]; then
            echo "$dockerfile copies $exe, which the release build did not produce" >&2
            exit 1
        fi
        wine "$release/$exe" --help >/dev/null
        echo "$dockerfile: $exe starts under Wine"
    done
done
