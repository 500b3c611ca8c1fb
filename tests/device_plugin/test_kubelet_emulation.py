"""End to end on one emulated node: the local cluster's kubelet (real unix sockets, real gRPC) admits
pods through our plugin, fed by watches (InformerView), as in the demo."""

import asyncio
import contextlib
import json
import pathlib
import shutil
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pytest
from vgpu.core import annotations
from vgpu.demo import hamicore
from vgpu.gpu import fake
from vgpu.kube.port import JsonObj
from vgpu.localcluster import kubeletruntime, statuswriter
from vgpu.localcluster.kubelet import ALLOCATIONS_ANNOTATION, KubeletEmulator
from vgpu.localcluster.store import Store
from vgpu_device_plugin.hostfs import HostFs
from vgpu_device_plugin.manager import Deps, PluginManager
from vgpu_device_plugin.podcache import InformerView

from tests.device_plugin.builders import (
    GPU_A,
    GPU_B,
    KEYS,
    NODE,
    add_pod,
    cluster,
    config,
    fake_backend,
    installed_host,
    lock_node,
    node_reporter,
    short_tmp,
)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Node:
    store: Store
    backend: fake.FakeGpuBackend
    kubelet: KubeletEmulator
    manager: PluginManager
    clock: Clock
    plugin_dir: pathlib.Path


async def wait_for(
    store: Store, kind: str, name: str, check: Callable[[JsonObj], bool], *, namespace: str | None = None
) -> JsonObj:
    """Wait (on a store watch, 10 s at most) until the object satisfies ``check``."""
    watcher = store.watch(kind, namespace=namespace, field_selector=f"metadata.name={name}")
    try:
        while True:
            event = await watcher.next_event(timeout_s=10)
            assert event is not None, f"{kind} {name} never reached the expected state"
            if check(event.object):
                return event.object
    finally:
        watcher.close()


def gpu_allocatable(want: int) -> Callable[[JsonObj], bool]:
    return lambda node: (node.get("status") or {}).get("allocatable", {}).get("nvidia.com/gpu") == str(want)


def no_healthy_gpu_registered(node: JsonObj) -> bool:
    raw = (node["metadata"].get("annotations") or {}).get(KEYS.node_register)
    return raw is not None and not any(g.health for g in annotations.decode_node_register(raw))


def settled(pod: JsonObj) -> bool:
    return pod.get("status", {}).get("phase") in ("Running", "Failed")


@contextlib.asynccontextmanager
async def emulated_node(
    tmp_path: pathlib.Path, *, install: bool = True, want: int = 4
) -> AsyncIterator[Node]:
    """The plugin and the emulated kubelet sharing ``tmp_path`` as the node's "/" (the runtime
    starts containers there); HAMi-core installed by the chart's installer unless ``install`` is
    False. Yields once ``want`` GPUs are allocatable."""
    plugin_dir = short_tmp()
    store, api = cluster()
    backend = fake_backend()
    kubelet = KubeletEmulator(
        api,
        node=NODE,
        socket_dir=plugin_dir,
        status_writer=statuswriter.StoreStatusWriter(store),
        host_root=tmp_path,
    )
    await kubelet.start()
    clock = Clock()
    cfg = config(
        device_split_count=2, kubelet_poll_s=0.02, health_probe_interval_s=0.02, health_recovery_s=30
    )
    view = InformerView(api, node=NODE)
    deps = Deps(
        backend=backend,
        api=api,
        view=view,
        reporter=node_reporter(api),
        config=cfg,
        node=NODE,
        plugin_dir=plugin_dir,
        host=installed_host(tmp_path, hook_path=cfg.hook_path)
        if install
        else HostFs(tmp_path, hook_path=cfg.hook_path),
        clock=clock,
    )
    manager = PluginManager(deps)
    view_task = asyncio.create_task(view.run())
    await asyncio.wait_for(view.wait_synced(), 10)
    task = asyncio.create_task(manager.run())
    try:
        await wait_for(store, "nodes", NODE, gpu_allocatable(want))
        yield Node(store, backend, kubelet, manager, clock, plugin_dir)
    finally:
        manager.request_stop()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, 10)
        view_task.cancel()
        await asyncio.gather(view_task, return_exceptions=True)
        await kubelet.stop()
        shutil.rmtree(plugin_dir, ignore_errors=True)


