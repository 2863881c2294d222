#!/usr/bin/env bash
# run.sh: runs Kubernetes' storage e2e suite (External.Storage, with hostpath's test-driver.yaml)
# against the lab's real node, with one set of CSI sidecars, as csi-release-tools' prow.sh runs
# its parallel job: focus External.Storage, skip [Serial], [Disruptive], [Feature:…] (alpha and
# feature-tagged) and [Feature:SELinux].
#
#   run.sh upstream      the lab's upstream sidecars
#   run.sh ours          ours, one binary each (OURS: the directory of our release binaries)
#   run.sh all-in-one    ours, the four controllers in one csi-sidecars process; the registrar
#                        and livenessprobe as their own binaries (they belong to other pods)
#
# JUnit goes to $LAB/e2e/results/<name>/ (emptied first); compare runs with compare.py. The
# exit status is the suite's: non-zero when a test failed.
#
# Env: LAB (the lab directory, required); OURS (default: the project's target/release);
#   FOCUS, SKIP (ginkgo regular expressions; defaults as above); SUBSET (a file of spec texts,
#   one a line, `#` comments: only those run, each matched whole, instead of FOCUS; e.g.
#   subset.txt beside this script); PROCS (ginkgo processes, default 3); TIMEOUT (default
#   3h); E2E_BIN (default $LAB/e2e/bin); STOP (binaries to stop once the CSI components are
#   up, e.g. csi-provisioner: the harness's own check, whose provisioning tests must then
#   fail); RESULTS_NAME (default the run's name).
set -euo pipefail
LAB=${LAB:?set LAB to the lab directory}
HERE=$(cd "$(dirname "$(readlink -f "$0")")" && pwd)
PROJECT=$(cd "$HERE/../.." && pwd)
OURS=${OURS:-$PROJECT/target/release}
E2E_BIN=${E2E_BIN:-$LAB/e2e/bin}
NAME=${1:?usage: run.sh upstream|ours|all-in-one}
FOCUS=${FOCUS:-External.Storage}
SKIP=${SKIP:-'\[Serial\]|\[Disruptive\]|\[Feature:|\[Feature:SELinux\]'}
PROCS=${PROCS:-3}
TIMEOUT=${TIMEOUT:-3h}
RESULTS=$LAB/e2e/results/${RESULTS_NAME:-$NAME}
KC=$LAB/kubeconfig
KUBECTL=$LAB/bin/kubectl
CSI_NS=${CSI_NS:-lab-csi}
DRIVER=hostpath.csi.k8s.io
TEST_DRIVER=$LAB/src/csi-driver-host-path/deploy/kubernetes-1.34/test-driver.yaml

log() { echo "[e2e $(date +%H:%M:%S)] $*"; }
die() { echo "[e2e $(date +%H:%M:%S)] ERROR: $*" >&2; exit 1; }
kc() { "$KUBECTL" --kubeconfig "$KC" "$@"; }

node_status=$("$HERE/node.sh" status 2>&1 || true)
grep -q "^kubelet: up" <<<"$node_status" || die "no real node: run $HERE/node.sh up"
[ -x "$E2E_BIN/e2e.test" ] && [ -x "$E2E_BIN/ginkgo" ] || die "no e2e.test or ginkgo: run $HERE/build.sh"
[ -f "$TEST_DRIVER" ] || die "no $TEST_DRIVER"

# hostpath as its deployment for this suite runs it: node expansion on (the lab turns it off).
export EXTRA_ARGS_hostpath="--disable-node-expansion=false"
SIDECARS="csi-provisioner csi-attacher csi-resizer csi-snapshotter csi-node-driver-registrar livenessprobe"

# A directory of binaries for start-csi.sh: the lab's, with ours for the sidecars.
ours_bin_dir() {
  local dir=$LAB/e2e/bins/$NAME b
  rm -rf "$dir"; mkdir -p "$dir"
  for b in hostpathplugin snapshot-controller csi-external-health-monitor-controller; do
    ln -s "$LAB/bin/$b" "$dir/$b"
  done
  for b in $SIDECARS; do
    [ -x "$OURS/$b" ] || die "no $OURS/$b: build our release binaries first (cargo build --release)"
    ln -s "$OURS/$b" "$dir/$b"
  done
  echo "$dir"
}

