#!/usr/bin/env bash
# node.sh up|down|status: swap the lab's hollow node (kubemark) for a REAL kubelet on containerd + runc,
# so that Kubernetes' storage e2e suite can run pods that mount CSI volumes; and back.
#
#   up      stop kubemark; fetch/extract containerd (trixie .deb) and busybox-static under $LAB/e2e/root
#           (runc from bookworm via apt); start containerd (own config, socket $LAB/e2e/run/containerd.sock,
#           CNI bridge 10.88.0.0/16); build + import the images lab.local/e2e-test-images/busybox:1.37.0-1,
#           lab.local/e2e-test-images/agnhost:2.56, lab.local/pause:3.10.1 (+ the busybox image tagged
#           lab.local/e2e-test-images/nginx:1.14-4, shell only); write $LAB/e2e/repo-list.yaml
#           (for KUBE_TEST_REPO_LIST); map lab-node-1 to 127.0.0.1 in /etc/hosts; start the kubelet
#           (root dir $LAB/run/kubelet, the lab's CSI paths); wait for Ready; prove it with a busybox pod
#           (emptyDir, exec, logs); (re)start all CSI components (start-csi.sh) and prove a CSI volume
#           (PVC on csi-hostpath-sc + pod writing and reading it). Idempotent; SKIP_CHECK=1 skips the proofs.
#   down    delete the pods on the node, stop kubelet + containerd, clean their mounts, bridge, iptables
#           rules and sysctls, remove our /etc/hosts line, start kubemark again (start-kubemark.sh).
#   status  one line per piece.
#
# Env: LAB (required, the lab directory); NODE_NAME (default lab-node-1).
# Files: $LAB/e2e/{root,debs,containerd,cni,images,kubelet,run,logs,pod-logs}, $LAB/e2e/repo-list.yaml.
set -euo pipefail
LAB=${LAB:?set LAB to the lab directory}
HERE=$(cd "$(dirname "$(readlink -f "$0")")" && pwd)
NODE_NAME=${NODE_NAME:-lab-node-1}
E2E=$LAB/e2e
EBIN=$E2E/bin
XROOT=$E2E/root                       # extracted .debs (containerd, busybox-static)
RUND=$E2E/run
LOGD=$E2E/logs
CTRD=$E2E/containerd
SOCK=$RUND/containerd.sock
CNI_CONF=$E2E/cni/net.d
CNI_DATA=$E2E/cni/networks
CNI_NET=lab-e2e
CNI_BRIDGE=lab-cni0
POD_CIDR=10.88.0.0/16
KROOT=$LAB/run/kubelet                # same root dir as kubemark and start-csi.sh (plugins_registry)
KCFG=$E2E/kubelet/config.yaml
NODE_KC=$LAB/pki/node-$NODE_NAME.kubeconfig
ADMIN_KC=$LAB/kubeconfig
KUBECTL=$LAB/bin/kubectl
HOSTS_TAG="# lab-e2e-node (scripts/e2e/node.sh)"
REG=lab.local
IMG_BUSYBOX=$REG/e2e-test-images/busybox:1.37.0-1
IMG_AGNHOST=$REG/e2e-test-images/agnhost:2.56
IMG_PAUSE=$REG/pause:3.10.1
# the volumes testsuite's "should allow exec of files on the volume" runs `/bin/sh -c` in the e2e nginx image,
# and the multiVolume and provisioning suites run shell commands in jessie-dnsutils: those names are tagged onto
# the busybox image (a shell and its tools, no nginx or dnsutils inside)
IMG_NGINX_ALIAS=$REG/e2e-test-images/nginx:1.14-4
IMG_DNSUTILS_ALIAS=$REG/e2e-test-images/jessie-dnsutils:1.7
CHECK_NS=lab-e2e-node-check
SYSCTLS="vm/overcommit_memory vm/panic_on_oom kernel/panic kernel/panic_on_oops kernel/keys/root_maxkeys kernel/keys/root_maxbytes net/ipv4/ip_forward"

log() { echo "[node.sh $(date +%H:%M:%S)] $*"; }
die() { echo "[node.sh $(date +%H:%M:%S)] ERROR: $*" >&2; exit 1; }
kc() { "$KUBECTL" --kubeconfig "$ADMIN_KC" "$@"; }
ctr_() { # ctr_ [--connect-timeout D] ARGS...
  local ct=()
  [ "${1:-}" = --connect-timeout ] && { ct=(--connect-timeout "$2"); shift 2; }
  PATH=$XROOT/usr/bin:$PATH "$XROOT/usr/bin/ctr" --address "$SOCK" "${ct[@]}" -n k8s.io "$@"
}

