#!/usr/bin/env bash
# scale-population.sh: builds (and tears down) a large, settled population of CSI API objects of the lab's
# hostpath driver (hostpath.csi.k8s.io) in one namespace, to measure sidecars (ours or upstream's) against a
# big cluster. Every object is written in the state its controllers would leave it in, so no controller and
# no sidecar has work left and the driver is never called for any of it. No lab flag is changed. Every wait
# is bounded.
#
#   scale-population.sh up        create what is missing of:
#                       PAIRS bound PVC+PV pairs: PV <NS>-pv-N (csi driver hostpath.csi.k8s.io, volumeHandle
#                         <NS>-vol-N, 1Mi, RWO, Retain, class csi-hostpath-sc, claimRef to its PVC with uid,
#                         annotation pv.kubernetes.io/provisioned-by), PVC pvc-N (volumeName set, annotations
#                         pv.kubernetes.io/bind-completed and bound-by-controller "yes"), both status.phase Bound
#                         (the PVC also status accessModes and capacity), written here as the PV controller writes
#                         them: kube-controller-manager left to itself binds ~2.5 pairs/s (--kube-api-qps 20).
#                         Order: a batch of PVs (claimRef without uid), their PVCs, the PVs' claimRef uid and
#                         status; annotations + PVC status in a second pass. csi-resizer logs an error for a PVC
#                         whose PV it has not seen yet; kube-controller-manager marks an annotated claim Lost
#                         (ClaimMisbound) while its PV's claimRef has no uid. It still binds some pairs itself
#                         meanwhile, which ends in the same state.
#                       ATTACHMENTS VolumeAttachments <NS>-va-N (attacher hostpath.csi.k8s.io, node NODE,
#                         PV <NS>-pv-N, finalizer external-attacher/hostpath-csi-k8s-io, status attached: true;
#                         the PV has that finalizer too, as csi-attacher leaves it). They are made BEFORE their
#                         PVs: csi-attacher, when it sees a VA before its status is written, fails on the missing
#                         PV instead of calling ControllerPublishVolume; attachErrors it saves are cleared at the
#                         end. (VAs added later to existing PVs, e.g. ATTACHMENTS raised on a second up, race:
#                         csi-attacher calls ControllerPublishVolume (NotFound) for some.) VA names are not the
#                         attach-detach controller's csi-<sha256> names, so a kube-controller-manager restart
#                         (which marks VAs it does not know uncertain and detaches them by that name) keeps them.
#                       SNAPSHOTS pre-provisioned VolumeSnapshotContents <NS>-snapcontent-N (Retain, snapshotHandle
#                         <NS>-snap-N, class csi-hostpath-snapclass, finalizer ...volumesnapshotcontent-bound-protection,
#                         status readyToUse/snapshotHandle/creationTime/restoreSize 1Mi) and VolumeSnapshots snap-N
#                         bound to them (finalizer ...volumesnapshot-as-source-protection, status as snapshot-controller
#                         writes it). A content is created with driver placeholder.scale-population.invalid and gets
#                         driver hostpath.csi.k8s.io only once its status is written: csi-snapshotter never sees it
#                         without status (it would call ListSnapshots for it and save an error). snapshot-controller
#                         (--kube-api-qps 5) may still bind a few snapshots itself (events SnapshotCreated/Ready) or,
#                         its content cache lagging the uid, mark one SnapshotMisbound until the next sync; all end
#                         ready.
#                       SNAP_BIND=controller leaves the VolumeSnapshots' binding (content uid, VS status) to the
#                         lab's snapshot-controller and measures it (--kube-api-qps 5: ~1.2 snapshots/s).
#                       Prints per-phase wall time, objects/s and requests/s, then the status counts.
#   scale-population.sh status    counts: PVC/PV (Bound), VA (attached, attachError), VSC/VS (readyToUse, bound)
#   scale-population.sh down      delete all of it, then the namespace. This script removes the finalizers: a VA's,
#                       a snapshot's and a content's before the delete (csi-attacher and csi-snapshotter never see
#                       them terminating), a PVC's and a PV's after it (the protection controllers would re-add
#                       them); PVs are Retain, so nothing reaches the driver.
#
# Idempotent: up skips what exists and finishes half-made objects; it refuses a PV whose claimRef uid is not its
# PVC's (run down first). Everything carries the labels csi-sidecars.scale=population and
# csi-sidecars.scale/namespace=<NS>. Objects are streamed by PARALLEL client threads (Python 3 standard library,
# admin client certificate of $LAB/kubeconfig, one keep-alive connection each): on the lab's 2 cores (shared with a
# compiler) ~240 requests/s for core objects, ~100/s for snapshot CRs; 100000/10000/10000 took 46 min.
# With 100000 pairs kube-controller-manager stays busy (~60% of a core: its PV controller resyncs every claim and
# volume every 15 s; its expand controller GETs the PV of every Bound PVC event at 20/s, ~80 min after a build).
#
# Env: LAB (the lab directory, required), NS (scale), PAIRS (100000), ATTACHMENTS (10000, <= PAIRS), SNAPSHOTS (10000),
# PARALLEL (6), NODE (lab-node-1), SNAP_BIND (write|controller), BIND_TIMEOUT (600 s: wait for all Bound / ready after
# creation; 7200 with SNAP_BIND=controller), DOWN_TIMEOUT (600 s), PROGRESS (15 s between progress lines).
set -uo pipefail
LAB=${LAB:?set LAB to the lab directory}
KUBECTL=$LAB/bin/kubectl
ADMIN_KC=$LAB/kubeconfig

