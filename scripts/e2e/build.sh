#!/usr/bin/env bash
# build.sh: builds, from the lab's vendored Kubernetes tree (the one its control plane was built
# from), what a real node and the storage e2e suite need: kubelet, e2e.test, ginkgo, agnhost and
# the pause binary. Offline (the tree vendors everything); skips what is already built from the
# same tree unless FORCE=1.
#
# Env: LAB (the lab directory, required); OUT (default $LAB/e2e/bin).
set -euo pipefail
LAB=${LAB:?set LAB to the lab directory}
OUT=${OUT:-$LAB/e2e/bin}
K8S=$LAB/src/microshift/deps/github.com/openshift/kubernetes
GO_DIR=${GO_DIR:-/usr/lib/go-1.24/bin}
export PATH=$GO_DIR:$PATH
export GOFLAGS="-mod=vendor -buildvcs=false" GOPROXY=off GOTOOLCHAIN=local CGO_ENABLED=0
VERSION=v1.34.9
mkdir -p "$OUT"
cd "$K8S"

ldflags="-s -w"
for p in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
  ldflags+=" -X $p.gitVersion=$VERSION -X $p.gitMajor=1 -X $p.gitMinor=34 -X $p.gitTreeState=clean"
done

built() { [ -z "${FORCE:-}" ] && [ -x "$OUT/$1" ]; }
timed() { local s; s=$(date +%s); "$@"; echo "built in $(( $(date +%s) - s )) s"; }

if ! built kubelet; then
  echo "=== kubelet"
  timed go build -ldflags "$ldflags" -o "$OUT/kubelet" ./cmd/kubelet
fi
if ! built ginkgo; then
  echo "=== ginkgo"
  timed go build -o "$OUT/ginkgo" ./vendor/github.com/onsi/ginkgo/v2/ginkgo
fi
if ! built agnhost; then
  echo "=== agnhost"
  timed go build -ldflags "-s -w" -o "$OUT/agnhost" ./test/images/agnhost
fi
if ! built pause; then
  echo "=== pause"
  # The pause container's one program, static, as build/pause builds it.
  timed gcc -Os -static -DVERSION=3.10.1 -o "$OUT/pause" build/pause/linux/pause.c
  strip "$OUT/pause"
fi
if ! built e2e.test; then
  echo "=== e2e.test"
  timed go test -c -ldflags "$ldflags" -o "$OUT/e2e.test" ./test/e2e
fi
ls -l "$OUT"