alive() { kill -0 "$1" 2>/dev/null && [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" != Z ]; }
# pid_of NAME: pid from $RUND/NAME.pid if alive and its executable is called NAME
pid_of() {
  local pidf=$RUND/$1.pid pid exe
  [ -s "$pidf" ] || return 1
  pid=$(cat "$pidf" 2>/dev/null) || return 1
  [[ $pid =~ ^[0-9]+$ ]] && alive "$pid" || return 1
  exe=$(readlink "/proc/$pid/exe" 2>/dev/null) || return 1
  exe=${exe% (deleted)}
  [ "$(basename "$exe")" = "$1" ] || return 1
  echo "$pid"
}
# start_bg NAME CMD...: own session (setsid nohup), log $LOGD/NAME.log (appended), pid $RUND/NAME.pid
start_bg() {
  local name=$1; shift
  echo "===== $(date -Is) node.sh: $*" >> "$LOGD/$name.log"
  setsid nohup "$@" >> "$LOGD/$name.log" 2>&1 < /dev/null 8>&- &
  echo $! > "$RUND/$name.pid"
  log "started $name (pid $!, log $LOGD/$name.log)"
}
stop_bg() { # NAME [TIMEOUT_S]
  local name=$1 t=${2:-20} pid i
  if pid=$(pid_of "$name"); then
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < t * 10; i++)); do alive "$pid" || break; sleep 0.1; done
    if alive "$pid"; then
      log "$name (pid $pid) did not stop in ${t}s, SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
      for ((i = 0; i < 50; i++)); do alive "$pid" || break; sleep 0.1; done
    fi
    log "stopped $name (pid $pid)"
  fi
  rm -f "$RUND/$name.pid"
}
wait_for() { # SECONDS WHAT CMD...
  local t=$1 what=$2 i; shift 2
  for ((i = 0; i < t * 2; i++)); do
    "$@" >/dev/null 2>&1 && return 0
    sleep 0.5
  done
  die "timed out after ${t}s waiting for $what"
}
tail_log() { echo "----- $1 (last ${2:-30} lines) -----" >&2; tail -n "${2:-30}" "$1" >&2 || true; }

# ---------------------------------------------------------------- packages
ensure_packages() {
  mkdir -p "$E2E/debs" "$XROOT"
  local pkg want
  for pkg in containerd busybox-static; do
    case $pkg in containerd) want=$XROOT/usr/bin/containerd ;; busybox-static) want=$XROOT/usr/bin/busybox ;; esac
    [ -x "$want" ] && continue
    if ! ls "$E2E/debs/${pkg}_"*.deb >/dev/null 2>&1; then
      log "downloading $pkg/trixie (.deb only, not installed)"
      (cd "$E2E/debs" && apt-get download "$pkg/trixie") >/dev/null || die "apt-get download $pkg/trixie failed"
    fi
    dpkg-deb -x "$(ls "$E2E/debs/${pkg}_"*.deb | tail -1)" "$XROOT"
    [ -x "$want" ] || die "$want missing after extracting $pkg"
  done
  if ! command -v runc >/dev/null; then
    log "installing runc (bookworm)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y runc >/dev/null || die "apt-get install runc failed"
  fi
  local b
  for b in kubelet agnhost pause; do
    [ -x "$EBIN/$b" ] || die "$EBIN/$b missing (scripts/e2e/build.sh)"
  done
  [ -x /usr/lib/cni/bridge ] && [ -x /usr/lib/cni/host-local ] && [ -x /usr/lib/cni/loopback ] \
    || die "CNI plugins missing in /usr/lib/cni (apt-get install containernetworking-plugins)"
  [ -s "$NODE_KC" ] || die "$NODE_KC missing (run $LAB/start-cluster.sh)"
}

# ---------------------------------------------------------------- containerd
write_containerd_config() {
  mkdir -p "$CTRD/root" "$CTRD/state" "$CTRD/opt" "$CNI_CONF" "$CNI_DATA" "$RUND" "$LOGD"
  # every registry resolves to a closed loopback port: images come only from `ctr import`,
  # a missing one fails fast ("connection refused") instead of going to the network
  local h
  for h in _default "$REG" "invalid.$REG"; do
    mkdir -p "$CTRD/certs.d/$h"
    printf 'server = "http://127.0.0.1:1"\n\n[host."http://127.0.0.1:1"]\n  capabilities = ["pull", "resolve"]\n' \
      > "$CTRD/certs.d/$h/hosts.toml"
  done
  cat > "$CTRD/config.toml.new" <<EOF
version = 2
root = "$CTRD/root"
state = "$CTRD/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]

[grpc]
  address = "$SOCK"

[plugins."io.containerd.internal.v1.opt"]
  path = "$CTRD/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$IMG_PAUSE"
  # this VM's bounding set lacks CAP_SYS_RESOURCE: a negative oom_score_adj (sandbox -998, Guaranteed
  # -997) makes runc fail ("can't get final child's PID from pipe"); clamp to containerd's own (0)
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "$(command -v runc)"
        Root = "$RUND/runc"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$CNI_CONF"
    max_conf_num = 1
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "$CTRD/certs.d"
EOF
  install_if_changed "$CTRD/config.toml"
  # pod network: bridge + host-local IPAM (state under $E2E/cni); containerd adds the loopback
  # interface itself with /usr/lib/cni/loopback
  cat > "$CNI_CONF/10-$CNI_NET.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "$CNI_NET",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$CNI_BRIDGE",
      "isGateway": true,
      "ipMasq": true,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$CNI_DATA",
        "ranges": [[{"subnet": "$POD_CIDR"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    }
  ]
}
EOF
}

