# The Linux platforms upstream ships images for, and what builds and runs each of them here.
# Sourced by linux-static.sh and images.sh.

declare -A rust_target=(
    [amd64]=x86_64-unknown-linux-musl
    [arm64]=aarch64-unknown-linux-musl
    [armv7]=armv7-unknown-linux-musleabihf
    [ppc64le]=powerpc64le-unknown-linux-musl
    [s390x]=s390x-unknown-linux-musl
)
# zig's names of the same targets, for its clang and its musl.
declare -A zig_target=(
    [amd64]=x86_64-linux-musl
    [arm64]=aarch64-linux-musl
    [armv7]=arm-linux-musleabihf
    [ppc64le]=powerpc64le-linux-musl
    [s390x]=s390x-linux-musl
)
# What runs a binary of the platform on this (amd64) machine; empty: natively.
declare -A qemu=(
    [amd64]=
    [arm64]=qemu-aarch64-static
    [armv7]=qemu-arm-static
    [ppc64le]=qemu-ppc64le-static
    [s390x]=qemu-s390x-static
)
declare -A oci_platform=(
    [amd64]=linux/amd64
    [arm64]=linux/arm64
    [armv7]=linux/arm/v7
    [ppc64le]=linux/ppc64le
    [s390x]=linux/s390x
)
linux_platforms=(amd64 arm64 armv7 ppc64le s390x)

# The platform a command-line word names: Docker's spelling, or Rust's architecture name.
platform_name() {
    case "$1" in
        x86_64) echo amd64 ;;
        aarch64) echo arm64 ;;
        arm | armv7l) echo armv7 ;;
        powerpc64le) echo ppc64le ;;
        *) echo "$1" ;;
    esac
}

# Replaces `platforms` with the platforms named on the command line, if any; an unknown name
# (one `rust_target` lacks) ends the script with status 2.
select_platforms() {
    (($#)) || return 0
    platforms=()
    local name
    for name in "$@"; do
        name=$(platform_name "$name")
        [ -n "${rust_target[$name]:-}" ] || { echo "unknown platform $name" >&2; exit 2; }
        platforms+=("$name")
    done
}
