#!/usr/bin/env bash
# snapshot-metadata.sh: real-cluster check of a csi-snapshot-metadata sidecar (ours or upstream's)
# against the lab's hostpath CSI driver. Every wait is bounded.
#
#   snapshot-metadata.sh setup                      hostpath --enable-snapshot-metadata (all upstream sidecars restarted
#                                       with it), CRD, upstream ClusterRoles, SAs/bindings, certs, SMS CR,
#                                       PVCs full-src (2Gi, every block written) / odd-src (1G, last 2560 B
#                                       written), VolumeSnapshots full / odd. Idempotent.
#   snapshot-metadata.sh start-sidecar BINARY PORT  start BINARY as host process on PORT (http PORT+1000), point the SMS at it,
#                                       wait for /health 200 (60 s). Extra flags: SIDECAR_EXTRA_ARGS="...".
#   snapshot-metadata.sh stop-sidecar PORT
#   snapshot-metadata.sh list full|odd [lister flags, e.g. -max-results N]   run snapshot-metadata-lister as SA smlab/backup
#   snapshot-metadata.sh stall [PORT]               stopped lister (-max-results 1) + second list + sidecar alive after 60 s
#   snapshot-metadata.sh rbac strict|hostpath-deploy   strict (setup's default): the sidecar SA is bound ONLY to upstream's
#                                       external-snapshot-metadata-runner; upstream v1.1.0's sidecar then fails every
#                                       request (it GETs the VolumeSnapshotClass, which that role does not grant).
#                                       hostpath-deploy: also bind external-snapshotter-runner, as csi-driver-host-path's
#                                       deploy/kubernetes-1.34 binds its plugin SA (that role grants volumesnapshotclasses).
#   snapshot-metadata.sh rss PORT                   VmRSS / VmHWM of the sidecar on PORT
#   snapshot-metadata.sh status
#   snapshot-metadata.sh teardown                   remove everything setup made; hostpath (and sidecars) back without the flag
#
# Env: LAB (the lab directory, required), SM (work directory, default $TMPDIR/snapshot-metadata-lab),
# LIST_TIMEOUT (600 s), STALL_WAIT (60 s), SIDECAR_EXTRA_ARGS.
set -uo pipefail
LAB=${LAB:?set LAB to the lab directory}
SM=${SM:-${TMPDIR:-/tmp}/snapshot-metadata-lab}
KUBECTL=$LAB/bin/kubectl
ADMIN_KC=$LAB/kubeconfig
SRC_SM=$LAB/src/external-snapshot-metadata
LISTER=$LAB/bin/snapshot-metadata-lister
SOCK=$LAB/run/csi/hostpath.sock
STATE_DIR=$LAB/run/hostpath-state
NS=smlab
CSI_NS=lab-csi
DRIVER=hostpath.csi.k8s.io
AUD=smlab-audience
SIDECAR_SA=csi-snapshot-metadata
SIDECAR_KC=$SM/$SIDECAR_SA.kubeconfig
BACKUP_KC=$SM/backup.kubeconfig
CERTS=$SM/certs
LIST_TIMEOUT=${LIST_TIMEOUT:-600}
STALL_WAIT=${STALL_WAIT:-60}
BS=4096

