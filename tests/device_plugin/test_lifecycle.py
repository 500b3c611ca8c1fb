"""The plugin over real unix sockets and real gRPC: registration, ListAndWatch on XID and recovery,
Allocate, kubelet restart, clean stop (socket gone, GPUs unhealthy in the annotation, Lease released)."""

import asyncio
import contextlib
import os
import pathlib
import shutil
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import grpc
import pytest
from vgpu.core import annotations
from vgpu.core.config import DevicePluginConfig
from vgpu.gpu import fake, nvml
from vgpu.gpu.port import GpuBackend
from vgpu.kube.port import JsonObj
from vgpu.kubeletapi.v1beta1 import api_pb2
from vgpu.localcluster.client import LocalKubeApi
from vgpu.localcluster.store import Store
from vgpu_device_plugin.hostfs import HostFs
from vgpu_device_plugin.manager import Deps, PluginManager

from tests.device_plugin.builders import (
    GPU_A,
    GPU_B,
    KEYS,
    NODE,
    StoreView,
    add_pod,
    cluster,
    config,
    fake_backend,
    lock_node,
    node_reporter,
    notes_of,
    short_tmp,
)
from tests.device_plugin.fakekubelet import FakeKubelet
from tests.gpu.fake_pynvml import FakeGpu, make_module


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class NodeFeed:
    """The node watch's feed, driven by the test: ``deliver`` tells each listener of the node."""

    def __init__(self) -> None:
        self.listeners: list[Callable[[JsonObj], Awaitable[None]]] = []

    def subscribe_node(self, listener: Callable[[JsonObj], Awaitable[None]]) -> Callable[[], None]:
        self.listeners.append(listener)
        return lambda: self.listeners.remove(listener)

    async def deliver(self, node: JsonObj) -> None:
        for listener in list(self.listeners):
            await listener(node)


@dataclass
class Rig:
    store: Store
    backend: fake.FakeGpuBackend
    kubelet: FakeKubelet
    manager: PluginManager
    task: asyncio.Task[None]
    clock: Clock
    plugin_dir: pathlib.Path
    feed: NodeFeed


def _deps(
    store: Store,
    api: LocalKubeApi,
    plugin_dir: pathlib.Path,
    tmp_path: pathlib.Path,
    cfg: DevicePluginConfig,
    *,
    backend: GpuBackend,
    clock: Callable[[], float] = time.monotonic,
    node_feed: NodeFeed | None = None,
) -> Deps:
    """A plugin on node ``NODE`` over ``store``, serving in ``plugin_dir``, its host files under
    ``tmp_path``."""
    return Deps(
        backend=backend,
        api=api,
        view=StoreView(store),
        reporter=node_reporter(api),
        config=cfg,
        node=NODE,
        plugin_dir=plugin_dir,
        host=HostFs(tmp_path, hook_path=cfg.hook_path),
        clock=clock,
        node_feed=node_feed,
    )


@pytest.fixture
async def rig(tmp_path: pathlib.Path) -> AsyncIterator[Rig]:
    plugin_dir = short_tmp()
    store, api = cluster()
    backend = fake_backend()
    kubelet = FakeKubelet(plugin_dir)
    await kubelet.start()
    clock = Clock()
    feed = NodeFeed()
    cfg = config(
        device_split_count=2, kubelet_poll_s=0.02, health_probe_interval_s=0.02, health_recovery_s=30
    )
    deps = _deps(store, api, plugin_dir, tmp_path, cfg, backend=backend, clock=clock, node_feed=feed)
    manager = PluginManager(deps)
    task = asyncio.create_task(manager.run())
    try:
        await kubelet.wait_registrations(1)
        yield Rig(store, backend, kubelet, manager, task, clock, plugin_dir, feed)
    finally:
        manager.request_stop()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, 10)
        await kubelet.stop()
        backend.close()
        shutil.rmtree(plugin_dir, ignore_errors=True)


