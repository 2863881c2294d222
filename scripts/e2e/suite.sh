#!/usr/bin/env bash
# suite.sh: the storage e2e suite three times on the lab's real node: with upstream's sidecars,
# with ours (one binary each) and with ours all in one; then compare.py, test by test, with
# upstream's run as the baseline. Builds our release binaries first (cargo build --release).
#
# Env: LAB (required); SUBSET (default subset.txt beside this script; SUBSET= for prow.sh's whole
# focus); RUNS (default "upstream ours all-in-one"); what run.sh reads.
# Exit: 0 only when every test of every run passed; the comparison says whether ours differ.
set -uo pipefail
LAB=${LAB:?set LAB to the lab directory}
HERE=$(cd "$(dirname "$(readlink -f "$0")")" && pwd)
export SUBSET=${SUBSET-$HERE/subset.txt}
RUNS=${RUNS:-upstream ours all-in-one}
(cd "$HERE/../.." && cargo build --release -p external-provisioner -p external-attacher \
  -p external-resizer -p external-snapshotter -p node-driver-registrar -p livenessprobe \
  -p csi-sidecars) || exit 1
status=0
dirs=()
for run in $RUNS; do
  LAB=$LAB "$HERE/run.sh" "$run" || status=1
  dirs+=("$LAB/e2e/results/$run")
done
"$HERE/compare.py" "${dirs[@]}" || status=1
exit $status