log() { echo "[smlab $(date +%H:%M:%S)] $*" >&2; }
die() { echo "[smlab $(date +%H:%M:%S)] ERROR: $*" >&2; exit 1; }
kc() { "$KUBECTL" --kubeconfig "$ADMIN_KC" "$@"; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN{printf "%.1f", b-a}'; }
alive() { kill -0 "$1" 2>/dev/null && [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" != Z ]; }
mkdir -p "$SM"

# wait_for SECONDS DESCRIPTION CMD...: poll CMD every 0.5 s until it succeeds
wait_for() {
  local t=$1 what=$2 i; shift 2
  for ((i = 0; i < t * 2; i++)); do "$@" >/dev/null 2>&1 && return 0; sleep 0.5; done
  die "timeout after ${t}s waiting for $what"
}

hostpath_pid() { local p; p=$(cat "$LAB/run/hostpathplugin.pid" 2>/dev/null) && alive "$p" && echo "$p"; }
hostpath_has_flag() {
  local p; p=$(hostpath_pid) || return 1
  tr '\0' '\n' < "/proc/$p/cmdline" | grep -qx -- '--enable-snapshot-metadata'
}

# ---------------------------------------------------------------- sidecar processes
sidecar_pid() { # PORT -> pid if alive
  local p; p=$(cat "$SM/$1.pid" 2>/dev/null) || return 1
  [[ $p =~ ^[0-9]+$ ]] && alive "$p" && echo "$p"
}
stop_sidecar() {
  local port=$1 pid i
  if pid=$(sidecar_pid "$port"); then
    kill -TERM "$pid" 2>/dev/null
    for ((i = 0; i < 150; i++)); do alive "$pid" || break; sleep 0.1; done
    if alive "$pid"; then log "sidecar pid $pid ignored SIGTERM for 15 s, SIGKILL"; kill -KILL "$pid"; sleep 0.5; fi
    log "stopped sidecar on port $port (pid $pid)"
  fi
  rm -f "$SM/$port.pid"
}
all_sidecar_ports() { local f; for f in "$SM"/*.pid; do [ -e "$f" ] && basename "$f" .pid; done; }

mem_of() { awk '/^VmRSS|^VmHWM/{printf "%s %s %s  ", $1, $2, $3}' "/proc/$1/status" 2>/dev/null; }

cmd_start_sidecar() {
  [ $# -eq 2 ] || die "usage: $0 start-sidecar BINARY PORT"
  local bin port hport pid t0 code i
  bin=$(readlink -f "$1") port=$2 hport=$(($2 + 1000))
  [ -x "$bin" ] || die "$1 is not an executable file"
  [ -f "$CERTS/server.crt" ] || die "no certs: run $0 setup first"
  stop_sidecar "$port"
  for p in "$port" "$hport"; do
    ss -ltnH "sport = :$p" | grep -q . && die "port $p already in use: $(ss -ltnpH "sport = :$p" | tr -s ' ')"
  done
  "$LAB/make-sa-kubeconfig.sh" "$SIDECAR_SA" "$CSI_NS" "$SIDECAR_KC" >/dev/null || die "make-sa-kubeconfig.sh failed"
  kc patch snapshotmetadataservice "$DRIVER" --type merge -p "{\"spec\":{\"address\":\"127.0.0.1:$port\"}}" >/dev/null \
    || die "cannot patch SnapshotMetadataService $DRIVER"
  local args=(--csi-address="$SOCK" --kubeconfig="$SIDECAR_KC" --port="$port"
    --tls-cert="$CERTS/server.crt" --tls-key="$CERTS/server.key" --http-endpoint="127.0.0.1:$hport" -v=4)
  # shellcheck disable=SC2206
  local extra=(${SIDECAR_EXTRA_ARGS:-})
  echo "===== $(date -Is) smlab: $bin ${args[*]} ${extra[*]}" >> "$SM/sidecar-$port.log"
  setsid nohup "$bin" "${args[@]}" "${extra[@]}" >> "$SM/sidecar-$port.log" 2>&1 < /dev/null &
  pid=$!
  echo "$pid" > "$SM/$port.pid"
  t0=$(now)
  for ((i = 0; i < 600; i++)); do
    alive "$pid" || { tail -n 30 "$SM/sidecar-$port.log" >&2; rm -f "$SM/$port.pid"; die "sidecar exited during startup"; }
    code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 1 "http://127.0.0.1:$hport/health" 2>/dev/null)
    [ "$code" = 200 ] && break
    sleep 0.1
  done
  [ "$code" = 200 ] || { tail -n 30 "$SM/sidecar-$port.log" >&2; die "/health not 200 after 60 s (last: $code); pid $pid left running"; }
  echo "sidecar up: $bin pid $pid port $port, /health 200 after $(since "$t0")s; $(mem_of "$pid"); log $SM/sidecar-$port.log"
}

# ---------------------------------------------------------------- setup pieces
make_certs() {
  [ -s "$CERTS/ca.crt" ] && [ -s "$CERTS/server.crt" ] && [ -s "$CERTS/server.key" ] && return 0
  mkdir -p "$CERTS"
  (
    cd "$CERTS" || exit 1
    openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 3650 -subj "/CN=smlab-ca" \
      -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null &&
    openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj "/CN=127.0.0.1" 2>/dev/null &&
    printf 'basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1\n' > server.ext &&
    openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out server.crt -days 3650 \
      -extfile server.ext 2>/dev/null &&
    openssl verify -CAfile ca.crt server.crt >/dev/null
  ) || die "certificate generation failed"
  log "certs made in $CERTS (CA + server cert, SAN IP:127.0.0.1)"
}

apply_rbac_and_crd() {
  kc apply -f "$SRC_SM/deploy/cbt.storage.k8s.io_snapshotmetadataservices.yaml" >/dev/null || die "CRD apply failed"
  kc wait --for=condition=Established --timeout=60s crd/snapshotmetadataservices.cbt.storage.k8s.io >/dev/null \
    || die "SnapshotMetadataService CRD not Established"
  # upstream ClusterRoles, unchanged
  kc apply -f "$SRC_SM/deploy/snapshot-metadata-cluster-role.yaml" \
    -f "$SRC_SM/deploy/snapshot-metadata-client-cluster-role.yaml" >/dev/null || die "ClusterRole apply failed"
  kc get ns "$NS" >/dev/null 2>&1 || kc create ns "$NS" >/dev/null || die "cannot create ns $NS"
  "$LAB/make-sa-kubeconfig.sh" "$SIDECAR_SA" "$CSI_NS" "$SIDECAR_KC" >/dev/null || die "make-sa-kubeconfig.sh $SIDECAR_SA failed"
  "$LAB/make-sa-kubeconfig.sh" backup "$NS" "$BACKUP_KC" >/dev/null || die "make-sa-kubeconfig.sh backup failed"
  kc apply -f - >/dev/null <<EOF || die "bindings apply failed"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: smlab-csi-snapshot-metadata-runner
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: external-snapshot-metadata-runner
subjects:
- kind: ServiceAccount
  name: $SIDECAR_SA
  namespace: $CSI_NS
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: smlab-backup-client-runner
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: external-snapshot-metadata-client-runner
subjects:
- kind: ServiceAccount
  name: backup
  namespace: $NS
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: smlab-get-volumesnapshots
  namespace: $NS
rules:
- apiGroups: [snapshot.storage.k8s.io]
  resources: [volumesnapshots]
  verbs: [get]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: smlab-backup-get-volumesnapshots
  namespace: $NS
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: Role
  name: smlab-get-volumesnapshots
subjects:
- kind: ServiceAccount
  name: backup
  namespace: $NS
EOF
}

apply_sms() {
  local addr
  addr=$(kc get snapshotmetadataservice "$DRIVER" -o jsonpath='{.spec.address}' 2>/dev/null)
  addr=${addr:-127.0.0.1:50051}
  kc apply -f - >/dev/null <<EOF || die "SnapshotMetadataService apply failed"
apiVersion: cbt.storage.k8s.io/v1beta1
kind: SnapshotMetadataService
metadata:
  name: $DRIVER
spec:
  address: $addr
  audience: $AUD
  caCert: $(base64 -w0 "$CERTS/ca.crt")
EOF
}

pvc_bound() { [ "$(kc -n "$NS" get pvc "$1" -o jsonpath='{.status.phase}')" = Bound ]; }
snap_ready() { [ "$(kc -n "$NS" get volumesnapshot "$1" -o jsonpath='{.status.readyToUse}')" = true ]; }

# make_case PVC SIZE SNAP MODE(full|odd)
make_case() {
  local pvc=$1 size=$2 snap=$3 mode=$4 ann="" pv handle file vsize fsize t0
  if [ "$(kc get sc csi-hostpath-sc -o jsonpath='{.volumeBindingMode}')" = WaitForFirstConsumer ]; then
    ann='  annotations: {volume.kubernetes.io/selected-node: lab-node-1}'
  fi
  if ! kc -n "$NS" get pvc "$pvc" >/dev/null 2>&1; then
    kc apply -f - >/dev/null <<EOF || die "PVC $pvc apply failed"
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: $pvc
  namespace: $NS
$ann
spec:
  accessModes: [ReadWriteOnce]
  volumeMode: Block
  storageClassName: csi-hostpath-sc
  resources:
    requests:
      storage: $size
EOF
  fi
  t0=$(now)
  wait_for 120 "PVC $pvc Bound" pvc_bound "$pvc"
  pv=$(kc -n "$NS" get pvc "$pvc" -o jsonpath='{.spec.volumeName}')
  handle=$(kc get pv "$pv" -o jsonpath='{.spec.csi.volumeHandle}')
  file=$STATE_DIR/$handle
  [ -f "$file" ] || die "backing file $file of $pvc not found"
  vsize=$(jq -r --arg id "$handle" '.Volumes[] | select(.VolID == $id) | .VolSize' "$STATE_DIR/state.json")
  [[ $vsize =~ ^[0-9]+$ ]] || die "VolSize of $handle not in state.json"
  log "PVC $pvc Bound (${t0:+$(since "$t0")s}), volume $handle, VolSize $vsize, file $(stat -c %s "$file") bytes"
  if [ "$(kc -n "$NS" get pvc "$pvc" -o jsonpath='{.metadata.annotations.smlab/written}')" != true ]; then
    if kc -n "$NS" get volumesnapshot "$snap" >/dev/null 2>&1; then
      log "snapshot $snap predates the data: deleting it"
      kc -n "$NS" delete volumesnapshot "$snap" --timeout=120s >/dev/null || die "cannot delete snapshot $snap"
    fi
    t0=$(now)
    case $mode in
      full)
        fsize=$(stat -c %s "$file")
        ((fsize % 1048576 == 0)) || die "backing file size $fsize not a MiB multiple"
        { tr '\0' '\125' < /dev/zero || true; } |
          dd of="$file" bs=1M count=$((fsize / 1048576)) iflag=fullblock conv=notrunc status=none || die "write failed"
        ;;
      odd)
        # last partial block of the volume (VolSize, not the fallocate'd file size, which is VolSize rounded down to MiB)
        local off=$(( vsize / BS * BS )) len=$(( vsize - vsize / BS * BS ))
        ((len > 0)) || die "volume size $vsize has no partial last block"
        { tr '\0' '\125' < /dev/zero || true; } | head -c "$len" |
          dd of="$file" bs="$len" count=1 seek="$off" oflag=seek_bytes iflag=fullblock conv=notrunc status=none \
          || die "write failed"
        ;;
    esac
    sync "$file" 2>/dev/null || sync
    kc -n "$NS" annotate pvc "$pvc" smlab/written=true --overwrite >/dev/null
    log "wrote $pvc backing file ($mode) in $(since "$t0")s; now $(stat -c %s "$file") bytes"
  fi
  if ! kc -n "$NS" get volumesnapshot "$snap" >/dev/null 2>&1; then
    kc apply -f - >/dev/null <<EOF || die "VolumeSnapshot $snap apply failed"
apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshot
metadata:
  name: $snap
  namespace: $NS
spec:
  volumeSnapshotClassName: csi-hostpath-snapclass
  source:
    persistentVolumeClaimName: $pvc
EOF
  fi
  t0=$(now)
  wait_for 300 "VolumeSnapshot $snap readyToUse" snap_ready "$snap"
  local vsc shandle
  vsc=$(kc -n "$NS" get volumesnapshot "$snap" -o jsonpath='{.status.boundVolumeSnapshotContentName}')
  shandle=$(kc get volumesnapshotcontent "$vsc" -o jsonpath='{.status.snapshotHandle}')
  log "VolumeSnapshot $snap readyToUse (waited $(since "$t0")s), handle $shandle, $STATE_DIR/$shandle.snap $(stat -c %s "$STATE_DIR/$shandle.snap" 2>/dev/null) bytes"
}

cmd_setup() {
  local t0; t0=$(now)
  kc get --raw /readyz >/dev/null 2>&1 || die "apiserver not ready ($LAB/status.sh)"
  if hostpath_has_flag; then
    log "hostpath already runs with --enable-snapshot-metadata"
  else
    local p; for p in $(all_sidecar_ports); do stop_sidecar "$p"; done
    log "restarting hostpath with --enable-snapshot-metadata and all upstream sidecars (start-csi.sh)"
    EXTRA_ARGS_hostpath=--enable-snapshot-metadata "$LAB/start-csi.sh" >&2 || die "start-csi.sh failed"
  fi
  apply_rbac_and_crd
  make_certs
  apply_sms
  make_case full-src 2Gi full full
  make_case odd-src 1G odd odd
  log "setup done in $(since "$t0")s"
}

# ---------------------------------------------------------------- client
fresh_backup_kc() { # re-mint the 48h token when older than 12 h
  if [ ! -s "$BACKUP_KC" ] || [ -n "$(find "$BACKUP_KC" -mmin +720 2>/dev/null)" ]; then
    "$LAB/make-sa-kubeconfig.sh" backup "$NS" "$BACKUP_KC" >/dev/null || die "make-sa-kubeconfig.sh backup failed"
  fi
}

# count the table rows of a lister output on stdin
count_rows() {
  awk 'NF == 5 && $1 ~ /^[0-9]+$/ { n++; s += $5; if (!r || $1 > r) r = $1; if (n == 1) f = $4; l = $4; ls = $5; cap = $2 }
       END { printf "blocks=%d records=%d bytes=%.0f first_offset=%s last_offset=%s last_size=%s volcap=%s\n", n, r, s, f, l, ls, cap }'
}

cmd_list() {
  [ $# -ge 1 ] || die "usage: $0 list full|odd [lister flags]"
  local snap=$1 t0 rc res; shift
  fresh_backup_kc
  t0=$(now)
  res=$(timeout -k 5 "$LIST_TIMEOUT" "$LISTER" -kubeconfig "$BACKUP_KC" -n "$NS" -s "$snap" "$@" 2> "$SM/list-$snap.err" | count_rows)
  rc=${PIPESTATUS[0]}
  echo "list $snap $*: $res exit=$rc time=$(since "$t0")s"
  [ -s "$SM/list-$snap.err" ] && sed 's/^/  lister stderr: /' "$SM/list-$snap.err" | head -n 5
  return "$rc"
}

# ---------------------------------------------------------------- stall
cmd_stall() {
  local port=${1:-} pid lpid t0 n1 n2 res2 alive_s hits lrc
  [ -n "$port" ] || port=$(all_sidecar_ports | head -n 1)
  [ -n "$port" ] || die "no sidecar started (start-sidecar first)"
  pid=$(sidecar_pid "$port") || die "sidecar on port $port not running"
  fresh_backup_kc
  local lout=$SM/stall-lister.out lerr=$SM/stall-lister.err
  local logsz; logsz=$(stat -c %s "$SM/sidecar-$port.log" 2>/dev/null || echo 0)
  "$LISTER" -kubeconfig "$BACKUP_KC" -n "$NS" -s full -max-results 1 > "$lout" 2> "$lerr" &
  lpid=$!
  trap 'kill -KILL '"$lpid"' 2>/dev/null' EXIT
  sleep 1
  kill -STOP "$lpid" 2>/dev/null || die "first lister already gone: $(cat "$lerr")"
  n1=$(count_rows < "$lout")
  log "first lister (pid $lpid, -max-results 1) SIGSTOPped after 1 s: $n1"
  t0=$(now)
  res2=$(cmd_list full 2>&1); lrc=$?
  echo "$res2" | sed 's/^/  /' >&2
  local rem; rem=$(awk -v a="$t0" -v b="$(now)" -v w="$STALL_WAIT" 'BEGIN{r = w - (b - a); print (r > 0 ? int(r + 0.999) : 0)}')
  log "waiting ${rem}s more (until ${STALL_WAIT}s after the second list started), then checking sidecar pid $pid"
  sleep "$rem"
  if alive "$pid"; then alive_s="alive ($(mem_of "$pid"))"; else alive_s="DEAD"; fi
  hits=$(tail -c +"$((logsz + 1))" "$SM/sidecar-$port.log" | grep -iE 'lost connection|exiting' | head -n 5)
  n2=$(count_rows < "$lout")
  kill -KILL "$lpid" 2>/dev/null; wait "$lpid" 2>/dev/null; trap - EXIT
  [ -n "$hits" ] && echo "$hits" | sed 's/^/  sidecar log: /' >&2
  echo "STALL port=$port: stopped lister had ${n1%% *} then ${n2%% *} | second list: $(echo "$res2" | head -n1 | sed 's/^list full : //') | sidecar after ${STALL_WAIT}s: $alive_s | log lost-connection/exiting lines: $(printf '%s' "$hits" | grep -c .)"
  return "$lrc"
}

# ---------------------------------------------------------------- misc
cmd_rbac() {
  case ${1:-} in
    strict)
      kc delete clusterrolebinding smlab-csi-snapshot-metadata-snapshotter --ignore-not-found >/dev/null ;;
    hostpath-deploy)
      kc apply -f - >/dev/null <<EOF || die "apply failed"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: smlab-csi-snapshot-metadata-snapshotter
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: external-snapshotter-runner
subjects:
- kind: ServiceAccount
  name: $SIDECAR_SA
  namespace: $CSI_NS
EOF
      ;;
    *) die "usage: $0 rbac strict|hostpath-deploy" ;;
  esac
  echo "rbac: sidecar SA $CSI_NS/$SIDECAR_SA bound to: $(kc get clusterrolebinding -o jsonpath='{range .items[?(@.subjects[0].name=="'"$SIDECAR_SA"'")]}{.roleRef.name} {end}')"
  echo "  can get volumesnapshotclasses: $(kc auth can-i get volumesnapshotclasses.snapshot.storage.k8s.io --as=system:serviceaccount:$CSI_NS:$SIDECAR_SA 2>/dev/null)"
}

cmd_rss() { local pid; pid=$(sidecar_pid "$1") || die "no sidecar on port $1"; echo "pid $pid $(mem_of "$pid")"; }

cmd_status() {
  echo "hostpath: pid $(hostpath_pid || echo none), snapshot-metadata flag: $(hostpath_has_flag && echo yes || echo no)"
  local p; for p in $(all_sidecar_ports); do
    if pid=$(sidecar_pid "$p"); then echo "sidecar port $p: pid $pid $(readlink /proc/$pid/exe) $(mem_of "$pid")"; else echo "sidecar port $p: down"; fi
  done
  echo "SMS address: $(kc get snapshotmetadataservice "$DRIVER" -o jsonpath='{.spec.address} audience={.spec.audience}' 2>/dev/null || echo none)"
  kc -n "$NS" get pvc,volumesnapshot 2>/dev/null
}

cmd_teardown() {
  local p i
  for p in $(all_sidecar_ports); do stop_sidecar "$p"; done
  if kc get ns "$NS" >/dev/null 2>&1; then
    kc -n "$NS" delete volumesnapshot --all --timeout=120s >/dev/null 2>&1
    local pvs; pvs=$(kc -n "$NS" get pvc -o jsonpath='{.items[*].spec.volumeName}' 2>/dev/null)
    kc -n "$NS" delete pvc --all --timeout=120s >/dev/null 2>&1
    for ((i = 0; i < 240; i++)); do
      [ -z "$pvs" ] && break
      # shellcheck disable=SC2086
      kc get pv $pvs -o name 2>/dev/null | grep -q . || break
      sleep 0.5
    done
    kc delete ns "$NS" --timeout=120s >/dev/null 2>&1 || log "WARNING: namespace $NS not gone within 120 s"
  fi
  kc delete snapshotmetadataservice "$DRIVER" --ignore-not-found >/dev/null 2>&1
  kc delete crd snapshotmetadataservices.cbt.storage.k8s.io --ignore-not-found --timeout=60s >/dev/null
  kc delete clusterrolebinding smlab-csi-snapshot-metadata-runner smlab-backup-client-runner \
    smlab-csi-snapshot-metadata-snapshotter --ignore-not-found >/dev/null
  kc delete clusterrole external-snapshot-metadata-runner external-snapshot-metadata-client-runner --ignore-not-found >/dev/null
  kc -n "$CSI_NS" delete serviceaccount "$SIDECAR_SA" --ignore-not-found >/dev/null
  if hostpath_has_flag; then
    log "restarting hostpath without --enable-snapshot-metadata and all upstream sidecars"
    "$LAB/start-csi.sh" >&2 || die "start-csi.sh failed"
  fi
  rm -f "$SIDECAR_KC" "$BACKUP_KC"
  log "teardown done; state.json: $(cat "$STATE_DIR/state.json")"
}

case ${1:-} in
  setup) shift; cmd_setup "$@" ;;
  start-sidecar) shift; cmd_start_sidecar "$@" ;;
  stop-sidecar) shift; [ $# -eq 1 ] || die "usage: $0 stop-sidecar PORT"; stop_sidecar "$1" ;;
  list) shift; cmd_list "$@" ;;
  stall) shift; cmd_stall "$@" ;;
  rss) shift; cmd_rss "$@" ;;
  rbac) shift; cmd_rbac "$@" ;;
  status) shift; cmd_status ;;
  teardown) shift; cmd_teardown ;;
  *) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
