"""Checks the rendered manifests (see scripts/manifests-test.sh, which runs this in its venv).

    manifests-check.py --manifests DIR --rendered DIR --bin DIR --k8s 1.26,1.37

--rendered holds one file per kustomization, as `kubectl kustomize` printed it, named after the
kustomization's directory (as --list-dirs prints it) with "/" replaced by "__". Every problem found is printed as
"FAIL <render>: <object>: <what>"; the exit code is 1 if there was any.
"""

import argparse
import functools
import os
import re
import subprocess
import sys

import yaml
from kubernetes_validate import utils as kv

# Image name (without registry and tag) -> the binary it runs.
SIDECARS = {
    "csi-provisioner": "csi-provisioner",
    "csi-attacher": "csi-attacher",
    "csi-resizer": "csi-resizer",
    "csi-snapshotter": "csi-snapshotter",
    "csi-node-driver-registrar": "csi-node-driver-registrar",
    "livenessprobe": "livenessprobe",
}

# Upstream's RBAC object names per sidecar: an installation that swaps only the image keeps its
# objects. ClusterRole, ClusterRoleBinding, Role, RoleBinding, ServiceAccount.
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
    "external-snapshotter": (
        "external-snapshotter-runner",
        "csi-snapshotter-role",
        "external-snapshotter-leaderelection",
        "external-snapshotter-leaderelection",
        "csi-snapshotter",
    ),
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


def check_pod(render, o, spec, helps, tags, counts):
    where = describe(o)
    host_process = (((spec.get("securityContext") or {}).get("windowsOptions") or {}).get("hostProcess")) is True
    volumes = {v.get("name") for v in spec.get("volumes") or []}
    containers = (spec.get("initContainers") or []) + (spec.get("containers") or [])
    names = [c.get("name") for c in containers]
    for n in set(names):
        if names.count(n) > 1:
            fail(render, where, f"container name {n} used twice")
    port_names = []
    for c in containers:
        cw = f"{where} container {c.get('name')}"
        ports = c.get("ports") or []
        own_ports = {p.get("name") for p in ports if p.get("name")}
        port_names += [p.get("name") for p in ports if p.get("name")]
        for m in c.get("volumeMounts") or []:
            if m.get("name") not in volumes:
                fail(render, cw, f"mounts volume {m.get('name')}, which the pod does not have")
        for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
            port = ((c.get(probe) or {}).get("httpGet") or {}).get("port")
            if isinstance(port, str) and port not in own_ports:
                fail(render, cw, f"{probe} names port {port}, which the container does not declare")
        env = {e.get("name") for e in c.get("env") or []}
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
        command = c.get("command") or []
        if command:
            run = re.split(r"[\\/]", command[0])[-1]
            if run.removesuffix(".exe") != binary:
                fail(render, cw, f"command {command[0]} is not the image's binary {binary}")
            if host_process and re.match(r"^([A-Za-z]:)?[\\/]", command[0]):
                fail(render, cw, f"command {command[0]} is absolute: in a HostProcess container it is looked up on the host, not in the image")
            if len(command) > 1:
                fail(render, cw, "flags belong in args, not in command")
        for arg in c.get("args") or []:
            arg = str(arg)
            if not arg.startswith("-"):
                continue
            flag = arg.lstrip("-").split("=", 1)[0]
            counts["flags checked"] += 1
            if flag not in helps[binary]:
                fail(render, cw, f"{binary} does not accept --{flag} (not in its --help)")
    for n in set(port_names):
        if port_names.count(n) > 1:
            fail(render, where, f"port name {n} used twice in the pod")
        if len(n) > 15:
            fail(render, where, f"port name {n} is longer than 15 characters")


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
            if (kind, name) not in names:
                fail(render, "-", f"{sidecar}: upstream's {kind} {name} is missing")
        for kind, name, target in (("ClusterRoleBinding", crb, cr), ("RoleBinding", rb, role)):
            b = names.get((kind, name))
            if b is None:
                continue
            if (b.get("roleRef") or {}).get("name") != target:
                fail(render, describe(b), f"roleRef is not upstream's {target}")
            if not any(s.get("name") == sa for s in b.get("subjects") or []):
                fail(render, describe(b), f"does not bind upstream's ServiceAccount {sa}")


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
    helps = {b: help_flags(a.bin, b) for b in sorted(set(SIDECARS.values()))}
    tags = image_tags(manifests)
    counts = {"objects": 0, "sidecar containers": 0, "other containers": 0, "flags checked": 0}
    passed = failed = 0
    for d in dirs:
        before = len(failures)
        render = os.path.relpath(d, os.path.dirname(manifests))
        path = os.path.join(a.rendered, d.replace(os.sep, "__") + ".yaml")
        with open(path) as f:
            objs = [o for o in yaml.safe_load_all(f) if o]
        if not objs:
            fail(render, "-", "renders no object")
        for o in objs:
            counts["objects"] += 1
            for v in versions:
                try:
                    kv.validate(o, v, strict=True)
                except kv.ValidationError as e:
                    at = ".".join(str(p) for p in e.absolute_path) or "(top)"
                    fail(render, describe(o), f"Kubernetes {v} schema, at {at}: {e.message}")
                except kv.SchemaNotFoundError as e:
                    fail(render, describe(o), e.message)
            spec = o.get("spec") or {}
            if o.get("kind") in WORKLOADS:
                check_pod(render, o, (spec.get("template") or {}).get("spec") or {}, helps, tags, counts)
            elif o.get("kind") == "Pod":
                check_pod(render, o, spec, helps, tags, counts)
        check_rbac(render, objs)
        ok = len(failures) == before
        passed, failed = passed + ok, failed + (not ok)
        print(f"  {'ok  ' if ok else 'FAIL'} {render}: {len(objs)} objects")

    for line in failures:
        print(line)
    print(
        f"{len(dirs)} kustomizations, {counts['objects']} objects validated against the schemas of "
        f"Kubernetes {', '.join(versions)} (kubernetes-validate {kv.__version__}, strict); "
        f"{counts['sidecar containers']} sidecar containers, {counts['flags checked']} flags "
        f"checked against --help; {counts['other containers']} other containers"
    )
    print(f"manifests: {passed} passed, {failed} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
