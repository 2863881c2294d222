#!/usr/bin/env bash
# Writes the fixture of an upstream sidecar's flags that csi-sidecars/tests/it/upstream_flags.rs
# compares ours with: the long flag names its `-h` prints (Go's flag package or pflag), one a
# line, sorted, under a header naming the binary and its version.
#
#   scripts/upstream-flags.sh DIR BINARY=TAG...
#
# DIR holds the upstream binaries, built from the tags given (`csi-attacher=v4.12.0`). The
# fixture of each lands in
# csi-sidecars/tests/fixtures/upstream-flags/BINARY.txt.
set -euo pipefail
cd "$(dirname "$0")/.."

if (($# < 2)); then
    echo "usage: $0 DIR BINARY=TAG..." >&2
    exit 2
fi
dir=$1
shift
out=csi-sidecars/tests/fixtures/upstream-flags
mkdir -p "$out"
for pair in "$@"; do
    binary=${pair%%=*} tag=${pair#*=}
    # Both parsers print the usage on -h; only the flag lines matter. Go's flag lists
    # `  -name`, pflag `  -v, --name` or `      --name`.
    usage=$("$dir/$binary" -h 2>&1 || true)
    names=$(sed -nE 's/^  (-[A-Za-z0-9], |    )?--?([A-Za-z0-9][A-Za-z0-9._-]*).*/\2/p' <<<"$usage" |
        LC_ALL=C sort -u)
    if [[ -z "$names" ]]; then
        echo "$binary -h printed no flags" >&2
        exit 1
    fi
    {
        echo "# The flags upstream's $binary $tag lists in its -h output (long names, sorted)."
        echo "# Written by scripts/upstream-flags.sh; compared with ours by"
        echo "# csi-sidecars/tests/it/upstream_flags.rs."
        echo "$names"
    } >"$out/$binary.txt"
    echo "$out/$binary.txt: $(wc -l <<<"$names") flags"
done