async def wait_register_health(store: Store, want: list[bool], timeout_s: float = 10.0) -> None:
    """Wait (on the store's watch) until the register annotation shows ``want`` health flags."""
    watcher = store.watch("nodes", field_selector=f"metadata.name={NODE}")
    try:
        while True:
            event = await watcher.next_event(timeout_s=timeout_s)
            assert event is not None, f"register annotation never showed health {want}"
            raw = (event.object["metadata"].get("annotations") or {}).get(KEYS.node_register)
            if raw and [g.health for g in annotations.decode_node_register(raw)] == want:
                return
    finally:
        watcher.close()


ALL = [(f"{g}-{i}", "Healthy") for g in (GPU_A, GPU_B) for i in range(2)]


async def test_registers_with_kubelet_and_lists_every_virtual_device(rig: Rig) -> None:
    (req,) = rig.kubelet.registrations
    assert (req.version, req.endpoint, req.resource_name) == ("v1beta1", "nvidia-gpu.sock", "nvidia.com/gpu")
    assert req.options.get_preferred_allocation_available
    assert rig.kubelet.options == [req.options]  # GetDevicePluginOptions answers the same
    assert await rig.kubelet.next_list() == ALL
    assert (rig.plugin_dir / "nvidia-gpu.sock").exists()


async def test_xid_marks_all_virtual_devices_unhealthy_then_recovers(rig: Rig) -> None:
    assert await rig.kubelet.next_list() == ALL
    rig.backend.inject_xid(GPU_B, 79)
    assert await rig.kubelet.next_list() == [
        (f"{GPU_A}-0", "Healthy"),
        (f"{GPU_A}-1", "Healthy"),
        (f"{GPU_B}-0", "Unhealthy"),
        (f"{GPU_B}-1", "Unhealthy"),
    ]
    await wait_register_health(rig.store, [True, False])
    rig.clock.now += 31  # the quiet period passes; the next passing probe heals the GPU
    assert await rig.kubelet.next_list() == ALL
    await wait_register_health(rig.store, [True, True])


async def test_application_xid_changes_nothing(rig: Rig) -> None:
    assert await rig.kubelet.next_list() == ALL
    rig.backend.inject_xid(GPU_A, 13)
    rig.backend.inject_xid(GPU_A, 48)  # the critical one after it proves the first was seen and ignored
    lst = await rig.kubelet.next_list()
    assert [h for _, h in lst] == ["Unhealthy", "Unhealthy", "Healthy", "Healthy"]


async def test_allocate_over_grpc(rig: Rig) -> None:
    add_pod(rig.store, "p1", to_allocate=f"{GPU_A},NVIDIA,3000,50:{GPU_B},NVIDIA,3000,50:;")
    lock_node(rig.store, "p1")
    channel, stub = await rig.kubelet.call("nvidia-gpu.sock")
    async with channel:
        preferred = await stub.GetPreferredAllocation(
            api_pb2.PreferredAllocationRequest(
                container_requests=[
                    api_pb2.ContainerPreferredAllocationRequest(
                        available_deviceIDs=[d for d, _ in ALL], allocation_size=2
                    )
                ]
            )
        )
        ids = list(preferred.container_responses[0].deviceIDs)
        assert ids == [f"{GPU_A}-0", f"{GPU_B}-0"]
        resp = await stub.Allocate(
            api_pb2.AllocateRequest(container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=ids)])
        )
        (c,) = resp.container_responses
        assert c.envs["NVIDIA_VISIBLE_DEVICES"] == f"{GPU_A},{GPU_B}"
        assert c.envs["CUDA_DEVICE_MEMORY_LIMIT_1"] == "3000m"
        assert {m.container_path for m in c.mounts} >= {"/usr/local/vgpu/libvgpu.so", "/etc/ld.so.preload"}
        assert notes_of(rig.store, "pods", "p1", "default")[KEYS.bind_phase] == "success"
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Allocate(
                api_pb2.AllocateRequest(
                    container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=[f"{GPU_A}-1"])]
                )
            )
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert f"no binding pod found on node {NODE}" in (info.value.details() or "")
        pre = await stub.PreStartContainer(api_pb2.PreStartContainerRequest(devices_ids=ids))
        assert pre == api_pb2.PreStartContainerResponse()