log() { echo "[scale $(date +%H:%M:%S)] $*" >&2; }
die() { echo "[scale $(date +%H:%M:%S)] ERROR: $*" >&2; exit 1; }
kc() { "$KUBECTL" --kubeconfig "$ADMIN_KC" "$@"; }
usage() { sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2; }

cmd=${1:-}
case $cmd in up | status | down) ;; *) usage ;; esac

export NS=${NS:-scale} PAIRS=${PAIRS:-100000} ATTACHMENTS=${ATTACHMENTS:-10000} SNAPSHOTS=${SNAPSHOTS:-10000}
export PARALLEL=${PARALLEL:-6} NODE=${NODE:-lab-node-1} SNAP_BIND=${SNAP_BIND:-write}
export DOWN_TIMEOUT=${DOWN_TIMEOUT:-600} PROGRESS=${PROGRESS:-15}
if [ "$SNAP_BIND" = controller ]; then export BIND_TIMEOUT=${BIND_TIMEOUT:-7200}; else export BIND_TIMEOUT=${BIND_TIMEOUT:-600}; fi
for v in PAIRS ATTACHMENTS SNAPSHOTS PARALLEL BIND_TIMEOUT DOWN_TIMEOUT PROGRESS; do
  [[ ${!v} =~ ^[0-9]+$ ]] || die "$v must be a non-negative integer (is '${!v}')"
done
[ "$PARALLEL" -ge 1 ] || die "PARALLEL must be >= 1"
[ "$ATTACHMENTS" -le "$PAIRS" ] || die "ATTACHMENTS ($ATTACHMENTS) must not exceed PAIRS ($PAIRS): each VA uses one PV"
case $SNAP_BIND in write | controller) ;; *) die "SNAP_BIND must be write or controller" ;; esac
[[ $NS =~ ^[a-z0-9]([-a-z0-9]{0,40}[a-z0-9])?$ ]] || die "NS '$NS' is not a valid (short) namespace name"
[ -x "$KUBECTL" ] || die "$KUBECTL missing"
[ -s "$ADMIN_KC" ] || die "$ADMIN_KC missing"
command -v python3 >/dev/null || die "python3 missing"

# admin credentials for the client threads, in a private temporary directory
CRED=$(mktemp -d "${TMPDIR:-/tmp}/scale-population.XXXXXX") || die "mktemp failed"
trap 'rm -rf "$CRED"' EXIT
chmod 700 "$CRED"
kcfield() { kc config view --raw --minify -o jsonpath="{$1}"; }
export API_SERVER KC_CA=$CRED/ca.crt KC_CERT=$CRED/client.crt KC_KEY=$CRED/client.key
API_SERVER=$(kcfield '.clusters[0].cluster.server') || die "cannot read $ADMIN_KC"
kcfield '.clusters[0].cluster.certificate-authority-data' | base64 -d > "$KC_CA" &&
  kcfield '.users[0].user.client-certificate-data' | base64 -d > "$KC_CERT" &&
  kcfield '.users[0].user.client-key-data' | base64 -d > "$KC_KEY" || die "cannot extract credentials from $ADMIN_KC"
[ -s "$KC_CA" ] && [ -s "$KC_CERT" ] && [ -s "$KC_KEY" ] || die "$ADMIN_KC has no embedded CA/client certificate"

python3 -u - "$cmd" <<'PY'
import http.client, json, os, ssl, sys, threading, time, urllib.parse

E = os.environ
CMD = sys.argv[1]
NS, NODE, SNAP_BIND = E["NS"], E["NODE"], E["SNAP_BIND"]
PAIRS, ATT, SNAPS, PAR = (int(E[k]) for k in ("PAIRS", "ATTACHMENTS", "SNAPSHOTS", "PARALLEL"))
BIND_TIMEOUT, DOWN_TIMEOUT, PROGRESS = (int(E[k]) for k in ("BIND_TIMEOUT", "DOWN_TIMEOUT", "PROGRESS"))
DRIVER = "hostpath.csi.k8s.io"
PLACEHOLDER_DRIVER = "placeholder.scale-population.invalid"
SC, SNAPCLASS = "csi-hostpath-sc", "csi-hostpath-snapclass"
ATT_FIN = "external-attacher/hostpath-csi-k8s-io"
VSC_FIN = "snapshot.storage.kubernetes.io/volumesnapshotcontent-bound-protection"
VS_FIN = "snapshot.storage.kubernetes.io/volumesnapshot-as-source-protection"
LABELS = {"csi-sidecars.scale": "population", "csi-sidecars.scale/namespace": NS}
SEL = urllib.parse.quote(",".join(f"{k}={v}" for k, v in LABELS.items()))
FM = "fieldManager=scale-population"
W = max(6, len(str(max(PAIRS, SNAPS, 1))))
SIZE, SIZE_Q = 1048576, "1Mi"
PAIR_BATCH = 50

