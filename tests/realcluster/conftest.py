"""The tests marked ``realcluster`` install the chart on a real single-node cluster
(``scripts/cluster/cluster.sh``: kubelet, containerd, runc, CNI and a control plane from the
Kubernetes v1.36 binaries in ``VGPU_K8S_BIN``). Without root, those binaries or the tools the
scripts use, they are skipped with the reason, as the ``gpu`` tests are without a GPU.
``VGPU_CONTAINERD_BIN`` names a directory with another containerd (a CDI-capable 1.7, as
``scripts/cluster/containerd-cdi.sh`` unpacks it); the DRA tests need one and skip without.

One cluster serves the whole session: brought up, its images loaded and the chart installed once
(``cluster`` fixture); at the end it is taken down and nothing may be left behind."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator

import pytest

from bench import realk8s
from tests.realcluster import kube
from tests.realcluster.flows import installed, watch
from tests.realk8s import binaries

__all__ = ["installed", "watch"]  # fixtures of flows.py

REPO = pathlib.Path(__file__).resolve().parents[2]
TOOLS = (
    "etcd",
    "containerd",
    "containerd-shim-runc-v2",
    "runc",
    "ctr",
    "umoci",
    "skopeo",
    "debootstrap",
    "busybox",
    "gcc",
    "iptables",
    "openssl",
)


# what kubelet, containerd and CNI make outside the cluster's directory (cluster.sh down removes them)
HOST_DIRS = tuple(
    pathlib.Path(d)
    for d in ("/var/lib/kubelet", "/run/containerd", "/run/netns", "/var/lib/cni", "/tmp/vgpulock")
)
MIN_MINOR = 31  # kubelet's config fields failCgroupV1 (1.31) and podLogsDir (1.29)


def _requirements() -> pathlib.Path:
    if not os.environ.get("VGPU_K8S_BIN"):
        pytest.skip(
            "VGPU_K8S_BIN is not set: a directory of Kubernetes v1.36 binaries (kube-apiserver, "
            "kube-controller-manager, kube-scheduler, kubelet, kubectl; docs/install.md)"
        )
    k8s_bin = binaries.k8s_bin(
        "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kubectl"
    )
    version = subprocess.run(
        [str(k8s_bin / "kubelet"), "--version"], capture_output=True, text=True, timeout=30, check=False
    ).stdout
    minor = realk8s.minor_version(version)
    if minor is None or minor < MIN_MINOR:
        pytest.skip(
            f"{k8s_bin}/kubelet is {version.strip() or 'unreadable'}: the cluster needs v1.{MIN_MINOR}+"
        )
    if os.geteuid() != 0:
        pytest.skip("the real cluster needs root (containerd, kubelet, network interfaces)")
    missing = [t for t in TOOLS if shutil.which(t, path="/usr/sbin:/usr/bin:/sbin:/bin") is None]
    if missing or not pathlib.Path("/usr/lib/cni/bridge").exists():
        pytest.skip(
            f"tools missing: {' '.join(missing) or '/usr/lib/cni/bridge'} (docs/install.md lists the packages)"
        )
    return k8s_bin


@pytest.fixture(scope="session")
def cluster() -> Iterator[kube.Cluster]:
    k8s_bin = _requirements()
    state = pathlib.Path(os.environ.get("CLUSTER_DIR") or tempfile.mkdtemp(prefix="kvgpu-", dir="/var/tmp"))
    shutil.rmtree(state, ignore_errors=True)
    containerd_bin = os.environ.get("VGPU_CONTAINERD_BIN")
    c = kube.Cluster(
        dir=state,
        k8s_bin=k8s_bin,
        repo=REPO,
        containerd_bin=pathlib.Path(containerd_bin) if containerd_bin else None,
        # where the chart's DaemonSets mount kubelet's plugin and registration directories
        kubelet_root=pathlib.Path("/var/lib/kubelet"),
    )
    host_dirs_before = {d for d in HOST_DIRS if d.exists()}
    timings = {}
    start = time.monotonic()
    try:
        c.script("cluster.sh", "up")
        timings["up"] = time.monotonic() - start
        start = time.monotonic()
        c.script("images.sh", "load")
        timings["images"] = time.monotonic() - start
        yield c
    finally:
        start = time.monotonic()
        said = c.script("cluster.sh", "down")
        timings["down"] = time.monotonic() - start
        print(f"\ncluster timings (s): {', '.join(f'{k} {v:.1f}' for k, v in timings.items())}")
        print(said.strip())  # down's time per step
        assert_nothing_left(state)
        assert {d for d in HOST_DIRS if d.exists()} == host_dirs_before, "host directories left"


def assert_nothing_left(state: pathlib.Path) -> None:
    """No process, mount, interface or directory of the cluster remains."""
    assert not state.exists(), f"{state} is left"
    mounts = pathlib.Path("/proc/self/mountinfo").read_text()
    assert str(state) not in mounts and "/run/netns/cni-" not in mounts, "mounts left"
    for proc in pathlib.Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        assert str(state) not in cmdline, f"process {proc.name} left: {cmdline}"
    links = pathlib.Path("/sys/class/net")
    assert not (links / "kvgpu-br0").exists() and not (links / "kvgpu-node0").exists(), "interfaces left"