@pytest.fixture
async def node(tmp_path: pathlib.Path) -> AsyncIterator[Node]:
    async with emulated_node(tmp_path) as running:
        yield running


def gpu_pod(store: Store, name: str, to_allocate: str, counts: dict[str, int], **kw: Any) -> None:
    """Created whole, resources included, as a real API server has it (one ADDED event)."""
    resources = {c: {"limits": {"nvidia.com/gpu": str(n)}} for c, n in counts.items() if n}
    add_pod(store, name, to_allocate=to_allocate, containers=tuple(counts), resources=resources, **kw)


def allocations(pod: JsonObj) -> dict[str, Any]:
    got: dict[str, Any] = json.loads(pod["metadata"]["annotations"][ALLOCATIONS_ANNOTATION])
    return got


async def test_pod_with_two_containers_is_admitted(node: Node) -> None:
    gpu_pod(
        node.store,
        "two",
        f"{GPU_A},NVIDIA,3000,50:;{GPU_A},NVIDIA,1000,20:{GPU_B},NVIDIA,1000,20:;",
        {"train": 1, "eval": 2},
    )
    lock_node(node.store, "two")
    pod = await wait_for(node.store, "pods", "two", settled, namespace="default")
    assert pod["status"]["phase"] == "Running", pod["status"]
    got = allocations(pod)
    assert got["train"]["envs"]["NVIDIA_VISIBLE_DEVICES"] == GPU_A
    assert got["train"]["envs"]["CUDA_DEVICE_MEMORY_LIMIT_0"] == "3000m"
    assert got["eval"]["envs"]["NVIDIA_VISIBLE_DEVICES"] == f"{GPU_A},{GPU_B}"
    assert got["eval"]["envs"]["CUDA_DEVICE_SM_LIMIT"] == "20"
    assert [d.rsplit("-", 1)[0] for d in got["eval"]["devices"]] == [GPU_A, GPU_B]  # preferred allocation
    notes = pod["metadata"]["annotations"]
    assert notes[KEYS.bind_phase] == "success"
    assert KEYS.node_lock not in (node.store.get("nodes", NODE)["metadata"].get("annotations") or {})


async def test_garbage_annotation_fails_the_pod_with_a_clear_reason(node: Node) -> None:
    gpu_pod(node.store, "junk", "GPU-nope,NVIDIA,lots,50:;", {"main": 1})
    pod = await wait_for(node.store, "pods", "junk", settled, namespace="default")
    assert pod["status"]["phase"] == "Failed"
    assert pod["status"]["reason"] == "UnexpectedAdmissionError"
    assert "pod default/junk" in pod["status"]["message"] and "invalid integer" in pod["status"]["message"]
    assert pod["metadata"]["annotations"][KEYS.bind_phase] == "failed"


async def test_xid_and_recovery_move_allocatable(node: Node) -> None:
    node.backend.inject_xid(GPU_B, 79)
    await wait_for(node.store, "nodes", NODE, gpu_allocatable(2))
    node.clock.now += 31
    await wait_for(node.store, "nodes", NODE, gpu_allocatable(4))


async def test_kubelet_restart_brings_capacity_back(node: Node) -> None:
    await node.kubelet.restart()
    await asyncio.wait_for(node.manager.wait_registered(2), 10)
    assert node.manager.sessions_started == 1  # registered again within the session
    await wait_for(node.store, "nodes", NODE, gpu_allocatable(4))


# --- HAMi-core's files (issue 47): a real runtime makes a missing mount source a directory ---------


def _hami_core(root: pathlib.Path) -> pathlib.Path:
    return root / "usr/local/vgpu"


