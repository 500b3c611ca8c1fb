"""kubelet's device IDs name the GPU served, or the Allocate is refused with the reason: reused
init-container IDs and a TopologyManager NUMA restriction, on the emulated kubelet (which follows
kubelet's devicesToAllocate: reusable devices first; with a NUMA hint, aligned devices only)."""

import json
import pathlib
from typing import Any

import pytest
from vgpu.localcluster.kubelet import ALLOCATIONS_ANNOTATION
from vgpu.localcluster.store import Store
from vgpu_device_plugin import dirwatch

from tests.device_plugin.builders import GPU_A, GPU_B, KEYS, NODE
from tests.device_plugin.test_kubelet_emulation import settled, wait_for
from tests.device_plugin.test_kubelet_restart import rig


def gpu_pod(store: Store, name: str, *, init: str | None, main: str | tuple[str, ...]) -> None:
    """``init`` (if any, one GPU) and ``main`` (one GPU or several) name the scheduler's GPUs."""
    mains = (main,) if isinstance(main, str) else main
    gpu = {"limits": {"nvidia.com/gpu": "1"}}
    entries = ([f"{init},NVIDIA,1000,10:"] if init else []) + ["".join(f"{m},NVIDIA,2000,20:" for m in mains)]
    value = "".join(f"{e};" for e in entries)
    store.create(
        "pods",
        {
            "metadata": {
                "name": name,
                "annotations": {
                    KEYS.assigned_node: NODE,
                    KEYS.bind_phase: "allocating",
                    KEYS.bind_time: "100",
                    KEYS.devices_to_allocate: value,
                    KEYS.devices_allocated: value,
                },
            },
            "spec": {
                "nodeName": NODE,
                "initContainers": [{"name": "prep", "image": "x", "resources": gpu}] if init else [],
                "containers": [
                    {
                        "name": "train",
                        "image": "x",
                        "resources": {"limits": {"nvidia.com/gpu": str(len(mains))}},
                    }
                ],
            },
        },
        namespace="default",
    )


def served(pod: Any) -> dict[str, tuple[list[str], str]]:
    """Per container: kubelet's IDs and the GPU the plugin served."""
    got = json.loads(pod["metadata"]["annotations"][ALLOCATIONS_ANNOTATION])
    return {c: (e["devices"], e["envs"]["NVIDIA_VISIBLE_DEVICES"]) for c, e in got.items()}


async def test_init_and_app_on_one_gpu_keep_kubelet_s_reused_ids_and_the_served_gpu_the_same(
    tmp_path: pathlib.Path,
) -> None:
    async with rig(tmp_path, dirwatch.InotifyWatcher()) as r:
        gpu_pod(r.store, "same", init=GPU_A, main=GPU_A)
        pod = await wait_for(r.store, "pods", "same", settled, namespace="default")
        assert pod["status"]["phase"] == "Running"
        got = served(pod)
        assert got["prep"] == got["train"] == ([f"{GPU_A}-0"], GPU_A)  # kubelet reused the init's ID


async def test_an_app_asking_for_more_gpus_than_its_init_container_runs_with_its_gpus_among_them(
    tmp_path: pathlib.Path,
) -> None:
    """The scheduler's placement (``vgpu.core.reuse``): the init container on GPU A, the app on A and
    B. kubelet gives the app the init's ID on A first and asks the plugin for one more (must-include
    the reused one): the plugin prefers B, and the Allocate names A and B."""
    async with rig(tmp_path, dirwatch.InotifyWatcher()) as r:
        gpu_pod(r.store, "wider", init=GPU_A, main=(GPU_A, GPU_B))
        pod = await wait_for(r.store, "pods", "wider", settled, namespace="default")
        assert pod["status"]["phase"] == "Running", pod["status"]
        got = served(pod)
        assert got["prep"] == ([f"{GPU_A}-0"], GPU_A)
        ids, visible = got["train"]
        assert ids[0] == f"{GPU_A}-0" and ids[1].startswith(GPU_B)  # reused first, then preferred
        assert set(visible.split(",")) == {GPU_A, GPU_B}


