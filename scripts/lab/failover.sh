#!/usr/bin/env bash
# failover.sh: a provisioner's cold start and failover on the lab cluster, measured the same way
# for any csi-provisioner binary (ours or upstream's), with whatever population the cluster holds.
#
#   failover.sh BINARY [EXTRA FLAG...]
#
# 1. The lab's own provisioner is stopped (its Lease deleted), a claim is created, and BINARY is
#    started as the leader: "cold start" is the time from its start to the claim's PV created
#    (and to the claim Bound, which kube-controller-manager does, later when it is busy). Also
#    reported: when the claim was first seen with kube-controller-manager's provisioner
#    annotation (volume.kubernetes.io/storage-provisioner), before which no provisioner, ours or
#    upstream's, may act on it: a busy kube-controller-manager sets it seconds late.
# 2. After IDLE seconds: the leader's RSS.
# 3. A second BINARY (the standby) starts with a host name of its own (its leader election
#    identity, as a pod has; in a UTS namespace of its own) and the same flags; once its RSS has
#    not grown for SETTLE seconds: the standby's RSS.
# 4. The leader is killed with SIGKILL (its Lease stays) and a claim created: "failover" is the
#    time from the kill to that claim's PV created (and Bound).
# 5. Both are stopped, the claims deleted, and the lab's provisioner started again.
#
# With COLD_ONLY=1 only step 1 runs (then 5): repeated cold starts. With RESTART_LAB=0 the lab's
# provisioner is not started again at the end (for a series of runs, or with kube-apiserver's
# CPU left to the next one: upstream's lists every claim and PV as it starts).
#
# EXTRA flags go to both processes (ours: --leader-election-warm-standby). The flags are the
# lab's own (start-csi.sh): --leader-election with upstream's Lease timings (15 s). Claims are
# polled every 0.2 s; every wait is bounded by TIMEOUT seconds.
#
# Env: LAB (the lab directory, required), NS (claims' namespace, default failover), IDLE (60),
# SETTLE (20), TIMEOUT (600), CSI_NS (lab-csi), COLD_ONLY (0), RESTART_LAB (1).
set -euo pipefail
LAB=${LAB:?set LAB to the lab directory}
BINARY=${1:?usage: failover.sh BINARY [EXTRA FLAG...]}
shift
NS=${NS:-failover}
IDLE=${IDLE:-60}
SETTLE=${SETTLE:-20}
TIMEOUT=${TIMEOUT:-600}
CSI_NS=${CSI_NS:-lab-csi}
COLD_ONLY=${COLD_ONLY:-0}
RESTART_LAB=${RESTART_LAB:-1}
KUBECTL=$LAB/bin/kubectl
SOCK=$LAB/run/csi/hostpath.sock
KCFG=$LAB/run/kubeconfigs/csi-provisioner.kubeconfig
LEASE=hostpath-csi-k8s-io
OUT=$(mktemp -d)
kc() { "$KUBECTL" --kubeconfig "$LAB/kubeconfig" "$@"; }
info() { echo "[failover $(date +%H:%M:%S)] $*" >&2; }
die() { echo "[failover] ERROR: $*" >&2; exit 2; }
now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.2f", b-a}'; }
rss() { awk '/^VmRSS/{printf "%.1f MiB", $2/1024}' "/proc/$1/status"; }
rss_kib() { awk '/^VmRSS/{print $2}' "/proc/$1/status"; }

[ -x "$BINARY" ] || die "$BINARY is not an executable"
[ -s "$KCFG" ] || die "no $KCFG: start the lab's CSI components first (start-csi.sh)"

flags() { # flags PORT [EXTRA...]
  local port=$1
  shift
  printf '%s\n' "--csi-address=$SOCK" "--kubeconfig=$KCFG" "--leader-election" \
    "--leader-election-namespace=$CSI_NS" "--http-endpoint=127.0.0.1:$port" \
    "--extra-create-metadata" "--node-deployment=false" "$@"
}

PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
  kc delete namespace "$NS" --timeout=120s >/dev/null 2>&1 || info "namespace $NS not gone after 120 s"
  if [ "$RESTART_LAB" = 1 ]; then
    info "restarting the lab's provisioner"
    COMPONENTS=provisioner "$LAB/start-csi.sh" >/dev/null 2>&1 || info "start-csi.sh provisioner failed; run it by hand"
  fi
  rm -rf "$OUT"
}
trap cleanup EXIT