# install_if_changed FILE: FILE.new -> FILE; sets CHANGED=1 when the content changed
install_if_changed() {
  if [ -e "$1" ] && cmp -s "$1.new" "$1"; then rm -f "$1.new"; return 0; fi
  mv "$1.new" "$1"; CHANGED=1
}

containerd_ok() { [ -S "$SOCK" ] && ctr_ --connect-timeout 2s version >/dev/null 2>&1; }

start_containerd() {
  CHANGED=0
  write_containerd_config
  if pid=$(pid_of containerd) && containerd_ok && [ $CHANGED = 0 ]; then
    log "containerd already running (pid $pid)"
    return 0
  fi
  if [ $CHANGED = 1 ] && pid_of containerd >/dev/null; then
    log "containerd config changed: restarting containerd (and the kubelet)"
  fi
  stop_bg containerd 20
  CONTAINERD_RESTARTED=1
  rm -f "$SOCK"
  start_bg containerd env PATH="$XROOT/usr/bin:$PATH" "$XROOT/usr/bin/containerd" --config "$CTRD/config.toml"
  local i
  for ((i = 0; i < 120; i++)); do
    pid_of containerd >/dev/null || { tail_log "$LOGD/containerd.log"; die "containerd exited"; }
    containerd_ok && break
    sleep 0.5
  done
  containerd_ok || { tail_log "$LOGD/containerd.log"; die "containerd not answering on $SOCK after 60s"; }
  log "containerd up ($("$XROOT/usr/bin/containerd" --version | awk '{print $3}'), socket $SOCK)"
}

# ---------------------------------------------------------------- images
stage_applets() { # DIR: /bin/busybox + /bin/<applet> symlinks, /etc/passwd,group, /tmp
  local d=$1 a
  mkdir -p "$d/bin" "$d/etc" "$d/tmp" "$d/root" "$d/home" "$d/var" "$d/usr/bin"
  chmod 1777 "$d/tmp"
  install -m 0755 "$XROOT/usr/bin/busybox" "$d/bin/busybox"
  for a in $("$XROOT/usr/bin/busybox" --list); do
    [ "$a" = busybox ] || ln -sf busybox "$d/bin/$a"
  done
  printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/home:/bin/false\n' > "$d/etc/passwd"
  printf 'root:x:0:\nnogroup:x:65534:\n' > "$d/etc/group"
}

build_image() { # KIND NAME TAR
  local kind=$1 name=$2 tar=$3 rf=$E2E/images/$1.rootfs args=() inputs=("$HERE/mkimage.py")
  case $kind in
    busybox) inputs+=("$XROOT/usr/bin/busybox") ;;
    agnhost) inputs+=("$XROOT/usr/bin/busybox" "$EBIN/agnhost") ;;
    pause) inputs+=("$EBIN/pause") ;;
  esac
  if [ -s "$tar" ]; then
    local newer=0 f
    for f in "${inputs[@]}"; do [ "$f" -nt "$tar" ] && newer=1; done
    [ $newer = 0 ] && return 0
  fi
  rm -rf "$rf"; mkdir -p "$rf"
  case $kind in
    busybox)
      stage_applets "$rf"
      args=(--cmd '["sh"]') ;;
    agnhost)   # like upstream's: /agnhost (+ agnhost-2), /uploads, user-defined-in-image, busybox applets
      stage_applets "$rf"
      install -m 0755 "$EBIN/agnhost" "$rf/agnhost"
      ln -sf agnhost "$rf/agnhost-2"
      mkdir -p "$rf/uploads" "$rf/home/user-defined-in-image"
      echo 'user-defined-in-image:x:1000:1000::/home/user-defined-in-image:/bin/sh' >> "$rf/etc/passwd"
      printf 'user-defined-in-image:x:1000:\ngroup-defined-in-image:x:50000:user-defined-in-image\n' >> "$rf/etc/group"
      args=(--entrypoint '["/agnhost"]' --cmd '["pause"]') ;;
    pause)
      install -m 0755 "$EBIN/pause" "$rf/pause"
      args=(--entrypoint '["/pause"]') ;;
  esac
  python3 "$HERE/mkimage.py" "$rf" "$name" "$tar" "${args[@]}" >/dev/null || die "mkimage.py $kind failed"
  rm -rf "$rf"
  log "built image tar $tar"
}

