#!/usr/bin/env python3
"""mkimage.py: write a one-layer OCI image layout tar from a root directory.

usage: mkimage.py ROOTFS NAME OUT.tar [--entrypoint JSON] [--cmd JSON] [--workdir DIR] [--env K=V ...]

ROOTFS is packed as the single (uncompressed) layer, every entry owned by 0:0 with
mtime 0 and sorted, so the same input gives the same digest. NAME is the full image
reference (e.g. lab.local/pause:3.10.1); index.json carries it both as
io.containerd.image.name (what `ctr images import` names the image) and, tag only, as
org.opencontainers.image.ref.name. Import with: ctr -n k8s.io images import OUT.tar
"""
import argparse
import hashlib
import io
import json
import os
import tarfile

DEFAULT_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def layer_tar(root):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        entries = []
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            for n in dirnames + sorted(filenames):
                entries.append(os.path.join(dirpath, n))
        for path in sorted(entries, key=lambda p: os.path.relpath(p, root)):
            arc = os.path.relpath(path, root)
            ti = tar.gettarinfo(path, arcname=arc)
            ti.uid = ti.gid = 0
            ti.uname = ti.gname = "root"
            ti.mtime = 0
            if ti.isreg():
                with open(path, "rb") as f:
                    tar.addfile(ti, f)
            else:
                tar.addfile(ti)
    return buf.getvalue()


def blob(data):
    return "sha256:" + hashlib.sha256(data).hexdigest()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("rootfs")
    ap.add_argument("name")
    ap.add_argument("out")
    ap.add_argument("--entrypoint", default="null")
    ap.add_argument("--cmd", default="null")
    ap.add_argument("--workdir", default="/")
    ap.add_argument("--env", action="append", default=[])
    a = ap.parse_args()

    layer = layer_tar(a.rootfs)
    layer_digest = blob(layer)
    cfg = {"Env": [DEFAULT_PATH] + a.env, "WorkingDir": a.workdir}
    ep, cmd = json.loads(a.entrypoint), json.loads(a.cmd)
    if ep:
        cfg["Entrypoint"] = ep
    if cmd:
        cfg["Cmd"] = cmd
    config = json.dumps({
        "created": "1970-01-01T00:00:00Z",
        "architecture": "amd64",
        "os": "linux",
        "config": cfg,
        "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
        "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "mkimage.py"}],
    }, sort_keys=True).encode()
    manifest = json.dumps({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": blob(config), "size": len(config)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": layer_digest, "size": len(layer)}],
    }, sort_keys=True).encode()
    tag = a.name.rsplit(":", 1)[1] if ":" in a.name.rsplit("/", 1)[-1] else "latest"
    index = json.dumps({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": blob(manifest), "size": len(manifest),
            "platform": {"architecture": "amd64", "os": "linux"},
            "annotations": {"io.containerd.image.name": a.name,
                            "org.opencontainers.image.ref.name": tag},
        }],
    }, sort_keys=True).encode()

    files = [("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')]
    for data in (layer, config, manifest):
        files.append(("blobs/sha256/" + blob(data)[7:], data))
    files.append(("index.json", index))
    tmp = a.out + ".tmp"
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
        for d in ("blobs", "blobs/sha256"):
            ti = tarfile.TarInfo(d)
            ti.type, ti.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(ti)
        for name, data in files:
            ti = tarfile.TarInfo(name)
            ti.size, ti.mode = len(data), 0o644
            tar.addfile(ti, io.BytesIO(data))
    os.replace(tmp, a.out)
    print(f"{a.name} {blob(manifest)} ({len(layer)} bytes layer) -> {a.out}")


if __name__ == "__main__":
    main()
