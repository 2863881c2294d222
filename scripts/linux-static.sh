#!/usr/bin/env bash
# Builds static (musl, no dynamic loader) Linux release binaries of the four sidecars and the
# multi-call binary for the platforms upstream ships images for, then checks each platform's
# binaries under qemu-user: every binary answers --help, and the livenessprobe and the
# node-driver-registrar talk to the mock driver and a kubelet-like client over unix sockets
# (testkit/tests/foreign.rs).
#
#   scripts/linux-static.sh                  every platform
#   scripts/linux-static.sh aarch64 s390x    some of them (amd64 arm64 armv7 ppc64le s390x, or
#                                            the Rust architecture names)
#
# With STATIC_QUICK=1 (what CI runs) the same binaries are built with the quick-release profile
# (no optimisation, no LTO): minutes instead of tens of minutes per platform, for checking that
# the cross-build works and that the binaries behave on their architecture, not for shipping.
# Each platform's quick build is deleted once checked, to keep CI's disk use to one platform.
#
# Binaries end up in target/static/<rust target>/release/. Uses Debian's rustc-web toolchain
# (std built for the target with -Zbuild-std, as the Windows script does) and zig (from PyPI's
# `ziglang`, in a virtual environment under target/static) as C compiler and linker with its own
# musl for every architecture. Installs what it needs when missing.
set -euo pipefail
cd "$(dirname "$0")/.."

source scripts/platforms.sh
source scripts/released.sh
platforms=("${linux_platforms[@]}")
select_platforms "$@"

packages=(rustc-web cargo-web rust-web-src qemu-user-static python3-venv)
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

work="$PWD/target/static"
profile=release
if [ "${STATIC_QUICK:-}" = 1 ]; then profile=quick-release; fi
# Pinned: zig's clang and musl end up in the binaries, and the images are to be reproducible.
zig_version=0.17.1
venv="$work/zig"
if [ "$("$venv/bin/python" -m ziglang version 2>/dev/null)" != "$zig_version" ]; then
    echo "installing zig into $venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --no-cache-dir "ziglang==$zig_version"
fi
echo "zig $("$venv/bin/python" -m ziglang version)"

# The mock driver and the test run natively; build them first with the normal toolchain, as the
# whole workspace's tests (reused as they are; see prometheus-test.sh).
cargo test --workspace --no-run --locked

# Scoped to this script: the nightly switch that -Zbuild-std needs, and Debian's toolchain.
export RUSTC_BOOTSTRAP=1
export RUSTC=/usr/bin/rustc RUSTDOC=/usr/bin/rustdoc
export CARGO_TARGET_DIR="$work"
# zig supplies the C runtime objects and musl: rustc must not add the self-contained ones it
# would look for next to a prebuilt std.
export RUSTFLAGS="-C link-self-contained=no -C target-feature=+crt-static"
binaries=("${released_binaries[@]}")
crates=()
for binary in "${binaries[@]}"; do crates+=(-p "${released_package[$binary]}"); done

for platform in "${platforms[@]}"; do
    target="${rust_target[$platform]}"
    wrapper="$work/bin/cc-$target"
    mkdir -p "$work/bin"
    # cc-rs adds the Rust triple as --target, which zig's clang does not parse: drop it.
    cat >"$wrapper" <<EOF
#!/bin/sh
for arg do
    shift
    case "\$arg" in --target=*) continue ;; esac
    set -- "\$@" "\$arg"
done
exec "$venv/bin/python" -m ziglang cc -target ${zig_target[$platform]} "\$@"
EOF
    chmod +x "$wrapper"
    upper=$(echo "$target" | tr 'a-z-' 'A-Z_')
    export "CARGO_TARGET_${upper}_LINKER=$wrapper"
    export "CC_${target//-/_}=$wrapper"
    echo "== $platform ($target)"
    /usr/bin/cargo build --locked --profile "$profile" -Zbuild-std=std,panic_abort --target "$target" \
        "${crates[@]}" --bins
    out="$work/$target/$profile"
    for binary in "${binaries[@]}"; do
        description=$(file -b "$out/$binary")
        case "$description" in
            *"statically linked"*) ;;
            *) echo "$binary for $platform is not static: $description" >&2; exit 1 ;;
        esac
        printf '%-28s %8s bytes  %s\n' "$binary" "$(stat -c %s "$out/$binary")" "${description%%,*}"
    done
    FOREIGN_BIN_DIR="$out" FOREIGN_RUNNER="${qemu[$platform]}" \
        env -u RUSTC -u RUSTDOC -u RUSTFLAGS -u RUSTC_BOOTSTRAP -u CARGO_TARGET_DIR \
        cargo test --workspace --locked --test foreign -- --test-threads=1
    if [ "$profile" = quick-release ]; then rm -rf "${out:?}"; fi
done