ensure_images() {
  mkdir -p "$E2E/images"
  local kind name tar have
  have=$(ctr_ images ls -q 2>/dev/null) || die "ctr images ls failed"
  for kind in busybox agnhost pause; do
    case $kind in busybox) name=$IMG_BUSYBOX ;; agnhost) name=$IMG_AGNHOST ;; pause) name=$IMG_PAUSE ;; esac
    tar=$E2E/images/$kind.tar
    build_image "$kind" "$name" "$tar"
    if grep -qxF "$name" <<< "$have" && [ -e "$tar.imported" ] && ! [ "$tar" -nt "$tar.imported" ]; then
      continue
    fi
    ctr_ images import "$tar" >/dev/null || die "ctr images import $tar failed"
    touch "$tar.imported"
    log "imported $name"
  done
  local alias
  for alias in "$IMG_NGINX_ALIAS" "$IMG_DNSUTILS_ALIAS"; do
    if ! grep -qxF "$alias" <<< "$have" || [ "$E2E/images/busybox.tar.imported" -nt "$E2E/images/${alias##*/}.tagged" ]; then
      ctr_ images tag --force "$IMG_BUSYBOX" "$alias" >/dev/null || die "ctr images tag $alias failed"
      touch "$E2E/images/${alias##*/}.tagged"
      log "tagged $IMG_BUSYBOX as $alias (shell only)"
    fi
  done
}

write_repo_list() {
  # test/utils/image/manifest.go: e2e image = <registry field>/<name>:<version>
  cat > "$E2E/repo-list.yaml.tmp" <<EOF
# KUBE_TEST_REPO_LIST for the e2e suite (written by scripts/e2e/node.sh): every registry of
# test/utils/image/manifest.go mapped to the made-up local registry $REG. Imported on the node:
#   $IMG_BUSYBOX, $IMG_AGNHOST, $IMG_PAUSE
#   and $IMG_NGINX_ALIAS, $IMG_DNSUTILS_ALIAS = the busybox image (for \`sh -c\` only)
gcAuthenticatedRegistry: $REG/authenticated-image-pulling
promoterE2eRegistry: $REG/e2e-test-images
buildImageRegistry: $REG/build-image
invalidRegistry: invalid.$REG/invalid
gcEtcdRegistry: $REG
gcRegistry: $REG
sigStorageRegistry: $REG/sig-storage
privateRegistry: $REG/k8s-authenticated-test
dockerLibraryRegistry: $REG/library
cloudProviderGcpRegistry: $REG/cloud-provider-gcp
EOF
  mv "$E2E/repo-list.yaml.tmp" "$E2E/repo-list.yaml"
}

# ---------------------------------------------------------------- /etc/hosts, sysctls
hosts_has_line() { grep -qF "$HOSTS_TAG" /etc/hosts; }
hosts_add() {
  hosts_has_line && return 0
  # append in place (/etc/hosts may be a bind mount: no rename)
  printf '127.0.0.1 %s %s\n' "$NODE_NAME" "$HOSTS_TAG" >> /etc/hosts
  log "/etc/hosts: $NODE_NAME -> 127.0.0.1"
}
hosts_remove() {
  hosts_has_line || return 0
  local keep
  keep=$(grep -vF "$HOSTS_TAG" /etc/hosts || true)
  printf '%s\n' "$keep" > /etc/hosts
  log "/etc/hosts: removed our $NODE_NAME line"
}
save_sysctls() { # before the kubelet (kernel tunables) and the bridge plugin (ip_forward) change them
  [ -s "$RUND/sysctl.orig" ] && return 0
  local k
  for k in $SYSCTLS; do [ -r "/proc/sys/$k" ] && echo "$k $(cat "/proc/sys/$k")"; done > "$RUND/sysctl.orig"
}
restore_sysctls() {
  [ -s "$RUND/sysctl.orig" ] || return 0
  local k v
  while read -r k v; do
    [ "$(cat "/proc/sys/$k" 2>/dev/null)" = "$v" ] || echo "$v" > "/proc/sys/$k" 2>/dev/null || true
  done < "$RUND/sysctl.orig"
  rm -f "$RUND/sysctl.orig"
  log "restored sysctls ($(echo $SYSCTLS | tr ' ' ','))"
}