async def test_reused_init_ids_on_another_gpu_are_refused_with_the_reason(tmp_path: pathlib.Path) -> None:
    """kubelet gives the app container its init container's device (on GPU A) while the scheduler
    placed it on GPU B: serving B would leave PodResources naming A; serving A is uncounted."""
    async with rig(tmp_path, dirwatch.InotifyWatcher()) as r:
        gpu_pod(r.store, "split", init=GPU_A, main=GPU_B)
        pod = await wait_for(r.store, "pods", "split", settled, namespace="default")
        assert pod["status"]["phase"] == "Failed" and pod["status"]["reason"] == "UnexpectedAdmissionError"
        message = pod["status"]["message"]
        assert f"container train: kubelet's devices ['{GPU_A}-0'] are on GPU(s) {GPU_A}" in message
        assert f"the scheduler assigned {GPU_B}" in message
        assert "kubelet reused the devices of the pod's init container" in message
        assert pod["metadata"]["annotations"][KEYS.bind_phase] == "failed"


def numa0(pod: Any, container: str) -> frozenset[int]:
    """single-numa-node with the static CPU manager: the CPUs (and so the hint) on NUMA node 0."""
    return frozenset({0})


@pytest.mark.parametrize(
    ("gpu", "phase"),
    [(GPU_A, "Running"), (GPU_B, "Failed")],
    ids=["scheduler-on-numa0", "scheduler-on-numa1"],
)
async def test_a_numa_hint_away_from_the_scheduler_s_gpu_is_refused_not_served_misaligned(
    tmp_path: pathlib.Path, gpu: str, phase: str
) -> None:
    async with rig(tmp_path, dirwatch.InotifyWatcher(), topology_hint=numa0, enable_numa_topology=True) as r:
        gpu_pod(r.store, "p", init=None, main=gpu)
        pod = await wait_for(r.store, "pods", "p", settled, namespace="default")
        assert pod["status"]["phase"] == phase
        if phase == "Running":
            assert served(pod)["train"] == ([f"{GPU_A}-0"], GPU_A)
        else:
            message = pod["status"]["message"]
            assert f"kubelet's devices ['{GPU_A}-0'] are on GPU(s) {GPU_A} (NUMA 0)" in message
            assert f"the scheduler assigned {GPU_B} (NUMA 1)" in message
            assert "TopologyManager aligned the container to another NUMA node" in message


@pytest.mark.parametrize(
    ("version", "phase"),
    [("v1.27.3", "Failed"), ("v1.29.1", "Running")],
    ids=["kubelet-1.27", "kubelet-1.29"],
)
async def test_cdi_cri_is_refused_where_kubelet_drops_cdi_devices(
    tmp_path: pathlib.Path, version: str, phase: str
) -> None:
    async with rig(tmp_path, dirwatch.InotifyWatcher(), device_list_strategy="cdi-cri") as r:
        r.store.patch(
            "nodes", NODE, {"status": {"nodeInfo": {"kubeletVersion": version}}}, subresource="status"
        )
        gpu_pod(r.store, "p", init=None, main=GPU_A)
        pod = await wait_for(r.store, "pods", "p", settled, namespace="default")
        assert pod["status"]["phase"] == phase
        if phase == "Failed":
            assert (
                f"deviceListStrategy cdi-cri needs kubelet >= 1.28 (DevicePluginCDIDevices); this node's kubelet is {version}"
                in pod["status"]["message"]
            )
        else:
            got = json.loads(pod["metadata"]["annotations"][ALLOCATIONS_ANNOTATION])
            assert got["train"]["cdiDevices"] == [f"nvidia.com/gpu={GPU_A}", "kube-vgpu.io/hami-core=shared"]
