"""Checks the rendered manifests (see scripts/manifests-test.sh, which runs this in its venv).

    manifests-check.py --manifests DIR --rendered DIR --bin DIR --k8s 1.26,1.37

--rendered holds one file per kustomization, as `kubectl kustomize` printed it, named after the
kustomization's directory (as --list-dirs prints it) with "/" replaced by "__". Every problem found is printed as
"FAIL <render>: <object>: <what>"; the exit code is 1 if there was any.

Containers of the multi-call image csi-sidecars are checked against the sidecars they run:
`csi-sidecars NAME [flags]` as that sidecar, `csi-sidecars --controllers=LIST [flags]` (all in
one, KEP-4958's layout) against the --help of every selected sidecar's own binary, never
against csi-sidecars' own --help.

Custom resources are validated against the CustomResourceDefinitions rendered with them; the
Services against the pods they select; csi-snapshot-metadata's SnapshotMetadataService against
the Service its address names and the sidecar behind it.
"""

import argparse
import base64
import binascii
import copy
import functools
import os
import re
import subprocess
import sys

import jsonschema
import yaml
from kubernetes_validate import utils as kv

# Image name (without registry and tag) -> the binary it runs.
SIDECARS = {
    "csi-provisioner": "csi-provisioner",
    "csi-attacher": "csi-attacher",
    "csi-resizer": "csi-resizer",
    "csi-snapshotter": "csi-snapshotter",
    "csi-external-health-monitor-controller": "csi-external-health-monitor-controller",
    "csi-snapshot-metadata": "csi-snapshot-metadata",
    "csi-node-driver-registrar": "csi-node-driver-registrar",
    "livenessprobe": "livenessprobe",
    "csi-sidecars": "csi-sidecars",
}

# Kinds younger than the oldest version checked, and the version that first serves them: they
# are validated against the versions from then on (their manifests say what they need).
INTRODUCED = {
    ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy"): (1, 30),
    ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding"): (1, 30),
}

# The multi-call binary: `csi-sidecars NAME [flags]` runs one sidecar, `csi-sidecars
# --controllers=LIST [flags]` several in one process.
MULTI_CALL = "csi-sidecars"

# The sidecars by the names --controllers takes, and their own binaries (whose --help lists
# their flags).
ALL_IN_ONE = {
    "provisioner": "csi-provisioner",
    "attacher": "csi-attacher",
    "resizer": "csi-resizer",
    "snapshotter": "csi-snapshotter",
    "health-monitor": "csi-external-health-monitor-controller",
    "snapshot-metadata": "csi-snapshot-metadata",
    "livenessprobe": "livenessprobe",
    "node-driver-registrar": "csi-node-driver-registrar",
}
BY_BINARY = {b: n for n, b in ALL_IN_ONE.items()}

# The controllers of the controller pod, which `*` (or `all`) selects. node-driver-registrar runs
# on every node and never in one process with them; the livenessprobe joins either.
CONTROLLERS = ("provisioner", "attacher", "resizer", "snapshotter")
# Every controller of the controller pod: those of `*`, and the health monitor, which is named.
ELECTED = CONTROLLERS + ("health-monitor",)
# Servers of the controller pod: on the sidecar runtime like the controllers (named in
# --controllers, never with the registrar), but without a Lease; every replica serves.
SERVERS = ("snapshot-metadata",)
CONTROLLER_POD = ELECTED + SERVERS
NODE_ONLY = "node-driver-registrar"

# What csi-snapshot-metadata serves with and where (its defaults when the flags are not given):
# the TLS gRPC port, and the HTTP endpoint that is always on.
SNAPSHOT_METADATA = "snapshot-metadata"
TLS_PORT_DEFAULT = 50051
DEFAULT_HTTP_ENDPOINT = {SNAPSHOT_METADATA: ":8080"}
# Its certificate and key: the flag, else the environment variable (upstream's fallback).
TLS_FILES = (("tls-cert", "TLS_CERT_PATH"), ("tls-key", "TLS_KEY_PATH"))

# Settings of the whole all-in-one process: given once, never with a sidecar's prefix.
PROCESS_FLAGS = {
    "csi-address",
    "kubeconfig",
    "http-endpoint",
    "metrics-address",
    "metrics-path",
    "v",
    "vmodule",
    "logging-format",
    "log-flush-frequency",
    "log-text-split-stream",
    "log-text-info-buffer-size",
    "log-json-split-stream",
    "log-json-info-buffer-size",
    "automaxprocs",
    "version",
}

# `csi-sidecars NAME`: the names the multi-call binary answers to, as in --controllers.
MULTI_CALL_NAMES = {
    **{n: n for n in ALL_IN_ONE},
    **BY_BINARY,
    "external-provisioner": "provisioner",
    "external-attacher": "attacher",
    "external-resizer": "resizer",
    "external-snapshotter": "snapshotter",
    "external-health-monitor": "health-monitor",
    "external-health-monitor-controller": "health-monitor",
    "external-snapshot-metadata": "snapshot-metadata",
    "registrar": "node-driver-registrar",
}