P_PVC = f"/api/v1/namespaces/{NS}/persistentvolumeclaims"
P_PV = "/api/v1/persistentvolumes"
P_VA = "/apis/storage.k8s.io/v1/volumeattachments"
P_VSC = "/apis/snapshot.storage.k8s.io/v1/volumesnapshotcontents"
P_VS = f"/apis/snapshot.storage.k8s.io/v1/namespaces/{NS}/volumesnapshots"

def pvc_name(i): return f"pvc-{i:0{W}d}"
def pv_name(i): return f"{NS}-pv-{i:0{W}d}"
def va_name(i): return f"{NS}-va-{i:0{W}d}"
def vsc_name(i): return f"{NS}-snapcontent-{i:0{W}d}"
def vs_name(i): return f"snap-{i:0{W}d}"

def log(msg): print(f"[scale {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)
def out(msg): print(msg, flush=True)

# ------------------------------------------------------------------ HTTP client (one keep-alive connection per thread)
u = urllib.parse.urlparse(E["API_SERVER"])
CTX = ssl.create_default_context(cafile=E["KC_CA"])
CTX.load_cert_chain(E["KC_CERT"], E["KC_KEY"])
TL = threading.local()
LOCK = threading.Lock()
COUNT = {"req": 0, "created": 0}

def bump(key, n=1):
    with LOCK:
        COUNT[key] += n

class ApiError(Exception):
    pass

def call(method, path, body=None, ctype="application/json", tries=8):
    data = None if body is None else json.dumps(body, separators=(",", ":")).encode()
    hdr = {"Accept": "application/json"}
    if data is not None:
        hdr["Content-Type"] = ctype
    delay, err = 0.2, ""
    for _ in range(tries):
        c = getattr(TL, "conn", None)
        if c is None:
            c = TL.conn = http.client.HTTPSConnection(u.hostname, u.port or 443, context=CTX, timeout=120)
        try:
            c.request(method, path, body=data, headers=hdr)
            r = c.getresponse()
            raw = r.read()
        except (OSError, http.client.HTTPException) as e:
            c.close()
            TL.conn, err = None, f"{type(e).__name__}: {e}"
            time.sleep(delay); delay = min(delay * 2, 5)
            continue
        bump("req")
        if r.status in (429, 500, 502, 503, 504):
            err = f"HTTP {r.status} {raw[:200]!r}"
            time.sleep(delay); delay = min(delay * 2, 5)
            continue
        try:
            obj = json.loads(raw) if raw else None
        except ValueError:
            obj = None
        return r.status, obj
    raise ApiError(f"{method} {path}: giving up after {tries} tries: {err}")

def fail(method, path, st, o):
    msg = o.get("message") if isinstance(o, dict) else o
    raise ApiError(f"{method} {path}: HTTP {st}: {msg}")

def create(path, name, body):
    """POST body; on AlreadyExists return the existing object. Returns the object."""
    st, o = call("POST", f"{path}?{FM}", body)
    if st in (200, 201):
        bump("created")
        return o
    if st == 409:
        st, o = call("GET", f"{path}/{name}")
        if st == 200:
            return o
    fail("POST", f"{path} ({name})", st, o)

def patch(path, body, ok404=False):
    st, o = call("PATCH", f"{path}?{FM}", body, "application/merge-patch+json")
    if st == 200 or (ok404 and st == 404):
        return o
    fail("PATCH", path, st, o)

def delete(path):
    """DELETE; returns True if the object may still exist (finalizers left on it)."""
    st, o = call("DELETE", path)
    if st == 404:
        return False
    if st not in (200, 202):
        fail("DELETE", path, st, o)
    md = (o or {}).get("metadata") or {}
    return bool(md.get("finalizers"))

def list_all(path, extract, selector=True, chunk=2000):
    """Paginated LIST; returns {name: extract(item)}."""
    res, cont = {}, ""
    while True:
        q = f"limit={chunk}" + (f"&labelSelector={SEL}" if selector else "")
        if cont:
            q += "&continue=" + urllib.parse.quote(cont)
        st, o = call("GET", f"{path}?{q}")
        if st == 404:
            return res
        if st != 200:
            fail("GET", path, st, o)
        for it in o.get("items") or []:
            res[it["metadata"]["name"]] = extract(it)
        cont = (o.get("metadata") or {}).get("continue") or ""
        if not cont:
            return res

def idx(name):
    try:
        return int(name.rsplit("-", 1)[1])
    except (IndexError, ValueError):
        return None

# ------------------------------------------------------------------ phases
SUMMARY = []
FAILED = []

def run_phase(name, items, fn, unit="items", weight=None):
    """Runs fn(item) for every item on PAR threads; prints progress and a summary line. weight(item): how many
    units an item is (a batch)."""
    items = list(items)
    w = weight or (lambda _: 1)
    n = sum(w(it) for it in items)
    state = {"next": 0, "done": 0, "errs": []}
    c0, r0, t0 = COUNT["created"], COUNT["req"], time.time()
    if n == 0:
        log(f"{name}: nothing to do")
        SUMMARY.append((name, 0, 0, 0, 0.0))
        return
    log(f"{name}: {n} {unit}, {PAR} threads")

    def worker():
        while True:
            with LOCK:
                k = state["next"]
                state["next"] += 1
            if k >= len(items):
                return
            try:
                fn(items[k])
            except Exception as e:  # recorded, the phase goes on
                with LOCK:
                    it = items[k]
                    state["errs"].append(f"{f'{it[0]}..{it[-1]}' if isinstance(it, list) else it}: {e}")
            with LOCK:
                state["done"] += w(items[k])

    stop = threading.Event()
    def monitor():
        while not stop.wait(PROGRESS):
            dt = time.time() - t0
            log(f"{name}: {state['done']}/{n} {unit} in {dt:.0f}s ({state['done']/dt:.1f}/s, "
                f"{(COUNT['created']-c0)/dt:.1f} objects/s, {(COUNT['req']-r0)/dt:.0f} req/s), errors {len(state['errs'])}")
    threads = [threading.Thread(target=worker, daemon=True) for _ in range(min(PAR, len(items)))]
    mon = threading.Thread(target=monitor, daemon=True)
    mon.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    dt = max(time.time() - t0, 1e-6)
    created, reqs = COUNT["created"] - c0, COUNT["req"] - r0
    SUMMARY.append((name, n, created, reqs, dt))
    log(f"{name}: done {n} {unit} in {dt:.1f}s: {n/dt:.1f} {unit}/s, {created} objects created ({created/dt:.1f}/s), "
        f"{reqs} requests ({reqs/dt:.0f}/s), errors {len(state['errs'])}")
    if state["errs"]:
        for e in state["errs"][:10]:
            log(f"  error: {e}")
        FAILED.append(f"{name}: {len(state['errs'])} errors")

def print_summary(total):
    out("")
    out(f"{'phase':<28} {'items':>8} {'created':>8} {'requests':>9} {'seconds':>9} {'items/s':>8} {'objects/s':>9} {'req/s':>7}")
    for name, n, created, reqs, dt in SUMMARY:
        if name.startswith("  until"):
            out(f"{name:<28} {n:>8} {'':>8} {'':>9} {dt:>9.1f}")
            continue
        if dt <= 0:
            out(f"{name:<28} {n:>8} {created:>8} {reqs:>9} {'-':>9}")
            continue
        out(f"{name:<28} {n:>8} {created:>8} {reqs:>9} {dt:>9.1f} {n/dt:>8.1f} {created/dt:>9.1f} {reqs/dt:>7.0f}")
    out(f"total wall time {total:.1f}s")

# ------------------------------------------------------------------ scanning
def sget(o, *path):
    for p in path:
        if not isinstance(o, dict):
            return None
        o = o.get(p)
    return o

def scan(what=("pvc", "pv", "va", "vsc", "vs")):
    t0 = time.time()
    s = {}
    if "pvc" in what:
        s["pvc"] = list_all(P_PVC, lambda o: (o["metadata"]["uid"], sget(o, "status", "phase"),
                                              bool(o["metadata"].get("finalizers")), "deletionTimestamp" in o["metadata"],
                                              all((o["metadata"].get("annotations") or {}).get(k) == "yes" for k in PVC_ANN)))
    if "pv" in what:
        s["pv"] = list_all(P_PV, lambda o: (sget(o, "spec", "claimRef", "uid"), sget(o, "status", "phase"),
                                            tuple(o["metadata"].get("finalizers") or ()), "deletionTimestamp" in o["metadata"]))
    if "va" in what:
        s["va"] = list_all(P_VA, lambda o: (bool(sget(o, "status", "attached")), sget(o, "status", "attachError") is not None,
                                            bool(o["metadata"].get("finalizers")), "deletionTimestamp" in o["metadata"]))
    if "vsc" in what:
        s["vsc"] = list_all(P_VSC, lambda o: (sget(o, "spec", "driver"), sget(o, "status", "readyToUse") is True,
                                              sget(o, "spec", "volumeSnapshotRef", "uid"),
                                              bool(o["metadata"].get("finalizers")), "deletionTimestamp" in o["metadata"]))
    if "vs" in what:
        s["vs"] = list_all(P_VS, lambda o: (o["metadata"]["uid"], sget(o, "status", "readyToUse") is True,
                                            bool(sget(o, "status", "boundVolumeSnapshotContentName")),
                                            bool(o["metadata"].get("finalizers")), "deletionTimestamp" in o["metadata"]))
    return s, time.time() - t0

def print_status(s, dt=None):
    pvc, pv, va, vsc, vs = (s.get(k, {}) for k in ("pvc", "pv", "va", "vsc", "vs"))
    st, o = call("GET", f"/api/v1/namespaces/{NS}")
    nsphase = sget(o, "status", "phase") if st == 200 else "absent"
    out(f"namespace {NS}: {nsphase}")
    out(f"PersistentVolumeClaims  {len(pvc):>7}  Bound {sum(1 for x in pvc.values() if x[1] == 'Bound'):>7}"
        f"  deleting {sum(1 for x in pvc.values() if x[3])}")
    out(f"PersistentVolumes       {len(pv):>7}  Bound {sum(1 for x in pv.values() if x[1] == 'Bound'):>7}"
        f"  deleting {sum(1 for x in pv.values() if x[3])}")
    out(f"VolumeAttachments       {len(va):>7}  attached {sum(1 for x in va.values() if x[0]):>7}"
        f"  attachError {sum(1 for x in va.values() if x[1])}  deleting {sum(1 for x in va.values() if x[3])}")
    out(f"VolumeSnapshotContents  {len(vsc):>7}  readyToUse {sum(1 for x in vsc.values() if x[1]):>7}"
        f"  driver {DRIVER} {sum(1 for x in vsc.values() if x[0] == DRIVER)}  deleting {sum(1 for x in vsc.values() if x[4])}")
    out(f"VolumeSnapshots         {len(vs):>7}  readyToUse {sum(1 for x in vs.values() if x[1]):>7}"
        f"  bound {sum(1 for x in vs.values() if x[2])}  deleting {sum(1 for x in vs.values() if x[4])}")
    if dt is not None:
        out(f"(listed in {dt:.1f}s)")

# ------------------------------------------------------------------ up
def preflight():
    checks = [(f"/apis/storage.k8s.io/v1/storageclasses/{SC}", f"StorageClass {SC}"),
              (f"/api/v1/nodes/{NODE}", f"node {NODE}"),
              (f"/apis/storage.k8s.io/v1/csidrivers/{DRIVER}", f"CSIDriver {DRIVER}")]
    if SNAPS:
        checks += [("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/volumesnapshots.snapshot.storage.k8s.io", "VolumeSnapshot CRD"),
                   ("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/volumesnapshotcontents.snapshot.storage.k8s.io", "VolumeSnapshotContent CRD"),
                   (f"/apis/snapshot.storage.k8s.io/v1/volumesnapshotclasses/{SNAPCLASS}", f"VolumeSnapshotClass {SNAPCLASS}")]
    for path, what in checks:
        st, o = call("GET", path)
        if st != 200:
            fail("GET", f"{path} ({what} needed)", st, o)
        if "volumesnapshotclasses" in path and o.get("driver") != DRIVER:
            raise ApiError(f"VolumeSnapshotClass {SNAPCLASS} has driver {o.get('driver')}, not {DRIVER}")
    st, o = call("GET", f"/api/v1/namespaces/{NS}")
    if st == 200 and "deletionTimestamp" in o["metadata"]:
        raise ApiError(f"namespace {NS} is being deleted; wait for it to go (or run down) first")
    if st == 404:
        create("/api/v1/namespaces", NS, {"apiVersion": "v1", "kind": "Namespace",
                                          "metadata": {"name": NS, "labels": LABELS}})
        log(f"namespace {NS} created")

def pvc_body(i):
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": pvc_name(i), "namespace": NS, "labels": LABELS},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": SIZE_Q}},
                     "storageClassName": SC, "volumeMode": "Filesystem", "volumeName": pv_name(i)}}

