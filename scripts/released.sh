# The released binaries, read from the workspace: each package whose Cargo.toml says
# `[package.metadata.release] image = true` ships its binary as an image of the same name.
# Sourced by images.sh, linux-static.sh and manifests-test.sh; sets
#   released_package[<binary>]=<package>
#   released_binaries=(<binary> …)   in the workspace's order
declare -A released_package=()
released_binaries=()
while read -r package binary; do
    released_package[$binary]=$package
    released_binaries+=("$binary")
done < <(cargo metadata --no-deps --format-version 1 --locked | python3 -c '
import json, sys
for package in json.load(sys.stdin)["packages"]:
    if ((package.get("metadata") or {}).get("release") or {}).get("image"):
        for target in package["targets"]:
            if "bin" in target["kind"]:
                print(package["name"], target["name"])
')
if ((${#released_binaries[@]} == 0)); then
    echo "no released binaries found in the workspace" >&2
    exit 1
fi