async def test_allocate_refuses_when_hami_core_is_gone_and_the_runtime_creates_nothing(
    tmp_path: pathlib.Path,
) -> None:
    """libvgpu.so removed after the start (a failed reinstall): Allocate is refused naming the
    path and the installer, the GPUs turn unhealthy at once, and the emulated runtime (which, like
    containerd, makes a missing mount source a directory) never gets the mount. Reinstalled: healthy
    again and a pod runs."""
    async with emulated_node(tmp_path) as node:
        (_hami_core(tmp_path) / "libvgpu.so").unlink()
        gpu_pod(node.store, "blind", f"{GPU_A},NVIDIA,3000,50:;", {"main": 1})
        lock_node(node.store, "blind")
        pod = await wait_for(node.store, "pods", "blind", settled, namespace="default")
        assert pod["status"]["phase"] == "Failed", pod["status"]
        message = pod["status"]["message"]
        assert "/usr/local/vgpu/libvgpu.so is missing" in message and "hami-core-installer" in message
        assert not (_hami_core(tmp_path) / "libvgpu.so").exists()  # no directory in its place
        await wait_for(node.store, "nodes", NODE, gpu_allocatable(0))
        await wait_for(node.store, "nodes", NODE, no_healthy_gpu_registered)  # the scheduler's view
        hamicore.install_stand_in(tmp_path, hook_path="/usr/local")
        await wait_for(node.store, "nodes", NODE, gpu_allocatable(4))
        gpu_pod(node.store, "seen", f"{GPU_A},NVIDIA,3000,50:;", {"main": 1})
        lock_node(node.store, "seen")
        pod = await wait_for(node.store, "pods", "seen", settled, namespace="default")
        assert pod["status"]["phase"] == "Running", pod["status"]
        assert (_hami_core(tmp_path) / "libvgpu.so").is_file()


async def test_a_node_without_hami_core_advertises_its_gpus_unhealthy_until_installed(
    tmp_path: pathlib.Path,
) -> None:
    async with emulated_node(tmp_path, install=False, want=0) as node:
        status = node.store.get("nodes", NODE)["status"]
        assert status["capacity"]["nvidia.com/gpu"] == "4"  # known, not usable
        (_hami_core(tmp_path)).mkdir(parents=True)
        (_hami_core(tmp_path) / "libvgpu.so").mkdir()  # what containerd left behind on main
        hamicore.install_stand_in(tmp_path, hook_path="/usr/local")  # repairs it
        await wait_for(node.store, "nodes", NODE, gpu_allocatable(4))


async def test_the_emulated_runtime_makes_a_missing_mount_source_a_directory(tmp_path: pathlib.Path) -> None:
    """What containerd does (and why the plugin must check first)."""
    created = kubeletruntime.start_container(
        tmp_path,
        [
            {"hostPath": "/usr/local/vgpu/ld.so.preload", "containerPath": "/etc/ld.so.preload"},
            {"hostPath": "../escape", "containerPath": "/x"},
            {"hostPath": "/a/../../escape", "containerPath": "/y"},
        ],
    )
    assert created == ["/usr/local/vgpu/ld.so.preload"]
    assert (tmp_path / "usr/local/vgpu/ld.so.preload").is_dir()
    assert not (tmp_path.parent / "escape").exists()


async def test_kubelet_restarted_before_its_checkpoint_gets_the_same_answers(node: Node) -> None:
    """Issue 48 item 6: kubelet restarts, the plugin re-registers, and kubelet (its checkpoint
    lost) calls Allocate again for every container of an admitted two-container pod."""
    gpu_pod(
        node.store,
        "again",
        f"{GPU_A},NVIDIA,3000,50:;{GPU_A},NVIDIA,1000,20:{GPU_B},NVIDIA,1000,20:;",
        {"train": 1, "eval": 2},
    )
    lock_node(node.store, "again")
    pod = await wait_for(node.store, "pods", "again", settled, namespace="default")
    assert pod["status"]["phase"] == "Running", pod["status"]
    await node.kubelet.restart()
    await asyncio.wait_for(node.manager.wait_registered(2), 10)  # again, within the session
    await wait_for(node.store, "nodes", NODE, gpu_allocatable(4))
    again = await node.kubelet.allocate_again(pod)
    assert again == allocations(pod)
