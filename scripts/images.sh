#!/usr/bin/env bash
# Builds the release images without a container engine: static Linux binaries for each
# platform (scripts/linux-static.sh, which also runs them under qemu-user), optionally the
# Windows binaries (scripts/windows-test.sh release), then per image an OCI image layout with a
# multi-arch index (image-builder), a CycloneDX SBOM per platform, `skopeo inspect` of the index
# and of every platform's image, and a run of every Linux image's unpacked entrypoint with
# --help (natively or under qemu-user). Ends with a table of binary and image sizes.
#
#   scripts/images.sh                        every Linux platform and Windows
#   scripts/images.sh amd64 arm64            some platforms (amd64 arm64 armv7 ppc64le s390x
#                                            windows)
#   IMAGES_SKIP_BUILD=1 scripts/images.sh …  reuse the binaries built before
#
# Output under target/images/: <image>/ (OCI layouts, tag = version), sbom/<image>/<platform>.cdx.json,
# context/<os>/<arch>[/<variant>]/ (the stripped binaries: a build context for the Dockerfiles
# with buildx), sizes.tsv.
set -euo pipefail
cd "$(dirname "$0")/.."

source scripts/platforms.sh
source scripts/released.sh
rust_target[windows]=x86_64-pc-windows-gnu
oci_platform[windows]=windows/amd64
# An image per released binary, named after it.
images=("${released_binaries[@]}")

platforms=("${linux_platforms[@]}" windows)
select_platforms "$@"
linux=()
windows=
for platform in "${platforms[@]}"; do
    if [ "$platform" = windows ]; then windows=1; else linux+=("$platform"); fi
done

if ! command -v skopeo >/dev/null; then
    echo "installing skopeo"
    if [ "$(id -u)" != 0 ]; then sudo=sudo; else sudo=; fi
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends skopeo
fi