# Health paths and who serves them: /healthz/leader-election a controller run with
# --leader-election (alone or all in one); the others (sidecar, all in one only) the process
# that runs that sidecar, on its --http-endpoint: /healthz/livenessprobe and
# /healthz/node-driver-registrar only the all-in-one process, /health (snapshot-metadata's
# readiness, upstream's path) csi-snapshot-metadata alone as well.
HEALTH_PATHS = {
    "/healthz/leader-election": None,
    "/healthz/livenessprobe": ("livenessprobe", True),
    "/healthz/node-driver-registrar": ("node-driver-registrar", True),
    "/health": (SNAPSHOT_METADATA, False),
}

# The registrar's default --plugin-registration-path (upstream's): in a pod that is not
# HostProcess, a volume of the kubelet's registration directory is mounted there.
REGISTRATION_DIR = "/registration"

PROBES = ("livenessProbe", "readinessProbe", "startupProbe")

# Upstream's RBAC object names per sidecar: an installation that swaps only the image keeps its
# objects. ClusterRole, ClusterRoleBinding, Role, RoleBinding, ServiceAccount; None where
# upstream has no such object (csi-snapshot-metadata keeps nothing in its namespace).
UPSTREAM_RBAC = {
    "external-provisioner": (
        "external-provisioner-runner",
        "csi-provisioner-role",
        "external-provisioner-cfg",
        "csi-provisioner-role-cfg",
        "csi-provisioner",
    ),
    "external-attacher": (
        "external-attacher-runner",
        "csi-attacher-role",
        "external-attacher-cfg",
        "csi-attacher-role-cfg",
        "csi-attacher",
    ),
    "external-resizer": (
        "external-resizer-runner",
        "csi-resizer-role",
        "external-resizer-cfg",
        "csi-resizer-role-cfg",
        "csi-resizer",
    ),
    "external-health-monitor": (
        "external-health-monitor-controller-runner",
        "csi-external-health-monitor-controller-role",
        "external-health-monitor-controller-cfg",
        "csi-external-health-monitor-controller-role-cfg",
        "csi-external-health-monitor-controller",
    ),
    "external-snapshotter": (
        "external-snapshotter-runner",
        "csi-snapshotter-role",
        "external-snapshotter-leaderelection",
        "external-snapshotter-leaderelection",
        "csi-snapshotter",
    ),
    # deploy/snapshot-metadata-cluster-role.yaml and the binding of deploy/example/csi-driver.
    "external-snapshot-metadata": (
        "external-snapshot-metadata-runner",
        "csi-snapshot-metadata-cluster-role",
        None,
        None,
        "csi-snapshot-metadata",
    ),
}
# ClusterRoles upstream ships for others to bind, which come with a sidecar's RBAC: the backup
# applications' role of csi-snapshot-metadata (deploy/snapshot-metadata-client-cluster-role.yaml).
UPSTREAM_CLIENT_ROLES = {
    "external-snapshot-metadata": "external-snapshot-metadata-client-runner",
}

WORKLOADS = {"Deployment", "DaemonSet", "StatefulSet", "ReplicaSet", "Job"}

failures = []


def fail(render, obj, what):
    failures.append(f"FAIL {render}: {obj}: {what}")


def describe(o):
    meta = o.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{o.get('kind')}/{(ns + '/') if ns else ''}{meta.get('name')}"


# The schemas are large: read each file once (kubernetes-validate reads them on every call).
kv.schema_contents = functools.lru_cache(maxsize=None)(kv.schema_contents)


def help_flags(bin_dir, binary):
    out = subprocess.run(
        [os.path.join(bin_dir, binary), "--help"], capture_output=True, text=True, timeout=60
    )
    if out.returncode != 0:
        sys.exit(f"FAIL {binary} --help exited {out.returncode}: {out.stderr.strip()}")
    return set(re.findall(r"(?:^|[\s,])--([a-z0-9][a-z0-9-]*)", out.stdout, re.M))


def image_parts(image):
    """("registry/path/name:tag" or "...@sha256:...") -> (name, tag or None)."""
    ref, _, _digest = image.partition("@")
    last = ref.rsplit("/", 1)[-1]
    name, _, tag = last.partition(":")
    return name, (tag or None)


def load_kustomization(directory):
    with open(os.path.join(directory, "kustomization.yaml")) as f:
        return yaml.safe_load(f) or {}