# ---------------------------------------------------------------- kubelet
write_kubelet_config() {
  mkdir -p "$(dirname "$KCFG")" "$KROOT" "$E2E/pod-logs"
  cat > "$KCFG.new" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# loopback only: the apiserver reaches us via the node's Hostname address ($NODE_NAME -> 127.0.0.1 in /etc/hosts)
address: 127.0.0.1
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
containerRuntimeEndpoint: unix://$SOCK
imageServiceEndpoint: unix://$SOCK
cgroupDriver: cgroupfs
failCgroupV1: false          # this VM has cgroup v1 (hybrid)
failSwapOn: false
podLogsDir: $E2E/pod-logs
# x509 (lab CA: the apiserver's kubelet-client cert) + webhook authn/authz against the apiserver
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: $LAB/pki/ca.crt
authorization:
  mode: Webhook
# the root disk is ~87% used: default thresholds would taint DiskPressure and GC our imported images
evictionHard:
  memory.available: 100Mi
  nodefs.available: "1%"
  nodefs.inodesFree: "1%"
  imagefs.available: "1%"
  imagefs.inodesFree: "1%"
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
# no cluster DNS; and keep pods off the host's (non-loopback) nameserver
resolvConf: ""
serializeImagePulls: false
maxPods: 110
enableControllerAttachDetach: true
# no CAP_SYS_RESOURCE here: the kubelet cannot lower its own oom_score_adj (default -999)
oomScoreAdj: 0
EOF
  install_if_changed "$KCFG"
}