async def test_garbage_annotation_over_grpc_fails_the_pod(rig: Rig) -> None:
    add_pod(rig.store, "junk", to_allocate=f"{GPU_A},NVIDIA,x,y:;")
    lock_node(rig.store, "junk")
    channel, stub = await rig.kubelet.call("nvidia-gpu.sock")
    async with channel:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Allocate(
                api_pb2.AllocateRequest(
                    container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=[f"{GPU_A}-0"])]
                )
            )
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "pod default/junk" in (info.value.details() or "")
    assert notes_of(rig.store, "pods", "junk", "default")[KEYS.bind_phase] == "failed"
    assert KEYS.node_lock not in notes_of(rig.store, "nodes", NODE)


@pytest.mark.parametrize(
    "request_",
    [
        api_pb2.AllocateRequest(),
        api_pb2.AllocateRequest(container_requests=[api_pb2.ContainerAllocateRequest()]),
    ],
    ids=["no-container", "no-ids"],
)
async def test_an_allocate_without_containers_or_ids_is_refused_over_grpc_and_changes_nothing(
    rig: Rig, request_: api_pb2.AllocateRequest
) -> None:
    add_pod(rig.store, "p1", to_allocate=f"{GPU_A},NVIDIA,3000,50:;")
    lock_node(rig.store, "p1")
    before = rig.store.get("pods", "p1", namespace="default")
    lock = notes_of(rig.store, "nodes", NODE)[KEYS.node_lock]
    channel, stub = await rig.kubelet.call("nvidia-gpu.sock")
    async with channel:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Allocate(request_)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "must name one or more devices" in (info.value.details() or "")
    assert rig.store.get("pods", "p1", namespace="default") == before
    assert notes_of(rig.store, "nodes", NODE)[KEYS.node_lock] == lock


async def test_a_session_feeds_the_node_watch_to_allocate_for_late_locks(rig: Rig) -> None:
    """The lock the node watch had not shown at Allocate goes when the watch delivers it."""
    assert len(rig.feed.listeners) == 1  # the shared resource's Allocate handler
    add_pod(rig.store, "p1", to_allocate=f"{GPU_A},NVIDIA,3000,50:;")
    channel, stub = await rig.kubelet.call("nvidia-gpu.sock")
    async with channel:
        await stub.Allocate(
            api_pb2.AllocateRequest(
                container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=[f"{GPU_A}-0"])]
            )
        )
    lock_node(rig.store, "p1")  # written before the Binding; the watch shows it only now
    await rig.feed.deliver(rig.store.get("nodes", NODE))
    assert KEYS.node_lock not in notes_of(rig.store, "nodes", NODE)
    rig.manager.request_restart("SIGHUP")
    await rig.manager.wait_started(2)
    assert len(rig.feed.listeners) == 1  # the old session's handler unsubscribed
    rig.manager.request_stop()
    await asyncio.wait_for(rig.task, 10)
    assert rig.feed.listeners == []


async def test_kubelet_restart_re_registers(rig: Rig) -> None:
    assert await rig.kubelet.next_list() == ALL
    await rig.kubelet.restart()
    await rig.kubelet.wait_registrations(2, timeout_s=5)
    assert (rig.plugin_dir / "nvidia-gpu.sock").exists()
    assert await rig.kubelet.next_list() == ALL


async def test_sighup_style_restart_re_serves(rig: Rig) -> None:
    rig.manager.request_restart("SIGHUP")
    await rig.kubelet.wait_registrations(2, timeout_s=5)
    await rig.manager.wait_started(2)