claim() { # claim NAME
  kc -n "$NS" apply -f - >/dev/null <<EOF
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: $1}
spec: {accessModes: [ReadWriteOnce], storageClassName: csi-hostpath-sc, resources: {requests: {storage: 1Mi}}}
EOF
}
until_bound() { # until_bound NAME: when its PV (pvc-<uid>, the provisioner's write) was first seen,
  # when the claim was first seen Bound, and when it was first seen with the provisioner
  # annotation without which no provisioner may act on it (the last two are
  # kube-controller-manager's writes, which a busy one delays)
  local start uid state phase provisioned="" annotated=""
  start=$(now)
  uid=$(kc -n "$NS" get pvc "$1" -o jsonpath='{.metadata.uid}')
  while :; do
    [ -n "$provisioned" ] || ! kc get pv "pvc-$uid" >/dev/null 2>&1 || provisioned=$(now)
    state=$(kc -n "$NS" get pvc "$1" -o jsonpath='{.status.phase} {.metadata.annotations.volume\.kubernetes\.io/storage-provisioner}' 2>/dev/null || true)
    phase=${state%% *}
    [ -n "$annotated" ] || [ -z "${state#* }" ] || annotated=$(now)
    [ "$phase" = Bound ] && { echo "${provisioned:-$(now)} $(now) ${annotated:-$(now)}"; return; }
    [ "$(secs "$start" "$(now)" | cut -d. -f1)" -lt "$TIMEOUT" ] || die "$1 not Bound after ${TIMEOUT}s"
    sleep 0.2
  done
}
report() { # report WHAT FROM "PROVISIONED BOUND ANNOTATED"
  local provisioned bound annotated
  read -r provisioned bound annotated <<<"$3"
  echo "$1: PV created $(secs "$2" "$provisioned") s, claim Bound $(secs "$2" "$bound") s; the claim annotated for its provisioner at $(secs "$2" "$annotated") s"
}
settle() { # settle PID: waits until its RSS has not grown for SETTLE seconds
  local last=0 same=0 cur start
  start=$(now)
  while [ "$same" -lt "$SETTLE" ]; do
    cur=$(rss_kib "$1")
    if [ "$cur" -gt "$last" ]; then last=$cur; same=0; else same=$((same + 1)); fi
    [ "$(secs "$start" "$(now)" | cut -d. -f1)" -lt "$TIMEOUT" ] || die "pid $1 still growing after ${TIMEOUT}s"
    sleep 1
  done
}

kc create namespace "$NS" >/dev/null 2>&1 || true
info "stopping the lab's provisioner"
if [ -s "$LAB/run/csi-provisioner.pid" ]; then
  kill "$(cat "$LAB/run/csi-provisioner.pid")" 2>/dev/null || true
  sleep 2
fi
kc -n "$CSI_NS" delete lease "$LEASE" --ignore-not-found >/dev/null

claim cold
mapfile -t LEADER_FLAGS < <(flags 18090 "$@")
start=$(now)
"$BINARY" "${LEADER_FLAGS[@]}" >"$OUT/leader.log" 2>&1 &
LEADER=$!
PIDS+=("$LEADER")
bound=$(until_bound cold) || exit 2
report "cold start to the first claim" "$start" "$bound"
[ "$COLD_ONLY" = 1 ] && exit 0
sleep "$IDLE"
echo "leader RSS after ${IDLE} s: $(rss "$LEADER") (peak $(awk '/^VmHWM/{printf "%.1f MiB", $2/1024}' "/proc/$LEADER/status"))"

mapfile -t STANDBY_FLAGS < <(flags 18091 "$@")
unshare -Uru sh -c 'hostname standby && exec "$0" "$@"' "$BINARY" "${STANDBY_FLAGS[@]}" >"$OUT/standby.log" 2>&1 &
STANDBY=$!
PIDS+=("$STANDBY")
settle "$STANDBY"
echo "standby RSS once settled: $(rss "$STANDBY")"

kill -9 "$LEADER"
killed=$(now)
claim failover
bound=$(until_bound failover) || exit 2
report "failover: kill -9 of the leader to the next claim" "$killed" "$bound"
echo "(Lease $(kc -n "$CSI_NS" get lease "$LEASE" -o jsonpath='{.spec.leaseDurationSeconds}') s, now held by $(kc -n "$CSI_NS" get lease "$LEASE" -o jsonpath='{.spec.holderIdentity}'))"
