#!/usr/bin/env bash
# The images a fake-GPU cluster needs, built without a Docker daemon or an image registry (umoci
# and skopeo; the project image from a debootstrap'd Debian 12 and PyPI), then loaded into the
# cluster's containerd (scripts/cluster/cluster.sh must be up):
#
#   localhost/kube-vgpu:dev              the project image: what the Dockerfile builds (Python
#                                        3.11, the wheel and its dependencies in /opt/kube-vgpu,
#                                        user 65532, entrypoint vgpu-scheduler), Debian's python3
#                                        instead of python:3.11-slim (not pullable offline)
#   localhost/kube-scheduler:<version>   the kube-scheduler binary of K8S_BIN on an empty base
#   localhost/kube-vgpu-pause:3.10       the pod sandbox image (busybox-static sleeping)
#   localhost/hami-core-standin:dev      a STAND-IN for HAMi's installer image (fake GPUs only):
#                                        vgpu-init.sh and a no-op libvgpu.so (hami-core-standin/)
#
# Built images are cached in CACHE_DIR (default /var/tmp/kube-vgpu-cluster-cache) and rebuilt
# when missing; `images.sh build` only builds, `images.sh load` (the default) builds and loads.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
CLUSTER_DIR=${CLUSTER_DIR:-/var/tmp/kube-vgpu-cluster}
CACHE_DIR=${CACHE_DIR:-/var/tmp/kube-vgpu-cluster-cache}
K8S_BIN=${K8S_BIN:-$(cat "$CLUSTER_DIR/k8s-bin" 2>/dev/null || true)}
DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
PYTHON=${PYTHON:-python3}
PROJECT_IMAGE=localhost/kube-vgpu:dev
PAUSE_IMAGE=localhost/kube-vgpu-pause:3.10
STANDIN_IMAGE=localhost/hami-core-standin:dev

die() { echo "images.sh: $*" >&2; exit 1; }
log() { echo "images.sh: $*" >&2; }

layout=$CACHE_DIR/oci

new_image() { # tag: an empty image in the cache's OCI layout
  [ -d "$layout" ] || umoci init --layout "$layout"
  umoci rm --image "$layout:$1" 2>/dev/null || true
  umoci new --image "$layout:$1"
}

archive() { # tag name: docker-archive tar of the image, named for containerd
  rm -f "$CACHE_DIR/$1.tar"
  skopeo copy --quiet "oci:$layout:$1" "docker-archive:$CACHE_DIR/$1.tar:$2"
}

build_pause() {
  [ -f "$CACHE_DIR/pause.tar" ] && return 0
  local root=$CACHE_DIR/pause-root
  rm -rf "$root" && mkdir -p "$root/bin"
  cp /bin/busybox "$root/bin/busybox"
  new_image pause
  umoci insert --image "$layout:pause" "$root" /
  umoci config --image "$layout:pause" --config.entrypoint /bin/busybox \
    --config.cmd sleep --config.cmd 2147483647
  archive pause "$PAUSE_IMAGE"
}

build_standin() {
  [ -f "$CACHE_DIR/hami-core-standin.tar" ] && return 0
  local root=$CACHE_DIR/standin-root applet
  rm -rf "$root" && mkdir -p "$root/bin" "$root/k8s-vgpu/bin" "$root/k8s-vgpu/lib/nvidia"
  cp /bin/busybox "$root/bin/busybox"
  for applet in sh ls sort tail cp test echo cat mkdir rm; do ln -s busybox "$root/bin/$applet"; done
  cp "$HERE/hami-core-standin/vgpu-init.sh" "$root/k8s-vgpu/bin/vgpu-init.sh"
  gcc -shared -fPIC -O2 -Wall -o "$root/k8s-vgpu/lib/nvidia/libvgpu.so.0.0.0-standin" \
    "$HERE/hami-core-standin/libvgpu-standin.c"
  new_image hami-core-standin
  umoci insert --image "$layout:hami-core-standin" "$root" /
  umoci config --image "$layout:hami-core-standin" --config.env PATH=/bin
  archive hami-core-standin "$STANDIN_IMAGE"
}

build_kube_scheduler() {
  local version
  version=$("$K8S_BIN/kube-scheduler" --version | awk '{print $2}')
  [ -f "$CACHE_DIR/kube-scheduler-$version.tar" ] && return 0
  local root=$CACHE_DIR/kube-scheduler-root
  rm -rf "$root" && mkdir -p "$root/usr/local/bin"
  cp "$K8S_BIN/kube-scheduler" "$root/usr/local/bin/kube-scheduler"
  new_image "kube-scheduler-$version"
  umoci insert --image "$layout:kube-scheduler-$version" "$root" /
  umoci config --image "$layout:kube-scheduler-$version" --config.env PATH=/usr/local/bin \
    --config.entrypoint kube-scheduler
  archive "kube-scheduler-$version" "localhost/kube-scheduler:$version"
}