async def test_stop_removes_socket_marks_gpus_unhealthy_and_releases_lease(rig: Rig) -> None:
    assert await rig.kubelet.next_list() == ALL

    def lease_names() -> list[str]:
        return [x["metadata"]["name"] for x in rig.store.list("leases", namespace="kube-system").items]

    assert lease_names() == [f"vgpu-device-plugin-{NODE}"]
    rig.manager.request_stop()
    await asyncio.wait_for(rig.task, 10)
    assert not (rig.plugin_dir / "nvidia-gpu.sock").exists()
    await asyncio.wait_for(rig.kubelet.stream_ended.wait(), 5)  # ListAndWatch ended with the plugin
    raw = notes_of(rig.store, "nodes", NODE)[KEYS.node_register]
    assert [g.health for g in annotations.decode_node_register(raw)] == [False, False]
    assert lease_names() == []


async def test_start_failure_is_retried_until_the_driver_answers(tmp_path: pathlib.Path) -> None:
    plugin_dir = short_tmp()
    store, api = cluster()
    backend = fake_backend()
    backend.fail_devices("driver not loaded")
    kubelet = FakeKubelet(plugin_dir)
    await kubelet.start()
    cfg = config(kubelet_poll_s=0.02, start_retry_s=3600)
    clock = Clock()
    deps = _deps(store, api, plugin_dir, tmp_path, cfg, backend=backend, clock=clock)
    manager = PluginManager(deps)
    task = asyncio.create_task(manager.run())
    try:
        await asyncio.wait_for(manager.wait_failures(1), 10)
        assert kubelet.registrations == [] and not (plugin_dir / "nvidia-gpu.sock").exists()
        backend.fail_devices("")
        clock.now += 3600  # the retry period passes
        await kubelet.wait_registrations(1)
        await asyncio.wait_for(manager.wait_started(1), 10)
    finally:
        manager.request_stop()
        await asyncio.wait_for(task, 10)
        await kubelet.stop()
        shutil.rmtree(plugin_dir, ignore_errors=True)


async def test_mixed_mig_strategy_serves_one_socket_per_resource(tmp_path: pathlib.Path) -> None:
    plugin_dir = short_tmp()
    store, api = cluster()
    backend = fake.FakeGpuBackend.from_yaml(
        {
            "gpus": [
                {"uuid": "GPU-plain", "name": "NVIDIA A100", "memoryMib": 40960},
                {
                    "uuid": "GPU-mig",
                    "name": "NVIDIA A100",
                    "memoryMib": 40960,
                    "migEnabled": True,
                    "migInstances": [{"uuid": "MIG-1", "profile": "1g.5gb", "memoryMib": 4864, "start": 0}],
                },
            ]
        }
    )
    kubelet = FakeKubelet(plugin_dir)
    await kubelet.start()
    cfg = config(mig_strategy="mixed", device_split_count=2, kubelet_poll_s=0.02)
    deps = _deps(store, api, plugin_dir, tmp_path, cfg, backend=backend)
    manager = PluginManager(deps)
    task = asyncio.create_task(manager.run())
    try:
        await kubelet.wait_registrations(2)
        by_resource = {r.resource_name: r for r in kubelet.registrations}
        assert sorted(by_resource) == ["nvidia.com/gpu", "nvidia.com/mig-1g.5gb"]
        assert by_resource["nvidia.com/mig-1g.5gb"].endpoint == "nvidia-mig-1g.5gb.sock"
        assert not by_resource["nvidia.com/mig-1g.5gb"].options.get_preferred_allocation_available
        channel, stub = await kubelet.call("nvidia-mig-1g.5gb.sock")
        async with channel:
            resp = await stub.Allocate(
                api_pb2.AllocateRequest(
                    container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=["MIG-1"])]
                )
            )
        assert dict(resp.container_responses[0].envs) == {"NVIDIA_VISIBLE_DEVICES": "MIG-1"}
        manager.request_stop()
        await asyncio.wait_for(task, 10)
        assert sorted(p.name for p in plugin_dir.glob("*.sock")) == ["kubelet.sock"]  # ours removed
    finally:
        manager.request_stop()
        await asyncio.wait_for(task, 10)
        await kubelet.stop()
        shutil.rmtree(plugin_dir, ignore_errors=True)