def check_tree(manifests):
    """Every kustomization directory is rendered or included by one that is; every YAML file is
    used by a kustomization. Returns the directories to render."""
    dirs = {}
    for root, _subdirs, files in os.walk(manifests):
        if "kustomization.yaml" in files:
            dirs[os.path.normpath(root)] = load_kustomization(root)
    used_files = set()
    included = set()
    for d, k in dirs.items():
        for key in ("resources", "components"):
            for entry in k.get(key) or []:
                p = os.path.normpath(os.path.join(d, entry))
                (included if os.path.isdir(p) else used_files).add(p)
        for patch in k.get("patches") or []:
            if "path" in patch:
                used_files.add(os.path.normpath(os.path.join(d, patch["path"])))
        used_files.add(os.path.join(d, "kustomization.yaml"))
    for root, _subdirs, files in os.walk(manifests):
        for f in files:
            p = os.path.normpath(os.path.join(root, f))
            if f.endswith((".yaml", ".yml")) and p not in used_files:
                fail(p, "-", "no kustomization uses this file, so it is never rendered or checked")
    for d, k in dirs.items():
        if k.get("kind") == "Component" and d not in included:
            fail(d, "-", "component included by no kustomization, so it is never rendered")
    return sorted(d for d, k in dirs.items() if k.get("kind") != "Component")


def image_tags(manifests):
    """The tags set in manifests/images, the one place."""
    k = load_kustomization(os.path.join(manifests, "images"))
    return {i["name"]: i.get("newTag") for i in k.get("images") or []}