stop_pidfile() {
  local pidf=$LAB/run/$1.pid pid i
  [ -s "$pidf" ] || return 0
  pid=$(cat "$pidf")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid"
    for ((i = 0; i < 150; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$pidf"
}

# The all-in-one process runs as a ServiceAccount bound to the four controllers' roles.
all_in_one_kubeconfig() {
  local sa=csi-sidecars out=$LAB/run/kubeconfigs/csi-sidecars.kubeconfig r
  kc -n "$CSI_NS" get sa "$sa" >/dev/null 2>&1 || kc -n "$CSI_NS" create sa "$sa" >/dev/null
  for r in external-provisioner-runner external-attacher-runner external-resizer-runner external-snapshotter-runner; do
    kc get clusterrolebinding "$sa-$r" >/dev/null 2>&1 ||
      kc create clusterrolebinding "$sa-$r" --clusterrole="$r" --serviceaccount="$CSI_NS:$sa" >/dev/null
  done
  for r in external-provisioner-cfg external-attacher-cfg external-resizer-cfg external-snapshotter-leaderelection; do
    kc -n "$CSI_NS" get rolebinding "$sa-$r" >/dev/null 2>&1 ||
      kc -n "$CSI_NS" create rolebinding "$sa-$r" --role="$r" --serviceaccount="$CSI_NS:$sa" >/dev/null
  done
  "$LAB/make-sa-kubeconfig.sh" "$sa" "$CSI_NS" "$out" >/dev/null
  echo "$out"
}

start_all_in_one() {
  local kcfg sock=$LAB/run/csi/hostpath.sock pid i
  kcfg=$(all_in_one_kubeconfig)
  for b in csi-provisioner csi-attacher csi-resizer csi-snapshotter csi-sidecars; do stop_pidfile "$b"; done
  for l in hostpath-csi-k8s-io external-attacher-leader-hostpath-csi-k8s-io \
    external-snapshotter-leader-hostpath-csi-k8s-io external-resizer-hostpath-csi-k8s-io; do
    kc -n "$CSI_NS" delete lease "$l" --ignore-not-found --wait=false >/dev/null
  done
  [ -x "$OURS/csi-sidecars" ] || die "no $OURS/csi-sidecars"
  echo "===== $(date -Is) e2e run.sh: csi-sidecars" >> "$LAB/logs/csi-sidecars.log"
  setsid nohup "$OURS/csi-sidecars" --controllers=provisioner,attacher,resizer,snapshotter \
    --csi-address="$sock" --kubeconfig="$kcfg" --leader-election --leader-election-namespace="$CSI_NS" \
    --http-endpoint=127.0.0.1:18080 --extra-create-metadata --node-deployment=false \
    >> "$LAB/logs/csi-sidecars.log" 2>&1 < /dev/null &
  pid=$!
  echo "$pid" > "$LAB/run/csi-sidecars.pid"
  for ((i = 0; i < 300; i++)); do
    kill -0 "$pid" 2>/dev/null || die "csi-sidecars exited: see $LAB/logs/csi-sidecars.log"
    curl -sf -o /dev/null --max-time 2 http://127.0.0.1:18080/metrics && break
    sleep 0.2
  done
  curl -sf -o /dev/null --max-time 2 http://127.0.0.1:18080/metrics || die "csi-sidecars not healthy after 60 s"
  log "csi-sidecars up: pid $pid"
}

stop_pidfile csi-sidecars
case $NAME in
  upstream) BIN_DIR=$LAB/bin "$LAB/start-csi.sh" ;;
  ours) BIN_DIR=$(ours_bin_dir) "$LAB/start-csi.sh" ;;
  all-in-one)
    BIN_DIR=$(ours_bin_dir) COMPONENTS="hostpath registrar livenessprobe snapshot-controller" "$LAB/start-csi.sh"
    start_all_in_one ;;
  *) die "unknown run $NAME: upstream, ours or all-in-one" ;;
esac

focus=(--focus="$FOCUS")
if [ -n "${SUBSET:-}" ]; then
  # One --focus a spec (ginkgo ORs them), its text as a literal regular expression.
  focus=()
  while IFS= read -r spec; do
    [[ -z $spec || $spec == \#* ]] && continue
    focus+=(--focus="External.Storage.*$(printf '%s' "$spec" | sed 's/[][(){}.*+?^$|\\]/\\&/g; s/\\\.\\\.\\\./.*/g')\$")
  done < "$SUBSET"
  FOCUS="${#focus[@]} specs of $SUBSET"
  SKIP='\[Disruptive\]|\[Feature:SELinux\]'
fi

for b in ${STOP:-}; do
  stop_pidfile "$b"
  log "stopped $b, as STOP asks"
done

rm -rf "$RESULTS"; mkdir -p "$RESULTS"
log "suite: focus '$FOCUS', skip '$SKIP', $PROCS processes; results in $RESULTS"
started=$(date +%s)
status=0
KUBE_TEST_REPO_LIST=$LAB/e2e/repo-list.yaml KUBECONFIG=$KC \
  "$E2E_BIN/ginkgo" --procs="$PROCS" --timeout="$TIMEOUT" -v "${focus[@]}" --skip="$SKIP" \
  "$E2E_BIN/e2e.test" -- --kubeconfig="$KC" --provider=skeleton \
  --storage.testdriver="$TEST_DRIVER" --report-dir="$RESULTS" --report-prefix="$NAME" \
  > "$RESULTS/suite.log" 2>&1 || status=$?
log "suite done in $(( $(date +%s) - started )) s, exit $status; tail of $RESULTS/suite.log:"
tail -n 15 "$RESULTS/suite.log" | sed 's/^/  /'
exit "$status"