def pv_body(i):
    md = {"name": pv_name(i), "labels": LABELS,
          "annotations": {"pv.kubernetes.io/provisioned-by": DRIVER}}
    if i <= ATT:
        md["finalizers"] = [ATT_FIN]  # as csi-attacher leaves an attached volume's PV
    return {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": md,
            "spec": {"capacity": {"storage": SIZE_Q}, "accessModes": ["ReadWriteOnce"],
                     "persistentVolumeReclaimPolicy": "Retain", "storageClassName": SC, "volumeMode": "Filesystem",
                     "csi": {"driver": DRIVER, "volumeHandle": f"{NS}-vol-{i:0{W}d}"},
                     "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": NS,
                                  "name": pvc_name(i)}}}

PVC_ANN = ("pv.kubernetes.io/bind-completed", "pv.kubernetes.io/bound-by-controller")
# the PVC status strategy keeps metadata changes: annotations and status in one request
PVC_STATUS = {"metadata": {"annotations": {k: "yes" for k in PVC_ANN}},
              "status": {"phase": "Bound", "accessModes": ["ReadWriteOnce"], "capacity": {"storage": SIZE_Q}}}
PV_STATUS = {"status": {"phase": "Bound"}}
VA_STATUS = {"status": {"attached": True, "attachError": None}}

