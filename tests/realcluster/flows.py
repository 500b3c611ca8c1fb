"""The steps the real-cluster tests share: install the chart, wait for its parts, run and check
GPU pods; and the session's ``installed`` and per-test ``watch`` fixtures (conftest re-exports)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator

import pytest

from tests.realcluster import kube, workloads
from tests.realcluster.kube import KEYS, phase

NODE = "kvgpu-node"
RELEASE_NS = "kube-vgpu"
CAPACITY = str(workloads.GPU_COUNT * workloads.SPLIT)


def install(cluster: kube.Cluster, *args: str) -> None:
    done = subprocess.run(
        [sys.executable, str(cluster.repo / "scripts" / "cluster" / "install.py"), *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={"CLUSTER_DIR": str(cluster.dir), "HOME": str(cluster.dir), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stdout + done.stderr


def capacity(cluster: kube.Cluster) -> str | None:
    node = cluster.get("node", NODE)
    allocatable: dict[str, str] = node["status"].get("allocatable", {})
    return allocatable.get("nvidia.com/gpu")


def ready(pod: kube.Obj) -> bool:
    return any(
        c["type"] == "Ready" and c["status"] == "True" for c in pod.get("status", {}).get("conditions", [])
    )


def component_pods(cluster: kube.Cluster, component: str) -> list[kube.Obj]:
    selector = f"app.kubernetes.io/component={component}"
    items: list[kube.Obj] = cluster.get("pods", "-n", RELEASE_NS, "-l", selector)["items"]
    return [p for p in items if not p["metadata"].get("deletionTimestamp")]


def component_ready(cluster: kube.Cluster, component: str) -> bool:
    pods = component_pods(cluster, component)
    return len(pods) == 1 and ready(pods[0])


@pytest.fixture(scope="session")
def installed(cluster: kube.Cluster) -> Iterator[kube.Cluster]:
    install(cluster, "--tls", "secret")
    cluster.kubectl("create", "namespace", workloads.NAMESPACE)
    kube.wait_until(  # the controller-manager makes it; pods are refused until then
        "the namespace's default service account",
        lambda: (
            "default" in cluster.kubectl("get", "sa", "-n", workloads.NAMESPACE, "-o", "name", check=False)
        ),
    )
    kube.wait_until("the device plugin Ready", lambda: component_ready(cluster, "device-plugin"))
    kube.wait_until("the scheduler Ready", lambda: component_ready(cluster, "scheduler"))
    kube.wait_until("nvidia.com/gpu on the node", lambda: capacity(cluster) == CAPACITY)
    yield cluster


@pytest.fixture
def watch(installed: kube.Cluster) -> Iterator[kube.PodWatch]:
    w = kube.PodWatch(
        installed, namespace=workloads.NAMESPACE, memory_mib=workloads.GPU_MEMORY_MIB, split=workloads.SPLIT
    )
    try:
        yield w
    finally:
        w.close()
        assert not w.violations, f"GPU overcommitted: {w.violations[:5]}"


def delete_work(cluster: kube.Cluster, watch: kube.PodWatch) -> None:
    cluster.kubectl("delete", "pods", "-n", workloads.NAMESPACE, "--all", "--wait=false")
    watch.wait("every pod gone", lambda pods: not pods)


def all_running(names: set[str]) -> Callable[[dict[str, kube.Obj]], bool]:
    return lambda pods: names <= {n for n, p in pods.items() if phase(p) == "Running"}


def check_gpu_pod(cluster: kube.Cluster, pod: kube.Obj, *, hook_path: str = "hook") -> None:
    """The pod went through our scheduler and Allocate, and its container proved HAMi-core's files
    (``hook_path``: the chart's hookPath, under the cluster's directory)."""
    name = pod["metadata"]["name"]
    assert pod["spec"]["schedulerName"] == "vgpu-scheduler"  # set by the webhook
    assert pod["metadata"]["annotations"][KEYS.bind_phase] == "success"
    log = cluster.kubectl("logs", "-n", workloads.NAMESPACE, name)
    assert "READY" in log, log
    hook = cluster.dir / hook_path / "vgpu"
    assert f"preload-names={hook}/libvgpu.so" in log, log
    assert "hami-core stand-in preloaded" in log, log
    assert "CUDA_DEVICE_MEMORY_LIMIT_0=" in log and "NVIDIA_VISIBLE_DEVICES=GPU-" in log, log
    uid = pod["metadata"]["uid"]
    assert (hook / "containers" / f"{uid}_main").is_dir()