def expand(arg, env):
    """$(VAR) replaced by the value of the container's env entry VAR, where that is a literal."""
    return re.sub(r"(?<!\$)\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)), arg)


def flag_values(words):
    """--name=value, --name value and --name (None) -> {name: value}; the last one wins."""
    values = {}
    for i, w in enumerate(words):
        if not w.startswith("-"):
            continue
        name, eq, value = w.lstrip("-").partition("=")
        if not eq:
            value = words[i + 1] if i + 1 < len(words) and not words[i + 1].startswith("-") else None
        values[name] = value
    return values


def enabled(values, name):
    """Whether the boolean flag `name` is given and not false."""
    if name not in values:
        return False
    return values[name] is None or values[name].lower() in ("true", "t", "1")


def under(path, mount_paths):
    return any(path == m or path.startswith(m.rstrip("/") + "/") for m in mount_paths)


def check_flags(render, cw, words, flags, binary, counts):
    """Each flag in `words` is in `flags`, the --help of `binary`."""
    for arg in words:
        if not arg.startswith("-"):
            continue
        flag = arg.lstrip("-").split("=", 1)[0]
        counts["flags checked"] += 1
        if flag not in flags:
            fail(render, cw, f"{binary} does not accept --{flag} (not in its --help)")


def check_all_in_one(render, cw, words, helps, counts):
    """`csi-sidecars --controllers=LIST [flags]`: returns the selected sidecars. A flag is one of
    a selected sidecar (given once for all that have it), or --<sidecar>-<flag> with <sidecar>
    selected and <flag> its own, not a process-wide one."""
    lists = []
    flags = []
    for i, w in enumerate(words):
        if not w.startswith("-"):
            continue
        name, eq, value = w.lstrip("-").partition("=")
        if name != "controllers":
            flags.append(name)
        elif eq:
            lists.append(value)
        elif i + 1 < len(words) and not words[i + 1].startswith("-"):
            lists.append(words[i + 1])
        else:
            lists.append("")
    if not lists:
        fail(render, cw, f"{MULTI_CALL} needs a sidecar's name as its first argument or --controllers=LIST")
        return []
    if len(lists) > 1:
        fail(render, cw, f"--controllers is given {len(lists)} times: give the list once")
    selected = set()
    unknown = False
    for n in (x.strip() for x in lists[-1].split(",")):
        if n in ("*", "all"):
            selected.update(CONTROLLERS)
        elif n in ALL_IN_ONE:
            selected.add(n)
        elif n:
            unknown = True
            fail(render, cw, f"--controllers names {n!r}, which is none of {', '.join(ALL_IN_ONE)} (or *)")
    selected = [n for n in ALL_IN_ONE if n in selected]
    if not selected:
        if not unknown:
            fail(render, cw, "--controllers selects no sidecar")
        return []
    together = [n for n in selected if n in CONTROLLER_POD]
    if NODE_ONLY in selected and together:
        fail(
            render,
            cw,
            f"--controllers: {NODE_ONLY} runs on every node and cannot share a process with "
            f"{', '.join(together)} (the controller pod's): give each its own csi-sidecars",
        )
    for flag in flags:
        counts["flags checked"] += 1
        owner = next((n for n in ALL_IN_ONE if flag.startswith(n + "-")), None)
        rest = flag[len(owner) + 1 :] if owner else None
        if owner and rest in PROCESS_FLAGS:
            fail(render, cw, f"--{flag}: --{rest} is one for the whole process; give it once, without the {owner}- prefix")
            continue
        if owner in selected and rest in helps[ALL_IN_ONE[owner]]:
            continue
        if any(flag in helps[ALL_IN_ONE[n]] for n in selected):
            continue
        if owner and owner not in selected:
            fail(render, cw, f"--{flag} is for {owner}, which --controllers does not select")
        elif owner:
            fail(render, cw, f"--{flag}: {ALL_IN_ONE[owner]} does not accept --{rest} (not in its --help)")
        else:
            fail(
                render,
                cw,
                f"--{flag} is a flag of none of the selected sidecars (not in the --help of "
                f"{', '.join(ALL_IN_ONE[n] for n in selected)})",
            )
    return selected


def check_multi_call(render, cw, words, helps, counts):
    """The multi-call binary's command line; returns the sidecars it runs."""
    counts["csi-sidecars containers"] += 1
    if words and not words[0].startswith("-"):
        sidecar = MULTI_CALL_NAMES.get(words[0])
        if sidecar is None:
            fail(render, cw, f"{MULTI_CALL} {words[0]}: no such sidecar (known: {', '.join(MULTI_CALL_NAMES)})")
            return []
        check_flags(render, cw, words[1:], helps[ALL_IN_ONE[sidecar]], f"{MULTI_CALL} {words[0]}", counts)
        return [sidecar]
    return check_all_in_one(render, cw, words, helps, counts)


def sidecar_value(values, sidecar, flag, all_in_one):
    """The value of `flag` for `sidecar`: in the all-in-one process --<sidecar>-<flag> wins over
    the shared --<flag>."""
    if all_in_one and f"{sidecar}-{flag}" in values:
        return values[f"{sidecar}-{flag}"]
    return values.get(flag)


def check_pod(render, o, spec, helps, tags, counts, rbac, labels=None):
    """Checks a pod (template); returns what the Services need of it: its namespace, labels,
    declared ports (name -> number, and the numbers) and snapshot-metadata's TLS ports."""
    where = describe(o)
    host_process = (((spec.get("securityContext") or {}).get("windowsOptions") or {}).get("hostProcess")) is True
    volumes = {v.get("name") for v in spec.get("volumes") or []}
    containers = (spec.get("initContainers") or []) + (spec.get("containers") or [])
    names = [c.get("name") for c in containers]
    for n in set(names):
        if names.count(n) > 1:
            fail(render, where, f"container name {n} used twice")
    port_names = []
    port_numbers = []  # (containerPort, protocol) of every container
    named_ports = {}  # name -> containerPort
    listeners = {}  # port -> (container, the sidecars it runs, its flags, whether all in one)
    running = {}  # sidecar -> the containers running it
    tls_ports = set()  # snapshot-metadata's TLS gRPC ports
    for c in containers:
        cw = f"{where} container {c.get('name')}"
        ports = c.get("ports") or []
        own_ports = {p.get("name") for p in ports if p.get("name")}
        port_names += [p.get("name") for p in ports if p.get("name")]
        port_numbers += [(p.get("containerPort"), p.get("protocol") or "TCP") for p in ports]
        named_ports.update({p.get("name"): p.get("containerPort") for p in ports if p.get("name")})
        declared = {p.get("containerPort") for p in ports}
        for m in c.get("volumeMounts") or []:
            if m.get("name") not in volumes:
                fail(render, cw, f"mounts volume {m.get('name')}, which the pod does not have")
        for probe in PROBES:
            port = ((c.get(probe) or {}).get("httpGet") or {}).get("port")
            if isinstance(port, str) and port not in own_ports:
                fail(render, cw, f"{probe} names port {port}, which the container does not declare")
        env = {e.get("name") for e in c.get("env") or []}
        env_values = {e.get("name"): str(e["value"]) for e in c.get("env") or [] if "value" in e}
        for arg in (c.get("command") or []) + (c.get("args") or []):
            for ref in re.findall(r"(?<!\$)\$\(([A-Za-z_][A-Za-z0-9_]*)\)", str(arg)):
                if ref not in env:
                    fail(render, cw, f"{arg} refers to $({ref}), which is not in its env")
        name, tag = image_parts(c.get("image") or "")
        binary = SIDECARS.get(name)
        if binary is None:
            counts["other containers"] += 1
            continue
        counts["sidecar containers"] += 1
        if tag != tags.get(name):
            fail(render, cw, f"image {c.get('image')}: the tag is not the one of manifests/images ({tags.get(name)})")
        command = [str(w) for w in c.get("command") or []]
        words = [str(a) for a in c.get("args") or []]
        if command:
            run = re.split(r"[\\/]", command[0])[-1]
            if run.removesuffix(".exe") != binary:
                fail(render, cw, f"command {command[0]} is not the image's binary {binary}")
            if host_process and re.match(r"^([A-Za-z]:)?[\\/]", command[0]):
                fail(render, cw, f"command {command[0]} is absolute: in a HostProcess container it is looked up on the host, not in the image")
            # The multi-call binary may be told its sidecar in command (`csi-sidecars provisioner`).
            extra = command[1:]
            if binary == MULTI_CALL and not any(w.startswith("-") for w in extra):
                words = extra + words
            elif extra:
                fail(render, cw, "flags belong in args, not in command")
        if binary == MULTI_CALL:
            runs = check_multi_call(render, cw, words, helps, counts)
        else:
            runs = [BY_BINARY[binary]]
            check_flags(render, cw, words, helps[binary], binary, counts)
        values = flag_values([expand(w, env_values) for w in words])
        all_in_one = binary == MULTI_CALL and (not words or words[0].startswith("-"))
        for sidecar in runs:
            running.setdefault(sidecar, []).append(c.get("name"))
        endpoint = values.get("http-endpoint")
        if endpoint is None and not all_in_one and len(runs) == 1:
            endpoint = DEFAULT_HTTP_ENDPOINT.get(runs[0])
        port = re.search(r":(\d+)$", endpoint or "")
        if port:
            port = int(port.group(1))
            if port in listeners:
                fail(render, cw, f"--http-endpoint :{port}: container {listeners[port][0]} of the pod listens there already")
            else:
                listeners[port] = (c.get("name"), runs, values, all_in_one)
        if SNAPSHOT_METADATA in runs:
            tls = sidecar_value(values, SNAPSHOT_METADATA, "port", all_in_one)
            tls = int(tls) if tls and tls.isdigit() else TLS_PORT_DEFAULT
            tls_ports.add(tls)
            if tls not in declared:
                fail(render, cw, f"snapshot-metadata serves TLS gRPC on port {tls} (--port), which the container does not declare")
        # What the sidecars reach through the container's mounts (HostProcess containers see the
        # host's paths instead).
        if not host_process:
            mounts = [m.get("mountPath") or "" for m in c.get("volumeMounts") or []]
            address = re.sub(r"^unix://", "", values.get("csi-address") or "")
            if address.startswith("/") and not under(address, mounts):
                fail(render, cw, f"--csi-address {address} is in none of the container's volumeMounts: the driver's socket is not there")
            registration = values.get("plugin-registration-path") or REGISTRATION_DIR
            if NODE_ONLY in runs and not under(registration, mounts):
                fail(render, cw, f"the registrar's registration directory {registration} is in none of the container's volumeMounts")
        # snapshot-metadata exits without a certificate; the files come from a Secret's volume.
        if SNAPSHOT_METADATA in runs:
            mounts = [m.get("mountPath") or "" for m in c.get("volumeMounts") or []]
            for flag, variable in TLS_FILES:
                path = sidecar_value(values, SNAPSHOT_METADATA, flag, all_in_one) or env_values.get(variable)
                if not path:
                    fail(render, cw, f"snapshot-metadata has no --{flag} (nor ${variable}): it does not start without its certificate")
                elif not host_process and path.startswith("/") and not under(path, mounts):
                    fail(render, cw, f"--{flag} {path} is in none of the container's volumeMounts")
    for n in set(port_names):
        if port_names.count(n) > 1:
            fail(render, where, f"port name {n} used twice in the pod")
        if len(n) > 15:
            fail(render, where, f"port name {n} is longer than 15 characters")
    for p in set(port_numbers):
        if port_numbers.count(p) > 1:
            fail(render, where, f"containerPort {p[0]}/{p[1]} declared twice in the pod")
    for sidecar, names in running.items():
        if len(names) > 1:
            fail(render, where, f"{sidecar} runs in more than one container of the pod ({', '.join(names)})")
    check_health_paths(render, where, containers, listeners)
    check_pod_rbac(render, o, spec, running, rbac)
    return {
        "where": where,
        "namespace": (o.get("metadata") or {}).get("namespace") or "default",
        "labels": labels or {},
        "named_ports": named_ports,
        "ports": {p for p, _ in port_numbers},
        "tls_ports": tls_ports,
    }


def check_health_paths(render, where, containers, listeners):
    """A probe asking a sidecar's health path asks the port of a container that serves it."""
    for c in containers:
        cw = f"{where} container {c.get('name')}"
        own = {p.get("name"): p.get("containerPort") for p in c.get("ports") or [] if p.get("name")}
        for probe in PROBES:
            get = (c.get(probe) or {}).get("httpGet") or {}
            path, port = get.get("path"), get.get("port")
            port = own.get(port) if isinstance(port, str) else port
            if path not in HEALTH_PATHS or not isinstance(port, int):
                continue
            listener = listeners.get(port)
            if listener is None:
                fail(render, cw, f"{probe} asks {path} on port {port}, where no sidecar container of the pod listens (--http-endpoint)")
                continue
            name, runs, values, all_in_one = listener
            need = HEALTH_PATHS[path]
            if need is not None:
                need, all_in_one_only = need
            if need is None:
                elected = [
                    n
                    for n in runs
                    if n in ELECTED
                    and enabled(values, f"{n}-leader-election" if f"{n}-leader-election" in values else "leader-election")
                ]
                if not elected:
                    fail(render, cw, f"{probe} asks {path} on port {port}, but container {name} there runs no controller with --leader-election")
            elif all_in_one_only and not (all_in_one and need in runs):
                fail(
                    render,
                    cw,
                    f"{probe} asks {path} on port {port}, but container {name} there does not run {need} "
                    f"all in one (only {MULTI_CALL} --controllers=...,{need} serves {path})",
                )
            elif need not in runs:
                fail(render, cw, f"{probe} asks {path} on port {port}, but container {name} there does not run {need}, which serves it")


def check_pod_rbac(render, o, spec, running, rbac):
    """The pod's ServiceAccount is bound to the roles of every controller and server it runs."""
    ns = (o.get("metadata") or {}).get("namespace") or "default"
    account = spec.get("serviceAccountName") or "default"
    for sidecar in (n for n in CONTROLLER_POD if n in running):
        cr, _crb, role, _rb, _sa = UPSTREAM_RBAC[f"external-{sidecar}"]
        for kind, name, binding_ns in (("ClusterRole", cr, None), ("Role", role, ns)):
            if name is None:
                continue
            if not any(
                b.get("kind") == ("ClusterRoleBinding" if binding_ns is None else "RoleBinding")
                and (b.get("metadata") or {}).get("namespace") == binding_ns
                and (b.get("roleRef") or {}).get("kind") == kind
                and (b.get("roleRef") or {}).get("name") == name
                and any(
                    s.get("kind") == "ServiceAccount" and s.get("name") == account and s.get("namespace") == ns
                    for s in b.get("subjects") or []
                )
                for b in rbac
            ):
                fail(render, describe(o), f"runs {sidecar}, but its ServiceAccount {ns}/{account} is bound to no {kind} {name}{' in ' + ns if binding_ns else ''}")


def check_rbac(render, objs):
    index = {(o.get("kind"), (o.get("metadata") or {}).get("namespace"), o["metadata"]["name"]) for o in objs}
    for o in objs:
        kind = o.get("kind")
        if kind not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        ns = o["metadata"].get("namespace")
        ref = o.get("roleRef") or {}
        ref_ns = ns if ref.get("kind") == "Role" else None
        if (ref.get("kind"), ref_ns, ref.get("name")) not in index:
            fail(render, describe(o), f"roleRef {ref.get('kind')}/{ref.get('name')} is not among the rendered objects")
        for s in o.get("subjects") or []:
            if s.get("kind") == "ServiceAccount" and ("ServiceAccount", s.get("namespace"), s.get("name")) not in index:
                fail(render, describe(o), f"subject ServiceAccount {s.get('namespace')}/{s.get('name')} is not among the rendered objects")
    names = {(o.get("kind"), o["metadata"]["name"]): o for o in objs}
    for sidecar, (cr, crb, role, rb, sa) in UPSTREAM_RBAC.items():
        if not any(n == cr or n == role for (_k, n) in names):
            continue
        for kind, name in (("ClusterRole", cr), ("ClusterRoleBinding", crb), ("Role", role), ("RoleBinding", rb), ("ServiceAccount", sa)):
            if name is not None and (kind, name) not in names:
                fail(render, "-", f"{sidecar}: upstream's {kind} {name} is missing")
        client = UPSTREAM_CLIENT_ROLES.get(sidecar)
        if client and ("ClusterRole", client) not in names:
            fail(render, "-", f"{sidecar}: upstream's ClusterRole {client} (for its clients to bind) is missing")
        for kind, name, target in (("ClusterRoleBinding", crb, cr), ("RoleBinding", rb, role)):
            if name is None:
                continue
            b = names.get((kind, name))
            if b is None:
                continue
            if (b.get("roleRef") or {}).get("name") != target:
                fail(render, describe(b), f"roleRef is not upstream's {target}")
            if not any(s.get("name") == sa for s in b.get("subjects") or []):
                fail(render, describe(b), f"does not bind upstream's ServiceAccount {sa}")


def custom_kinds(objs):
    """The kinds the rendered CustomResourceDefinitions define: (apiVersion, kind) -> (the
    version's schema, whether it is served)."""
    kinds = {}
    for o in objs:
        if o.get("apiVersion") != "apiextensions.k8s.io/v1" or o.get("kind") != "CustomResourceDefinition":
            continue
        spec = o.get("spec") or {}
        for v in spec.get("versions") or []:
            schema = ((v.get("schema") or {}).get("openAPIV3Schema")) or {}
            kinds[(f"{spec.get('group')}/{v.get('name')}", (spec.get("names") or {}).get("kind"))] = (
                schema,
                v.get("served") is True,
            )
    return kinds


def strict_schema(schema):
    """The CRD's structural schema as the API server applies it with strict field validation:
    a field that the schema does not declare is an error (it would be pruned), unless the
    schema preserves unknown fields there."""
    schema = copy.deepcopy(schema)

    def walk(s):
        if not isinstance(s, dict):
            return
        if (
            "properties" in s
            and "additionalProperties" not in s
            and not s.get("x-kubernetes-preserve-unknown-fields")
        ):
            s["additionalProperties"] = False
        for sub in (s.get("properties") or {}).values():
            walk(sub)
        for key in ("items", "additionalProperties"):
            walk(s.get(key))

    walk(schema)
    return schema


FORMATS = jsonschema.FormatChecker()


@FORMATS.checks("byte", raises=(binascii.Error, ValueError))
def _is_byte(value):
    """`format: byte`: base64, as the API server checks it."""
    if isinstance(value, str):
        base64.b64decode(value, validate=True)
    return True


def check_custom_resource(render, o, kinds):
    """A custom resource against its CRD among the rendered objects; False if there is none.
    Its metadata is not checked beyond its name: a namespace on an object of a cluster-scoped
    kind is dropped by the API server, and kustomize's `namespace:` adds one (it cannot tell a
    custom kind's scope)."""
    found = kinds.get((o.get("apiVersion"), o.get("kind")))
    if found is None:
        return False
    schema, served = found
    if not served:
        fail(render, describe(o), f"{o.get('apiVersion')} is not a served version of its CRD")
    if not (o.get("metadata") or {}).get("name"):
        fail(render, describe(o), "metadata.name is missing")
    validator = jsonschema.Draft4Validator(strict_schema(schema), format_checker=FORMATS)
    for e in sorted(validator.iter_errors(o), key=lambda e: list(e.absolute_path)):
        at = ".".join(str(p) for p in e.absolute_path) or "(top)"
        fail(render, describe(o), f"its CRD's schema, at {at}: {e.message}")
    return True


def selected_pods(service, pods):
    ns = (service.get("metadata") or {}).get("namespace") or "default"
    selector = (service.get("spec") or {}).get("selector") or {}
    return [p for p in pods if p["namespace"] == ns and all(p["labels"].get(k) == v for k, v in selector.items())]


def target_port(pod, port):
    """The number a Service port's targetPort (a number or a port name; the port itself when
    not given) stands for in `pod`, or None."""
    target = port.get("targetPort", port.get("port"))
    if isinstance(target, str) and not target.isdigit():
        return pod["named_ports"].get(target)
    return int(target) if target is not None else None


def check_services(render, objs, pods):
    """Every Service with a selector selects a rendered pod, and each of its target ports is one
    that the pod declares."""
    for svc in objs:
        if svc.get("kind") != "Service" or not (svc.get("spec") or {}).get("selector"):
            continue
        chosen = selected_pods(svc, pods)
        if not chosen:
            fail(render, describe(svc), "its selector matches no pod of the rendered workloads")
        for pod in chosen:
            for port in (svc.get("spec") or {}).get("ports") or []:
                number = target_port(pod, port)
                if number is None or number not in pod["ports"]:
                    fail(render, describe(svc), f"port {port.get('name') or port.get('port')}: targetPort {port.get('targetPort', port.get('port'))} is declared by no container of {pod['where']}")


def check_snapshot_metadata_services(render, objs, pods):
    """A SnapshotMetadataService is named after a rendered CSIDriver (when there is one: the
    sidecar and its clients look it up by the driver's name), and its address names a rendered
    Service port that reaches csi-snapshot-metadata's TLS port in the pods it selects."""
    drivers = {o["metadata"]["name"] for o in objs if o.get("kind") == "CSIDriver"}
    services = {
        ((o.get("metadata") or {}).get("namespace") or "default", o["metadata"]["name"]): o
        for o in objs
        if o.get("kind") == "Service"
    }
    for sms in objs:
        if sms.get("kind") != "SnapshotMetadataService" or not str(sms.get("apiVersion", "")).startswith("cbt.storage.k8s.io/"):
            continue
        where = describe(sms)
        if drivers and sms["metadata"]["name"] not in drivers:
            fail(render, where, f"named after no rendered CSIDriver ({', '.join(sorted(drivers))}): it must carry its driver's name")
        address = str((sms.get("spec") or {}).get("address") or "")
        host, _, port = address.rpartition(":")
        if "://" in address or not host or not port.isdigit():
            fail(render, where, f"spec.address {address!r} is not host:port")
            continue
        labels = host.split(".")
        if len(labels) < 2 or (len(labels) > 2 and labels[2] != "svc"):
            continue  # not a Service's cluster DNS name: nothing to follow here
        svc = services.get((labels[1], labels[0]))
        if svc is None:
            fail(render, where, f"spec.address names the Service {labels[1]}/{labels[0]}, which is not among the rendered objects")
            continue
        ports = [p for p in (svc.get("spec") or {}).get("ports") or [] if p.get("port") == int(port)]
        if not ports:
            fail(render, where, f"spec.address names port {port} of {describe(svc)}, which has no such port")
            continue
        for pod in selected_pods(svc, pods):
            number = target_port(pod, ports[0])
            if number not in pod["tls_ports"]:
                fail(render, where, f"{describe(svc)} port {port} reaches port {number} of {pod['where']}, where no container serves snapshot-metadata's TLS port (--port)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--manifests", required=True)
    ap.add_argument("--rendered", required=True)
    ap.add_argument("--bin", required=True)
    ap.add_argument("--k8s", required=True, help="comma-separated Kubernetes versions")
    ap.add_argument("--list-dirs", action="store_true", help="print the kustomizations to render and exit")
    a = ap.parse_args()

    manifests = os.path.normpath(a.manifests)
    dirs = check_tree(manifests)
    if a.list_dirs:
        for line in failures:
            print(line, file=sys.stderr)
        print("\n".join(dirs))
        return 1 if failures else 0

    versions = a.k8s.split(",")
    for v in versions:
        if v not in [kv.major_minor(x) for x in kv.all_versions()]:
            sys.exit(f"FAIL kubernetes-validate {kv.__version__} has no schemas for Kubernetes {v}")
    # csi-sidecars is checked against the sidecars' own binaries, not its own --help.
    helps = {b: help_flags(a.bin, b) for b in sorted(set(SIDECARS.values()) - {MULTI_CALL})}
    tags = image_tags(manifests)
    counts = {"objects": 0, "custom resources": 0, "sidecar containers": 0, "csi-sidecars containers": 0, "other containers": 0, "flags checked": 0}
    passed = failed = 0
    for d in dirs:
        before = len(failures)
        render = os.path.relpath(d, os.path.dirname(manifests))
        path = os.path.join(a.rendered, d.replace(os.sep, "__") + ".yaml")
        with open(path) as f:
            objs = [o for o in yaml.safe_load_all(f) if o]
        if not objs:
            fail(render, "-", "renders no object")
        rbac = [o for o in objs if o.get("kind") in ("RoleBinding", "ClusterRoleBinding")]
        kinds = custom_kinds(objs)
        pods = []
        for o in objs:
            counts["objects"] += 1
            introduced = INTRODUCED.get((o.get("apiVersion"), o.get("kind")), (0, 0))
            if check_custom_resource(render, o, kinds):
                counts["custom resources"] += 1
                introduced = None
            for v in versions if introduced is not None else ():
                if tuple(int(p) for p in v.split(".")[:2]) < introduced:
                    continue
                try:
                    kv.validate(o, v, strict=True)
                except kv.ValidationError as e:
                    at = ".".join(str(p) for p in e.absolute_path) or "(top)"
                    fail(render, describe(o), f"Kubernetes {v} schema, at {at}: {e.message}")
                except kv.SchemaNotFoundError as e:
                    fail(render, describe(o), e.message)
            spec = o.get("spec") or {}
            if o.get("kind") in WORKLOADS:
                template = spec.get("template") or {}
                labels = (template.get("metadata") or {}).get("labels")
                pods.append(check_pod(render, o, template.get("spec") or {}, helps, tags, counts, rbac, labels))
            elif o.get("kind") == "Pod":
                pods.append(check_pod(render, o, spec, helps, tags, counts, rbac, (o.get("metadata") or {}).get("labels")))
        check_rbac(render, objs)
        check_services(render, objs, pods)
        check_snapshot_metadata_services(render, objs, pods)
        ok = len(failures) == before
        passed, failed = passed + ok, failed + (not ok)
        print(f"  {'ok  ' if ok else 'FAIL'} {render}: {len(objs)} objects")

    for line in failures:
        print(line)
    print(
        f"{len(dirs)} kustomizations, {counts['objects']} objects validated against the schemas of "
        f"Kubernetes {', '.join(versions)} (kubernetes-validate {kv.__version__}, strict; "
        f"{counts['custom resources']} custom resources against their CRDs); "
        f"{counts['sidecar containers']} sidecar containers ({counts['csi-sidecars containers']} of them "
        f"{MULTI_CALL}), {counts['flags checked']} flags "
        f"checked against --help; {counts['other containers']} other containers"
    )
    print(f"manifests: {passed} passed, {failed} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