def make_pairs(batch, S):
    """A batch of pairs, step by step: PVs (claimRef without uid yet), PVCs, PVs' claimRef uid, PVs' status. The
    PVCs' status comes in a later phase. Batching puts ~1 s between a PV and its PVC: a PVC whose PV is not yet in
    its informer cache makes csi-resizer log an error."""
    errs = []
    def each(step, items):
        res = []
        for it in items:
            try:
                res.append(step(*it) if isinstance(it, tuple) else step(it))
            except Exception as e:
                errs.append(f"{it if not isinstance(it, tuple) else it[0]}: {e}")
        return res
    def mk_pv(i):
        pv = S["pv"].get(pv_name(i))
        if pv is None:
            o = create(P_PV, pv_name(i), pv_body(i))
            pv = (sget(o, "spec", "claimRef", "uid"), sget(o, "status", "phase"), True, "deletionTimestamp" in o["metadata"])
        if pv[3]:
            raise ApiError(f"PV {pv_name(i)} is being deleted")
        return (i, pv)
    def mk_pvc(i, pv):
        pvc = S["pvc"].get(pvc_name(i))
        if pvc is None:
            o = create(P_PVC, pvc_name(i), pvc_body(i))
            pvc = (o["metadata"]["uid"], sget(o, "status", "phase"), True, "deletionTimestamp" in o["metadata"], False)
        if pvc[3]:
            raise ApiError(f"PVC {pvc_name(i)} is being deleted")
        return (i, pv, pvc)
    def bind_pv(i, pv, pvc):
        if not pv[0]:
            patch(f"{P_PV}/{pv_name(i)}", {"spec": {"claimRef": {"uid": pvc[0]}}})
        elif pv[0] != pvc[0]:
            raise ApiError(f"PV {pv_name(i)} claimRef uid {pv[0]} is not PVC {pvc_name(i)}'s uid {pvc[0]} (run down first)")
        return (i, pv)
    def pv_status(i, pv):
        if pv[1] != "Bound":
            patch(f"{P_PV}/{pv_name(i)}/status", PV_STATUS)
    each(pv_status, each(bind_pv, each(mk_pvc, each(mk_pv, batch))))
    if errs:
        raise ApiError("; ".join(errs[:5]) + (f" (+{len(errs) - 5} more)" if len(errs) > 5 else ""))