async def test_restart_does_not_heal_an_unhealthy_gpu(rig: Rig) -> None:
    assert await rig.kubelet.next_list() == ALL
    rig.backend.inject_xid(GPU_A, 79)
    unhealthy = await rig.kubelet.next_list()
    rig.manager.request_restart("SIGHUP")
    await rig.kubelet.wait_registrations(2, timeout_s=5)
    assert unhealthy != ALL
    assert await rig.kubelet.next_list() == unhealthy  # the new session's first list


async def test_a_gpu_gone_at_a_restart_stays_listed_unhealthy_and_heals_when_back(rig: Rig) -> None:
    """The driver stops listing a GPU, then kubelet restarts: the new session still serves it as
    Unhealthy (kubelet and the register annotation), and its probes heal it when it is back."""
    assert await rig.kubelet.next_list() == ALL
    rig.backend.vanish(GPU_B)
    gone = [(d, "Healthy" if d.startswith(GPU_A) else "Unhealthy") for d, _ in ALL]
    assert await rig.kubelet.next_list() == gone
    await rig.kubelet.restart()
    await rig.kubelet.wait_registrations(2, timeout_s=5)
    assert await rig.kubelet.next_list() == gone  # the new session's first list
    await wait_register_health(rig.store, [True, False])
    rig.backend.restore(GPU_B)
    rig.clock.now += 31  # the quiet period passes; the next passing probe heals it
    assert await rig.kubelet.next_list() == ALL
    await wait_register_health(rig.store, [True, True])


async def test_a_gpu_off_the_bus_does_not_keep_the_others_from_a_restarted_kubelet(
    tmp_path: pathlib.Path,
) -> None:
    """NVML fails every call on a lost GPU's handle. A kubelet restart must still bring the node
    back: the healthy GPU registered, the lost one listed Unhealthy until it answers again."""
    plugin_dir = short_tmp()
    store, api = cluster()
    good, bad = FakeGpu(GPU_A, minor=0), FakeGpu(GPU_B, minor=1, bus_id=b"00000000:3C:00.0")
    backend = nvml.NvmlBackend(make_module([good, bad]), sysfs_root=tmp_path)
    backend.open()
    kubelet = FakeKubelet(plugin_dir)
    await kubelet.start()
    clock = Clock()
    cfg = config(
        device_split_count=1,
        kubelet_poll_s=0.02,
        health_probe_interval_s=0.02,
        health_recovery_s=30,
        start_retry_s=3600,
        outside_usage_enabled=False,
    )
    deps = _deps(store, api, plugin_dir, tmp_path, cfg, backend=backend, clock=clock)
    manager = PluginManager(deps)
    task = asyncio.create_task(manager.run())
    try:
        await kubelet.wait_registrations(1)
        assert await kubelet.next_list() == [(f"{GPU_A}-0", "Healthy"), (f"{GPU_B}-0", "Healthy")]
        bad.broken = True  # off the bus
        lost = [(f"{GPU_A}-0", "Healthy"), (f"{GPU_B}-0", "Unhealthy")]
        assert await kubelet.next_list() == lost
        await kubelet.restart()
        await kubelet.wait_registrations(2, timeout_s=5)
        assert manager.start_failures == 0
        assert await kubelet.next_list() == lost
        await wait_register_health(store, [True, False])
        bad.broken = False
        clock.now += 31
        assert await kubelet.next_list() == [(f"{GPU_A}-0", "Healthy"), (f"{GPU_B}-0", "Healthy")]
    finally:
        manager.request_stop()
        await asyncio.wait_for(task, 10)
        await kubelet.stop()
        backend.close()
        shutil.rmtree(plugin_dir, ignore_errors=True)


def _waiting_for_kubelet(plugin_dir: pathlib.Path, tmp_path: pathlib.Path) -> Deps:
    """A plugin whose start retry (an hour) never comes on its own, on a frozen clock: only
    kubelet.sock appearing can end its wait."""
    store, api = cluster()
    cfg = config(kubelet_poll_s=0.02, start_retry_s=3600)
    return _deps(store, api, plugin_dir, tmp_path, cfg, backend=fake_backend(), clock=Clock())


