#!/usr/bin/env bash
# Build a real kube-apiserver and kube-scheduler (Kubernetes v1.20.2) from Debian 12's `kubernetes`
# source package, and install Debian's etcd, for `bench.throughput_bench --k8s-bin DIR` and the
# tests marked `realk8s` (VGPU_K8S_BIN=DIR). Debian's registry is the only place this project's
# machines can fetch Kubernetes from; its binary package carries kubectl only, so the servers are
# built from the source package, which in Debian 12 ships the whole tree with its vendor directory.
# trixie's (1.32.3+ds) and sid's (1.36.4+ds) source packages are newer but carry kubectl's sources
# only (cmd/kubectl and staging/, 3.3 MB, no vendor directory): no newer kube-apiserver or
# kube-scheduler can be built from this registry.
#
#   sudo scripts/build-kubernetes.sh [OUT_DIR]      (default: .k8s/bin; about 5 minutes on 2 cores)
#
# Needs root for apt (golang-go, etcd-server, rsync, the modern-go/reflect2 package) and a
# deb-src entry (added here for bookworm when missing). Two things the 2021 tree needs on
# Debian 12's Go 1.19:
# - GOPATH mode (GO111MODULE=off), as Kubernetes built itself then: module mode wants a go.mod
#   update the vendor directory cannot give;
# - reflect2 1.0.2 in place of the vendored 1.0.1, which crashes on Go >= 1.18 (json-iterator
#   panics with a nil pointer on the first request body); Debian packages 1.0.2.
set -euo pipefail

OUT=$(realpath -m "${1:-.k8s/bin}")
WORK=${K8S_BUILD_DIR:-/tmp/kube-vgpu-k8s-build}
VERSION=1.20.2

if ! grep -rqs '^Types:.*deb-src' /etc/apt/sources.list.d/ && ! grep -qs '^deb-src' /etc/apt/sources.list; then
    sed 's/^Types: deb$/Types: deb-src/' /etc/apt/sources.list.d/debian.sources >/etc/apt/sources.list.d/kube-vgpu-src.sources
fi
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq golang-go etcd-server rsync golang-github-modern-go-reflect2-dev >/dev/null

mkdir -p "$WORK" "$OUT"
cd "$WORK"
if [ ! -d "kubernetes-$VERSION" ]; then
    apt-get source --download-only kubernetes >/dev/null
    tar xzf kubernetes_*.orig.tar.gz
fi
SRC="$WORK/kubernetes-$VERSION"
rm -rf "$SRC/vendor/github.com/modern-go/reflect2"
cp -r /usr/share/gocode/src/github.com/modern-go/reflect2 "$SRC/vendor/github.com/modern-go/reflect2"

export GOCACHE="$WORK/gocache" GOPATH="$WORK/gopath" GO111MODULE=off CGO_ENABLED=0
mkdir -p "$GOPATH/src/k8s.io"
ln -sfn "$SRC" "$GOPATH/src/k8s.io/kubernetes"
cd "$GOPATH/src/k8s.io/kubernetes"
[ -s pkg/generated/openapi/zz_generated.openapi.go ] || make generated_files >/dev/null
pkg=k8s.io/kubernetes/vendor/k8s.io/component-base/version
flags="-X $pkg.gitVersion=v$VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$(echo "$VERSION" | cut -d. -f2) -X $pkg.gitTreeState=clean"
for cmd in kube-apiserver kube-scheduler; do
    go build -ldflags "$flags" -o "$OUT/$cmd" "./cmd/$cmd"
done
ln -sfn "$(command -v etcd)" "$OUT/etcd"
"$OUT/kube-apiserver" --version
"$OUT/kube-scheduler" --version
"$OUT/etcd" --version | head -1