base_rootfs() { # Debian 12 with python3 and venv: what python:3.11-slim-bookworm gives the Dockerfile
  local root=$CACHE_DIR/rootfs-base
  [ -d "$root" ] && return 0
  rm -rf "$root.tmp"
  debootstrap --variant=minbase --include=python3,python3-venv,python-is-python3,passwd \
    bookworm "$root.tmp" "$DEBIAN_MIRROR" >"$CACHE_DIR/debootstrap.log"
  mv "$root.tmp" "$root"
}

build_project() {
  [ -f "$CACHE_DIR/kube-vgpu.tar" ] && [ "$CACHE_DIR/kube-vgpu.tar" -nt "$REPO/pyproject.toml" ] &&
    [ -z "$(find "$REPO/libs" "$REPO/services" -newer "$CACHE_DIR/kube-vgpu.tar" -name '*.py' | head -1)" ] &&
    return 0
  base_rootfs
  # the Dockerfile's build stage: the wheel and its dependencies (wheels from PyPI, built here)
  local wheels=$CACHE_DIR/wheels root=$CACHE_DIR/project-root
  rm -rf "$wheels" && mkdir -p "$wheels"
  "$PYTHON" -m pip wheel --quiet --wheel-dir "$wheels" "$REPO"
  rm -rf "$root" && cp -a "$CACHE_DIR/rootfs-base" "$root"
  mkdir -p "$root/wheels" && cp "$wheels"/*.whl "$root/wheels/"
  chroot "$root" python -m venv /opt/kube-vgpu
  chroot "$root" /opt/kube-vgpu/bin/pip install --quiet --no-index --find-links /wheels kube-vgpu
  chroot "$root" /opt/kube-vgpu/bin/vgpu-scheduler --help >/dev/null
  chroot "$root" /opt/kube-vgpu/bin/vgpu-device-plugin --help >/dev/null
  chroot "$root" /opt/kube-vgpu/bin/vgpu-monitor --help >/dev/null
  chroot "$root" groupadd --system --gid 65532 vgpu
  chroot "$root" useradd --system --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
    --shell /usr/sbin/nologin vgpu
  # the runtime stage has no sources, wheels, caches or apt lists
  rm -rf "$root/wheels" "$root/var/cache/apt"/* "$root/var/lib/apt/lists"/* "$root/root/.cache"
  find "$root/opt/kube-vgpu" -name __pycache__ -type d -prune -exec rm -rf {} +
  new_image kube-vgpu
  umoci insert --image "$layout:kube-vgpu" "$root" /
  umoci config --image "$layout:kube-vgpu" \
    --config.env PATH=/opt/kube-vgpu/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --config.env PYTHONUNBUFFERED=1 --config.env PYTHONDONTWRITEBYTECODE=1 \
    --config.user 65532:65532 --config.entrypoint vgpu-scheduler
  archive kube-vgpu "$PROJECT_IMAGE"
  rm -rf "$root"
}

cmd_build() {
  [ "$(id -u)" = 0 ] || die "needs root (debootstrap, chroot)"
  [ -n "$K8S_BIN" ] || die "set K8S_BIN (or bring the cluster up first)"
  for b in umoci skopeo debootstrap gcc busybox; do command -v "$b" >/dev/null || die "$b not found"; done
  mkdir -p "$CACHE_DIR"
  local t0=$SECONDS
  build_pause
  build_standin
  build_kube_scheduler
  build_project
  log "built in $((SECONDS - t0))s"
}

cmd_load() {
  cmd_build
  local sock=$CLUSTER_DIR/containerd/containerd.sock tar bin
  bin=$(cat "$CLUSTER_DIR/run/containerd-bin" 2>/dev/null || true) # cluster.sh's CONTAINERD_BIN
  if [ -n "$bin" ]; then PATH=$bin:$PATH; fi
  [ -S "$sock" ] || die "no containerd at $sock: run scripts/cluster/cluster.sh up first"
  # the layers' blobs are not kept once unpacked (ctr 1.7+): half the data to write now and to
  # delete at `cluster.sh down` (an 800 MB rm on this disk took 0.4-15 s)
  local keep=()
  if ctr images import --help 2>&1 | grep -q -- --discard-unpacked-layers; then keep=(--discard-unpacked-layers); fi
  for tar in "$CACHE_DIR"/*.tar; do
    ctr --address "$sock" -n k8s.io images import "${keep[@]}" "$tar" >/dev/null
  done
  log "loaded: $(ctr --address "$sock" -n k8s.io images ls -q | grep '^localhost/' | tr '\n' ' ')"
}

case "${1:-load}" in
  build) cmd_build ;;
  load) cmd_load ;;
  *) die "usage: $0 [build|load]" ;;
esac