async def test_kubelet_coming_up_later_is_noticed_without_waiting_for_the_retry(
    tmp_path: pathlib.Path,
) -> None:
    plugin_dir = short_tmp()
    deps = _waiting_for_kubelet(plugin_dir, tmp_path)
    manager = PluginManager(deps)
    task = asyncio.create_task(manager.run())
    kubelet = FakeKubelet(plugin_dir)
    try:
        await asyncio.wait_for(manager.wait_failures(1), 10)  # no kubelet.sock: Register failed
        await kubelet.start()
        await kubelet.wait_registrations(1, timeout_s=5)
    finally:
        manager.request_stop()
        await asyncio.wait_for(task, 10)
        await kubelet.stop()
        shutil.rmtree(plugin_dir, ignore_errors=True)


async def test_a_plugin_dir_kubelet_has_not_made_yet_is_a_start_failure_that_is_retried(
    tmp_path: pathlib.Path,
) -> None:
    """On a fresh node the plugin may start before kubelet makes its device-plugins directory:
    grpc cannot bind the socket (a bare RuntimeError from grpc), which is a start failure, retried
    (here when kubelet.sock appears), never the end of the plugin."""
    base = short_tmp()
    plugin_dir = base / "device-plugins"
    deps = _waiting_for_kubelet(plugin_dir, tmp_path)
    manager = PluginManager(deps)
    task = asyncio.create_task(manager.run())
    failed = asyncio.create_task(manager.wait_failures(1))
    kubelet = FakeKubelet(plugin_dir)
    try:
        await asyncio.wait({task, failed}, timeout=10, return_when=asyncio.FIRST_COMPLETED)
        assert not task.done(), f"the plugin ended: {task.exception() if not task.cancelled() else None!r}"
        assert failed.done() and manager.sessions_started == 0
        plugin_dir.mkdir()
        await kubelet.start()
        await kubelet.wait_registrations(1, timeout_s=5)
        assert (plugin_dir / "nvidia-gpu.sock").exists()
    finally:
        failed.cancel()
        manager.request_stop()
        await asyncio.gather(failed, return_exceptions=True)
        await asyncio.wait_for(asyncio.gather(task, return_exceptions=True), 10)
        await kubelet.stop()
        shutil.rmtree(base, ignore_errors=True)


async def test_a_session_removes_hami_core_directories_of_pods_gone_from_the_node(
    tmp_path: pathlib.Path,
) -> None:
    """Allocate makes <hook>/vgpu/containers/<uid>_<container>; once the pod is gone from the node
    the plugin's lease loop removes it (issue 47: nothing else would)."""
    plugin_dir = short_tmp()
    store, api = cluster()
    add_pod(store, "live", to_allocate=None, phase="success")
    live_uid = store.get("pods", "live", namespace="default")["metadata"]["uid"]
    host = HostFs(tmp_path, hook_path="/usr/local")
    containers = tmp_path / "usr/local/vgpu/containers"
    for uid in ("uid-of-a-deleted-pod", live_uid):
        host.container_dir(uid, "main")
        os.utime(containers / f"{uid}_main", (1.0, 1.0))  # long ago: past the grace
    kubelet = FakeKubelet(plugin_dir)
    await kubelet.start()
    deps = _deps(store, api, plugin_dir, tmp_path, config(kubelet_poll_s=0.02), backend=fake_backend())
    manager = PluginManager(deps)
    task = asyncio.create_task(manager.run())
    try:
        await kubelet.wait_registrations(1)
        deadline = time.monotonic() + 10
        while (containers / "uid-of-a-deleted-pod_main").exists():
            assert time.monotonic() < deadline, "the departed pod's directory was never removed"
            await asyncio.sleep(0.02)
        assert (containers / f"{live_uid}_main").is_dir()
    finally:
        manager.request_stop()
        await asyncio.wait_for(task, 10)
        await kubelet.stop()
        shutil.rmtree(plugin_dir, ignore_errors=True)