node_ready_since() { # EPOCH: Ready=True, heartbeat at/after EPOCH, runtime is containerd
  local out st hb rt
  out=$(kc get node "$NODE_NAME" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status} {.status.conditions[?(@.type=="Ready")].lastHeartbeatTime} {.status.nodeInfo.containerRuntimeVersion}' 2>/dev/null) || return 1
  read -r st hb rt <<< "$out"
  [ "$st" = True ] && [ -n "$hb" ] && [ "$(date -d "$hb" +%s)" -ge "$1" ] && [[ $rt == containerd://* ]]
}

start_kubelet() {
  CHANGED=0
  write_kubelet_config
  [ "${CONTAINERD_RESTARTED:-0}" = 1 ] && CHANGED=1
  if pid=$(pid_of kubelet) && [ $CHANGED = 0 ]; then
    log "kubelet already running (pid $pid)"
    wait_for 120 "node $NODE_NAME Ready" node_ready_since 0
    return 0
  fi
  local since i
  stop_bg kubelet 30
  since=$(( $(date +%s) - 1 ))
  start_bg kubelet "$EBIN/kubelet" --config="$KCFG" --kubeconfig="$NODE_KC" \
    --hostname-override="$NODE_NAME" --root-dir="$KROOT" --v=2
  for ((i = 0; i < 240; i++)); do
    pid_of kubelet >/dev/null || { tail_log "$LOGD/kubelet.log" 40; die "kubelet exited"; }
    node_ready_since "$since" && break
    sleep 0.5
  done
  node_ready_since "$since" || { tail_log "$LOGD/kubelet.log" 40; die "node $NODE_NAME not Ready (containerd runtime, fresh heartbeat) after 120s"; }
  log "node $NODE_NAME Ready on containerd ($(( $(date +%s) - since ))s)"
}

# ---------------------------------------------------------------- proofs
pod_phase() { kc -n "$CHECK_NS" get pod "$1" -o jsonpath='{.status.phase}' 2>/dev/null; }
wait_pod_ready() { # POD SECONDS
  kc -n "$CHECK_NS" wait --for=condition=Ready "pod/$1" --timeout="${2}s" >/dev/null 2>&1 && return 0
  kc -n "$CHECK_NS" describe pod "$1" | tail -25 >&2 || true
  tail_log "$LOGD/kubelet.log" 20
  die "pod $CHECK_NS/$1 not Ready after ${2}s (phase $(pod_phase "$1"))"
}
ns_gone() { ! kc get ns "$CHECK_NS" >/dev/null 2>&1; }
reset_check_ns() {
  if ! ns_gone; then
    kc delete ns "$CHECK_NS" --wait=false >/dev/null 2>&1 || true
    wait_for 120 "namespace $CHECK_NS deleted" ns_gone
  fi
  kc create ns "$CHECK_NS" >/dev/null
  # the default ServiceAccount must exist before pods can be created
  wait_for 30 "serviceaccount $CHECK_NS/default" kc -n "$CHECK_NS" get sa default
}

prove_pod() {
  local t0=$SECONDS out
  kc -n "$CHECK_NS" apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: busybox-emptydir
spec:
  nodeName: $NODE_NAME
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: $IMG_BUSYBOX
    command: ["/bin/sh", "-c", "echo hello-from-\$(hostname) > /data/f && cat /data/f && exec sleep 3600"]
    volumeMounts:
    - {name: data, mountPath: /data}
  volumes:
  - name: data
    emptyDir: {}
EOF
  wait_pod_ready busybox-emptydir 90
  out=$(kc -n "$CHECK_NS" exec busybox-emptydir -- cat /data/f) || die "kubectl exec failed"
  [ "$out" = hello-from-busybox-emptydir ] || die "exec read '$out', expected hello-from-busybox-emptydir"
  out=$(kc -n "$CHECK_NS" logs busybox-emptydir) || die "kubectl logs failed"
  [ "$out" = hello-from-busybox-emptydir ] || die "logs '$out', expected hello-from-busybox-emptydir"
  kc -n "$CHECK_NS" delete pod busybox-emptydir --timeout=60s >/dev/null || die "pod delete failed"
  log "proof 1 ok: busybox pod ran (emptyDir write/read, exec, logs), deleted ($((SECONDS - t0))s)"
}

csinode_lists_hostpath() {
  kc get csinode "$NODE_NAME" -o jsonpath='{.spec.drivers[*].name}' 2>/dev/null | tr ' ' '\n' | grep -qx hostpath.csi.k8s.io
}

prove_csi() {
  local t0=$SECONDS out vol pv
  csinode_lists_hostpath || die "CSINode $NODE_NAME does not list hostpath.csi.k8s.io"
  kc -n "$CHECK_NS" apply -f - >/dev/null <<EOF
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: csi-pvc
spec:
  storageClassName: csi-hostpath-sc
  accessModes: [ReadWriteOnce]
  resources:
    requests:
      storage: 1Mi
---
apiVersion: v1
kind: Pod
metadata:
  name: busybox-csi
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: $IMG_BUSYBOX
    command: ["/bin/sh", "-c", "echo csi-data-ok > /data/f && sync && cat /data/f && exec sleep 3600"]
    volumeMounts:
    - {name: data, mountPath: /data}
  volumes:
  - name: data
    persistentVolumeClaim:
      claimName: csi-pvc
EOF
  wait_pod_ready busybox-csi 120
  out=$(kc -n "$CHECK_NS" exec busybox-csi -- cat /data/f) || die "kubectl exec busybox-csi failed"
  [ "$out" = csi-data-ok ] || die "CSI volume read '$out', expected csi-data-ok"
  out=$(kc -n "$CHECK_NS" exec busybox-csi -- sh -c 'grep " /data " /proc/mounts') || die "no /data mount in busybox-csi"
  pv=$(kc -n "$CHECK_NS" get pvc csi-pvc -o jsonpath='{.spec.volumeName}')
  vol=$(kc get pv "$pv" -o jsonpath='{.spec.csi.volumeHandle}')
  [ "$(cat "$LAB/run/hostpath-state/$vol/f" 2>/dev/null)" = csi-data-ok ] \
    || die "file not in the hostpath driver's volume dir $LAB/run/hostpath-state/$vol"
  kc get volumeattachment -o jsonpath='{.items[*].spec.source.persistentVolumeName}' | tr ' ' '\n' | grep -qx "$pv" \
    || die "no VolumeAttachment for $pv"
  kc -n "$CHECK_NS" delete pod busybox-csi --timeout=60s >/dev/null || die "pod busybox-csi delete failed"
  kc -n "$CHECK_NS" delete pvc csi-pvc --timeout=60s >/dev/null || die "pvc delete failed"
  wait_for 60 "PV $pv deleted" bash -c "! '$KUBECTL' --kubeconfig '$ADMIN_KC' get pv '$pv' >/dev/null 2>&1"
  [ ! -e "$LAB/run/hostpath-state/$vol" ] || die "hostpath volume dir $vol still there after PV deletion"
  log "proof 2 ok: CSI PVC $pv (volume $vol) bound, attached, mounted (${out% *}), written + read back in pod and on the driver's side, unmounted, deleted ($((SECONDS - t0))s)"
}

# ---------------------------------------------------------------- down helpers
node_pods() { kc get pods -A --field-selector "spec.nodeName=$NODE_NAME" -o name 2>/dev/null | wc -l; }
no_node_pods() { [ "$(node_pods)" = 0 ]; }
delete_node_pods() {
  [ "$(node_pods)" = 0 ] && return 0
  log "deleting the $(node_pods) pod(s) on $NODE_NAME (the kubelet tears down their volumes and sandboxes)"
  local ns_name
  kc get pods -A --field-selector "spec.nodeName=$NODE_NAME" -o jsonpath='{range .items[*]}{.metadata.namespace}/{.metadata.name}{"\n"}{end}' |
    while IFS=/ read -r ns name; do kc -n "$ns" delete pod "$name" --wait=false >/dev/null 2>&1 || true; done
  local i
  for ((i = 0; i < 180; i++)); do no_node_pods && break; sleep 0.5; done
  if ! no_node_pods; then
    log "pods still there after 90s: force-deleting"
    kc get pods -A --field-selector "spec.nodeName=$NODE_NAME" -o jsonpath='{range .items[*]}{.metadata.namespace}/{.metadata.name}{"\n"}{end}' |
      while IFS=/ read -r ns name; do kc -n "$ns" delete pod "$name" --grace-period=0 --force >/dev/null 2>&1 || true; done
  fi
  # let the kubelet finish unmounting / stopping sandboxes (bounded)
  for ((i = 0; i < 30; i++)); do
    findmnt -rn -o TARGET | grep -q "^$KROOT/pods/" || break
    sleep 1
  done
}
umount_under() { # DIR: unmount everything mounted below DIR (deepest first); DIR itself too
  local d=$1 m
  findmnt -rn -o TARGET | awk -v d="$d" 'index($0, d "/") == 1 || $0 == d' | sort -r | while read -r m; do
    m=$(printf '%b' "$m")   # findmnt -r escapes blanks as \x20
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || log "could not unmount $m"
  done
}
kill_leftover_tasks() {
  containerd_ok || return 0
  local ids id
  ids=$(ctr_ tasks ls -q 2>/dev/null || true)
  [ -n "$ids" ] || return 0
  log "killing $(wc -w <<< "$ids") leftover container task(s)"
  for id in $ids; do ctr_ tasks kill -s SIGKILL "$id" >/dev/null 2>&1 || true; done
  sleep 1
  for id in $ids; do ctr_ tasks delete -f "$id" >/dev/null 2>&1 || true; done
}
cleanup_network() {
  if ip link show "$CNI_BRIDGE" >/dev/null 2>&1; then
    ip link del "$CNI_BRIDGE" 2>/dev/null && log "deleted bridge $CNI_BRIDGE" || true
  fi
  # ipMasq rules of sandboxes not torn down by CNI DEL (comment: name: "lab-e2e" id: "...")
  local rule chain
  iptables-save -t nat 2>/dev/null | grep -F "name: \\\"$CNI_NET\\\"" | grep '^-A POSTROUTING' | while read -r rule; do
    chain=$(sed -n 's/.* -j \(CNI-[0-9a-f]*\).*/\1/p' <<< "$rule")
    eval "iptables -t nat ${rule/-A /-D }" 2>/dev/null || true
    [ -n "$chain" ] && { iptables -t nat -F "$chain" 2>/dev/null; iptables -t nat -X "$chain" 2>/dev/null; } || true
  done || true
  # host-local reservations (nothing is running any more)
  rm -rf "${CNI_DATA:?}/$CNI_NET"
  # the kubelet's own chains (KUBE-FIREWALL guards 127.0.0.0/8 against non-local sources; canaries, hint)
  local ipt t
  for ipt in iptables ip6tables; do
    command -v $ipt >/dev/null || continue
    for t in INPUT OUTPUT; do
      while $ipt -t filter -D $t -j KUBE-FIREWALL 2>/dev/null; do :; done
    done
    $ipt -t filter -F KUBE-FIREWALL 2>/dev/null || true
    $ipt -t filter -X KUBE-FIREWALL 2>/dev/null || true
    for t in mangle nat filter; do
      $ipt -t $t -F KUBE-KUBELET-CANARY 2>/dev/null || true
      $ipt -t $t -X KUBE-KUBELET-CANARY 2>/dev/null || true
      $ipt -t $t -X KUBE-IPTABLES-HINT 2>/dev/null || true
    done
  done
  return 0
}

# ---------------------------------------------------------------- subcommands
cmd_up() {
  local t0=$SECONDS
  mkdir -p "$RUND" "$LOGD"
  exec 8>"$RUND/node.lock"; flock -w 600 8 || die "could not lock $RUND/node.lock"
  [ -x "$KUBECTL" ] || die "$KUBECTL missing"
  kc get --raw /readyz >/dev/null 2>&1 || die "apiserver not ready (run $LAB/start-cluster.sh)"
  ensure_packages
  # the hollow kubelet goes away for good (its pid file is removed; status.sh shows kubemark: down)
  "$LAB/stop-all.sh" kubemark >/dev/null
  save_sysctls
  start_containerd
  ensure_images
  write_repo_list
  hosts_add
  start_kubelet
  if [ "${SKIP_CHECK:-0}" != 1 ]; then
    reset_check_ns
    prove_pod
  fi
  log "(re)starting the lab's CSI components (start-csi.sh) so the registrar registers with this kubelet"
  "$LAB/start-csi.sh" 9>&- 8>&- | sed 's/^/  /' || die "start-csi.sh failed"
  wait_for 30 "CSINode $NODE_NAME lists hostpath.csi.k8s.io" csinode_lists_hostpath
  if [ "${SKIP_CHECK:-0}" != 1 ]; then
    prove_csi
    kc delete ns "$CHECK_NS" --wait=false >/dev/null
    wait_for 60 "namespace $CHECK_NS deleted" ns_gone
  fi
  log "up in $((SECONDS - t0))s: real kubelet on $NODE_NAME; KUBE_TEST_REPO_LIST=$E2E/repo-list.yaml"
}

cmd_down() {
  local t0=$SECONDS
  mkdir -p "$RUND" "$LOGD"
  exec 8>"$RUND/node.lock"; flock -w 600 8 || die "could not lock $RUND/node.lock"
  if pid_of kubelet >/dev/null && kc get --raw /readyz >/dev/null 2>&1; then
    kc delete ns "$CHECK_NS" --wait=false >/dev/null 2>&1 || true
    delete_node_pods
  fi
  stop_bg kubelet 30
  kill_leftover_tasks
  stop_bg containerd 20
  # kubelet: pod volume mounts and its rshared self-bind of the root dir; containerd: rootfs/shm mounts
  umount_under "$KROOT"
  umount_under "$CTRD"
  # containerd's fixed runtime dirs (shim sockets, fifos): remove them when empty
  [ -d /run/containerd ] && find /run/containerd -depth -type d -empty -delete 2>/dev/null || true
  cleanup_network
  hosts_remove
  restore_sysctls
  "$LAB/start-kubemark.sh" 8>&- | sed 's/^/  /' || die "start-kubemark.sh failed"
  # the registrar's socket is still in plugins_registry: kubemark's plugin watcher registers it again
  if pid=$(cat "$LAB/run/csi-node-driver-registrar.pid" 2>/dev/null) && alive "$pid"; then
    wait_for 30 "CSINode $NODE_NAME lists hostpath.csi.k8s.io (kubemark)" csinode_lists_hostpath
  fi
  "$LAB/status.sh" | sed 's/^/  /'
  "$LAB/status.sh" | grep -q ': down$' && log "WARNING: some lab process is down (see above)"
  log "down in $((SECONDS - t0))s: kubemark is the node again"
}

cmd_status() {
  local pid rt ready
  if pid=$(pid_of containerd); then
    echo "containerd: up (pid $pid, $SOCK$(containerd_ok || echo ', NOT answering'))"
  else echo "containerd: down"; fi
  if pid=$(pid_of kubelet); then echo "kubelet: up (pid $pid, root $KROOT)"; else echo "kubelet: down"; fi
  if [ -S "$SOCK" ] && containerd_ok; then
    local have n=0 i
    have=$(ctr_ images ls -q 2>/dev/null)
    for i in "$IMG_BUSYBOX" "$IMG_AGNHOST" "$IMG_PAUSE" "$IMG_NGINX_ALIAS" "$IMG_DNSUTILS_ALIAS"; do grep -qxF "$i" <<< "$have" && n=$((n + 1)); done
    echo "images: $n/5 present ($IMG_BUSYBOX $IMG_AGNHOST $IMG_PAUSE; $IMG_NGINX_ALIAS and $IMG_DNSUTILS_ALIAS = busybox)"
  else echo "images: (containerd down)"; fi
  if hosts_has_line; then echo "/etc/hosts: $NODE_NAME -> 127.0.0.1 (ours)"; else echo "/etc/hosts: no line of ours"; fi
  if [ -s "$E2E/repo-list.yaml" ]; then echo "repo-list: $E2E/repo-list.yaml"; else echo "repo-list: missing"; fi
  if pid=$(cat "$LAB/run/kubemark.pid" 2>/dev/null) && alive "$pid"; then echo "kubemark: up (pid $pid)"; else echo "kubemark: down"; fi
  rt=$(kc get node "$NODE_NAME" -o jsonpath='{.status.nodeInfo.containerRuntimeVersion}' 2>/dev/null || true)
  ready=$(kc get node "$NODE_NAME" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null || true)
  echo "node $NODE_NAME: ${ready:+Ready=}${ready:-absent}${rt:+ runtime $rt}"
  echo "csinode $NODE_NAME: drivers [$(kc get csinode "$NODE_NAME" -o jsonpath='{.spec.drivers[*].name}' 2>/dev/null || true)]"
}

case ${1:-} in
  up) cmd_up ;;
  down) cmd_down ;;
  status) cmd_status ;;
  *) echo "usage: LAB=<lab dir> $0 up|down|status" >&2; exit 2 ;;
esac