if [ -z "${IMAGES_SKIP_BUILD:-}" ]; then
    if ((${#linux[@]})); then bash scripts/linux-static.sh "${linux[@]}"; fi
    if [ -n "$windows" ]; then bash scripts/windows-test.sh release; fi
fi

cargo build --locked -q -p image-builder
builder="$PWD/target/debug/image-builder"

# Everything in the images derives from the commit, so that a rebuild gives the same digests.
revision=$(git rev-parse HEAD)
export SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct)}"
workspace_version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' Cargo.toml)
version="${IMAGE_VERSION:-v$workspace_version}"
source=$(sed -n '/^\[workspace.package\]/,/^\[/s/^repository = "\(.*\)"/\1/p' Cargo.toml)
rustc_version=$(/usr/bin/rustc -V | awk '{print $2}')
# The static Linux binaries carry the musl that zig links in: the SBOMs name its version.
musl_version=
if ((${#linux[@]})); then
    zig_package=$(target/static/zig/bin/python -c 'import os, ziglang; print(os.path.dirname(ziglang.__file__))')
    musl_version=$(sed -n 's/^#define VERSION "\(.*\)"$/\1/p' "$zig_package/lib/libc/musl/src/internal/version.h")
    [ -n "$musl_version" ] || { echo "cannot tell the version of zig's musl" >&2; exit 1; }
fi

out="$PWD/target/images"
context="$out/context"
mkdir -p "$out"

# Stripped copies in a buildx-shaped context: <os>/<arch>[/<variant>]/<binary>. The static
# Linux binaries come out of the release build without a symbol table already; the Windows
# ones carry one.
for platform in "${platforms[@]}"; do
    dir="$context/${oci_platform[$platform]}"
    mkdir -p "$dir"
    if [ "$platform" = windows ]; then
        release="target/windows/${rust_target[$platform]}/release"
        for image in "${images[@]}"; do
            x86_64-w64-mingw32-strip -o "$dir/$image.exe" "$release/$image.exe"
        done
    else
        release="target/static/${rust_target[$platform]}/release"
        for image in "${images[@]}"; do
            case "$(file -b "$release/$image")" in
                *", stripped"*) ;;
                *) echo "$release/$image has a symbol table" >&2; exit 1 ;;
            esac
            cp "$release/$image" "$dir/$image"
            chmod 0755 "$dir/$image"
        done
    fi
done

# The Linux Dockerfiles copy from this context: check that each finds its binary.
for dockerfile in */Dockerfile; do
    for platform in "${linux[@]}"; do
        for source in $(awk '$1 == "COPY" {print $2}' "$dockerfile"); do
            file="$context/${source//\$\{TARGETPLATFORM\}/${oci_platform[$platform]}}"
            [ -x "$file" ] || { echo "$dockerfile copies $source: $file is missing" >&2; exit 1; }
        done
    done
done

sizes="$out/sizes.tsv"
printf 'image\tplatform\tbinary bytes (stripped)\tlayer bytes (gzip)\n' >"$sizes"
for image in "${images[@]}"; do
    inputs=()
    for platform in "${platforms[@]}"; do
        binary="$context/${oci_platform[$platform]}/$image"
        [ "$platform" = windows ] && binary="$binary.exe"
        inputs+=("${oci_platform[$platform]}=$binary")
    done
    aliases=()
    if [ "$image" = csi-sidecars ]; then
        for sidecar in "${released_binaries[@]}"; do
            [ "$sidecar" = csi-sidecars ] || aliases+=(--alias "$sidecar")
        done
    fi
    layout="$out/$image"
    echo "== $image"
    report=$("$builder" build --out "$layout" --name "$image" "${aliases[@]}" --tag "$version" \
        --version "$version" --revision "$revision" --source "$source" "${inputs[@]}")
    echo "$report"
    echo "$report" | awk -v image="$image" -F '\t' '$1 != "index" {print image "\t" $1 "\t" $3 "\t" $4}' >>"$sizes"

    reference="oci:$layout:$version"
    count=$(skopeo inspect --raw "$reference" | python3 -c 'import json, sys; print(len(json.load(sys.stdin)["manifests"]))')
    [ "$count" = "${#platforms[@]}" ] || { echo "$image: index lists $count images" >&2; exit 1; }
    for platform in "${platforms[@]}"; do
        IFS=/ read -r os arch variant <<<"${oci_platform[$platform]}"
        args=(--override-os "$os" --override-arch "$arch")
        [ -n "$variant" ] && args+=(--override-variant "$variant")
        skopeo inspect "${args[@]}" "$reference" | python3 -c '
import json, sys
image = json.load(sys.stdin)
want = sys.argv[1:3]
assert [image["Os"], image["Architecture"]] == want, (image["Os"], image["Architecture"], want)
assert image["Labels"]["org.opencontainers.image.revision"] == sys.argv[3]
' "$os" "$arch" "$revision"
        echo "skopeo inspect: ${oci_platform[$platform]} ok"

        mkdir -p "$out/sbom/$image"
        components=(--component "std@$rustc_version")
        [ "$platform" != windows ] && components+=(--component "musl@$musl_version")
        "$builder" sbom --package "${released_package[$image]}" --binary "$image" \
            --target "${rust_target[$platform]}" "${components[@]}" \
            --out "$out/sbom/$image/${oci_platform[$platform]//\//-}.cdx.json"

        # Unpack the image and start its entrypoint, as a container runtime would.
        [ "$platform" = windows ] && continue
        rootfs=$(mktemp -d)
        entrypoint=$("$builder" unpack --layout "$layout" --tag "$version" \
            --platform "${oci_platform[$platform]}" --to "$rootfs" | python3 -c 'import json, sys; print(json.load(sys.stdin)[0])')
        runner="${qemu[$platform]}"
        ${runner:+$runner} "$rootfs$entrypoint" --help >/dev/null
        if [ "$image" = csi-sidecars ]; then
            # A link named after a sidecar runs that sidecar.
            help=$(${runner:+$runner} "$rootfs/csi-provisioner" --help)
            grep -q -- --csi-address <<<"$help"
        fi
        rm -rf "$rootfs"
        echo "$image ${oci_platform[$platform]}: $entrypoint --help runs${runner:+ under $runner}"
    done
done

echo
echo "images in $out (tag $version, revision $revision), SBOMs in $out/sbom"
awk -F '\t' '{printf "%-26s %-14s %24s %20s\n", $1, $2, $3, $4}' "$sizes"