def make_va(i, S):
    pv = S["pv"].get(pv_name(i))
    if pv is not None and ATT_FIN not in pv[2]:  # PV made by an earlier run with fewer ATTACHMENTS
        patch(f"{P_PV}/{pv_name(i)}", {"metadata": {"finalizers": [ATT_FIN] + list(pv[2])}})
    va = S["va"].get(va_name(i))
    if va is None:
        o = create(P_VA, va_name(i), {
            "apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachment",
            "metadata": {"name": va_name(i), "labels": LABELS, "finalizers": [ATT_FIN]},
            "spec": {"attacher": DRIVER, "nodeName": NODE, "source": {"persistentVolumeName": pv_name(i)}}})
        va = (bool(sget(o, "status", "attached")), sget(o, "status", "attachError") is not None)
    if not va[0] or va[1]:
        patch(f"{P_VA}/{va_name(i)}/status", VA_STATUS)

SNAP_NS = int(time.time()) * 10**9  # creationTime of every content (ns); the VS gets the same instant
SNAP_RFC = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(SNAP_NS // 10**9))

def make_snapshot(i, S):
    name_c, name_s = vsc_name(i), vs_name(i)
    handle = f"{NS}-snap-{i:0{W}d}"
    c = S["vsc"].get(name_c)
    if c is None:
        o = create(P_VSC, name_c, {
            "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotContent",
            "metadata": {"name": name_c, "labels": LABELS, "finalizers": [VSC_FIN]},
            "spec": {"deletionPolicy": "Retain", "driver": PLACEHOLDER_DRIVER, "source": {"snapshotHandle": handle},
                     "volumeSnapshotClassName": SNAPCLASS,
                     "volumeSnapshotRef": {"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
                                           "name": name_s, "namespace": NS}}})
        c = (sget(o, "spec", "driver"), sget(o, "status", "readyToUse") is True, sget(o, "spec", "volumeSnapshotRef", "uid"))
    if not c[1]:
        patch(f"{P_VSC}/{name_c}/status", {"status": {"snapshotHandle": handle, "readyToUse": True,
                                                      "creationTime": SNAP_NS, "restoreSize": SIZE, "error": None}})
    s = S["vs"].get(name_s)
    if s is None:
        md = {"name": name_s, "namespace": NS, "labels": LABELS}
        if SNAP_BIND == "write":
            md["finalizers"] = [VS_FIN]
        o = create(P_VS, name_s, {
            "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot", "metadata": md,
            "spec": {"source": {"volumeSnapshotContentName": name_c}, "volumeSnapshotClassName": SNAPCLASS}})
        s = (o["metadata"]["uid"], sget(o, "status", "readyToUse") is True,
             bool(sget(o, "status", "boundVolumeSnapshotContentName")))
    if c[2] and c[2] != s[0]:
        raise ApiError(f"content {name_c} is bound to VolumeSnapshot uid {c[2]}, not {name_s}'s {s[0]} (run down first)")
    spec = {}
    if c[0] != DRIVER:
        spec["driver"] = DRIVER
    if SNAP_BIND == "write" and c[2] != s[0]:
        spec["volumeSnapshotRef"] = {"uid": s[0]}
    if spec:
        patch(f"{P_VSC}/{name_c}", {"spec": spec})
    if SNAP_BIND == "write" and not (s[1] and s[2]):
        patch(f"{P_VS}/{name_s}/status", {"status": {"boundVolumeSnapshotContentName": name_c, "creationTime": SNAP_RFC,
                                                     "readyToUse": True, "restoreSize": SIZE_Q, "error": None}})

def wait_counts(what, cond, timeout, label):
    """Polls scan(what) until cond(S) is true; returns seconds waited or None on timeout."""
    t0 = time.time()
    while True:
        S, _ = scan(what)
        ok, msg = cond(S)
        if ok:
            return time.time() - t0, S
        if time.time() - t0 > timeout:
            log(f"{label}: timeout after {timeout}s: {msg}")
            return None, S
        log(f"{label}: {msg}")
        time.sleep(10)

def cmd_up():
    T0 = time.time()
    preflight()
    S, dt = scan()
    log(f"existing: {len(S['pvc'])} PVCs, {len(S['pv'])} PVs, {len(S['va'])} VAs, {len(S['vsc'])} contents, "
        f"{len(S['vs'])} snapshots (listed in {dt:.1f}s)")

    # 1. VolumeAttachments, before the PVs they name (see the header)
    need = [i for i in range(1, ATT + 1) if (lambda v, p: v is None or not v[0] or v[1] or (p is not None and ATT_FIN not in p[2]))(
        S["va"].get(va_name(i)), S["pv"].get(pv_name(i)))]
    run_phase("volumeattachments", need, lambda i: make_va(i, S), "VAs")

    # 2. PVC+PV pairs. A PV exists before its PVC (csi-resizer logs an error for a PVC whose volumeName it cannot
    #    find) and is Bound before its PVC gets, in a second pass, the bind-completed annotation and its status
    #    (kube-controller-manager treats an annotated claim as bound and marks it Lost (ClaimMisbound) while its
    #    PV's claimRef has no uid). kube-controller-manager binds a few pairs itself meanwhile, the same way.
    def pair_done(i):
        c, v = S["pvc"].get(pvc_name(i)), S["pv"].get(pv_name(i))
        return c and v and c[1] == "Bound" and c[4] and v[1] == "Bound" and v[0] == c[0]
    need = [i for i in range(1, PAIRS + 1) if not pair_done(i)]
    t_pairs = time.time()
    batches = [need[k:k + PAIR_BATCH] for k in range(0, len(need), PAIR_BATCH)]
    run_phase("pvc+pv pairs", batches, lambda b: make_pairs(b, S), "pairs", weight=len)
    Sc, _ = scan(("pvc",))
    need = [i for i in range(1, PAIRS + 1)
            if (lambda c: c is not None and (c[1] != "Bound" or not c[4]))(Sc["pvc"].get(pvc_name(i)))]
    run_phase("pvc status Bound", need, lambda i: patch(f"{P_PVC}/{pvc_name(i)}/status", PVC_STATUS), "PVCs")
    def all_bound(S2):
        names_c = {pvc_name(i) for i in range(1, PAIRS + 1)}
        bc = sum(1 for n, x in S2["pvc"].items() if n in names_c and x[1] == "Bound")
        bv = sum(1 for n, x in S2["pv"].items() if idx(n) is not None and idx(n) <= PAIRS and x[1] == "Bound")
        return bc == PAIRS and bv == PAIRS, f"Bound: PVC {bc}/{PAIRS}, PV {bv}/{PAIRS}"
    w, S2 = wait_counts(("pvc", "pv"), all_bound, BIND_TIMEOUT, "waiting for Bound")
    if w is None:
        FAILED.append("not all pairs Bound")
    else:
        log(f"all {PAIRS} pairs Bound {time.time() - t_pairs:.1f}s after the pairs phase began (check took {w:.1f}s)")
    SUMMARY.append(("  until all Bound", PAIRS, 0, 0, time.time() - t_pairs))

    # 3. snapshots
    need = [i for i in range(1, SNAPS + 1)
            if not (lambda c, s: c and s and c[0] == DRIVER and c[1] and s[1] and s[2] and c[2] == s[0])(
                S["vsc"].get(vsc_name(i)), S["vs"].get(vs_name(i)))]
    t_snap = time.time()
    run_phase("snapshots (vsc+vs)", need, lambda i: make_snapshot(i, S), "snapshots")
    def all_ready(S3):
        names = {vs_name(i) for i in range(1, SNAPS + 1)}
        r = sum(1 for n, x in S3["vs"].items() if n in names and x[1] and x[2])
        return r == SNAPS, f"VolumeSnapshots ready+bound {r}/{SNAPS}"
    w, _ = wait_counts(("vs",), all_ready, BIND_TIMEOUT, "waiting for VolumeSnapshots ready")
    if w is None:
        FAILED.append("not all VolumeSnapshots ready")
    else:
        log(f"all {SNAPS} VolumeSnapshots ready {time.time() - t_snap:.1f}s after the snapshot phase began")
    SUMMARY.append(("  until all snapshots ready", SNAPS, 0, 0, time.time() - t_snap))

    # 4. attachErrors a csi-attacher may have saved on VAs before their status was written (it is rate-limited,
    #    so they can come seconds late): clear them until two scans 5 s apart find none (at most 120 s)
    t0, clean = time.time(), 0
    while ATT and clean < 2 and time.time() - t0 < 120:
        S4, _ = scan(("va",))
        fix = [i for i in range(1, ATT + 1) if (lambda v: v is not None and (not v[0] or v[1]))(S4["va"].get(va_name(i)))]
        if fix:
            clean = 0
            run_phase("va status recheck", fix, lambda i: patch(f"{P_VA}/{va_name(i)}/status", VA_STATUS), "VAs")
        else:
            clean += 1
        if clean < 2:
            time.sleep(5)

    print_summary(time.time() - T0)
    out("")
    S, dt = scan()
    print_status(S, dt)

# ------------------------------------------------------------------ down
def strip(path):
    patch(path, {"metadata": {"finalizers": None}}, ok404=True)

def strip_del(path, has_finalizers=True):
    """Finalizers off, then DELETE: the object goes at once and no controller sees it terminating (should one
    re-add a finalizer in between, the sweep in down finds it)."""
    if has_finalizers:
        strip(path)
    if delete(path):
        strip(path)

def del_strip(path):
    """DELETE, then finalizers off: for objects whose protection controller (kube-controller-manager's pvc- and
    pv-protection) would re-add a finalizer taken off a live object."""
    if delete(path):
        strip(path)

def cmd_down():
    T0 = time.time()
    S, dt = scan()
    log(f"found: {len(S['pvc'])} PVCs, {len(S['pv'])} PVs, {len(S['va'])} VAs, {len(S['vsc'])} contents, "
        f"{len(S['vs'])} snapshots (listed in {dt:.1f}s)")
    run_phase("delete volumesnapshots", sorted(S["vs"]), lambda n: strip_del(f"{P_VS}/{n}", S["vs"][n][3]), "objects")
    run_phase("delete snapshotcontents", sorted(S["vsc"]), lambda n: strip_del(f"{P_VSC}/{n}", S["vsc"][n][3]), "objects")
    # a VA deleted with its finalizer would make csi-attacher call ControllerUnpublishVolume
    run_phase("delete volumeattachments", sorted(S["va"]), lambda n: strip_del(f"{P_VA}/{n}", S["va"][n][2]), "objects")
    # pairs: PVC, then its PV at once (kube-controller-manager has no time to mark the PV Released)
    pairs = {}
    for n in S["pvc"]:
        pairs.setdefault(idx(n), [None, None])[0] = n
    for n in S["pv"]:
        pairs.setdefault(idx(n), [None, None])[1] = n
    def del_pair(k):
        c, v = pairs[k]
        if c:
            del_strip(f"{P_PVC}/{c}")
        if v:
            if ATT_FIN in S["pv"][v][2]:  # csi-attacher would take its finalizer off a terminating PV itself
                strip_del(f"{P_PV}/{v}")
            else:
                del_strip(f"{P_PV}/{v}")
    run_phase("delete pvc+pv pairs", sorted(pairs, key=lambda k: (k is None, k or 0)), del_pair, "pairs")

    # leftovers (a controller may have re-added a finalizer in between): sweep until nothing is left
    t0 = time.time()
    paths = {"pvc": P_PVC, "pv": P_PV, "va": P_VA, "vsc": P_VSC, "vs": P_VS}
    while True:
        S, _ = scan()
        left = sum(len(v) for v in S.values())
        if left == 0:
            break
        if time.time() - t0 > DOWN_TIMEOUT:
            FAILED.append(f"{left} objects left after {DOWN_TIMEOUT}s")
            break
        log(f"{left} objects left, sweeping")
        items = [(k, n) for k in S for n in S[k]]
        run_phase("sweep", items, lambda kn: strip_del(f"{paths[kn[0]]}/{kn[1]}"), "objects")
        time.sleep(2)

    st, o = call("GET", f"/api/v1/namespaces/{NS}")
    if st == 200:
        if (sget(o, "metadata", "labels") or {}).get("csi-sidecars.scale") != "population":
            log(f"namespace {NS} is not labelled csi-sidecars.scale=population: left in place")
        else:
            t1 = time.time()
            call("DELETE", f"/api/v1/namespaces/{NS}")
            while True:
                st, o = call("GET", f"/api/v1/namespaces/{NS}")
                if st == 404:
                    log(f"namespace {NS} gone after {time.time() - t1:.1f}s")
                    break
                if time.time() - t1 > DOWN_TIMEOUT:
                    FAILED.append(f"namespace {NS} still there after {DOWN_TIMEOUT}s")
                    break
                time.sleep(1)
    print_summary(time.time() - T0)
    out("")
    S, dt = scan()
    print_status(S, dt)

def main():
    try:
        if CMD == "up":
            log(f"up: NS={NS} PAIRS={PAIRS} ATTACHMENTS={ATT} SNAPSHOTS={SNAPS} PARALLEL={PAR} SNAP_BIND={SNAP_BIND}")
            cmd_up()
        elif CMD == "down":
            log(f"down: NS={NS} PARALLEL={PAR}")
            cmd_down()
        else:
            S, dt = scan()
            print_status(S, dt)
    except ApiError as e:
        log(f"ERROR: {e}")
        sys.exit(1)
    if FAILED:
        log("FAILED: " + "; ".join(FAILED))
        sys.exit(1)

main()
PY
exit $?
