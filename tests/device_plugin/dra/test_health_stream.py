"""``v1alpha1.DRAResourceHealth/NodeWatchResources`` on the DRA plugin's socket, through real
unix-socket gRPC as kubelet 1.36 calls it: every GPU of the slice at once, then each change the
device plugin's health watcher sees (an XID from the fake backend, the recovery), refreshes within
kubelet's timeout, many streams at once, cancelled and garbage calls, and a clean stop."""

from __future__ import annotations

import asyncio
import collections
import pathlib
import shutil
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
import yaml
from vgpu.core.device import GpuUuid
from vgpu.core.dra import health, names
from vgpu.gpu.fake import FakeGpuBackend
from vgpu.kubeletapi.drahealth.v1alpha1 import api_pb2 as pb
from vgpu.kubeletapi.drahealth.v1alpha1 import api_pb2_grpc as pb_grpc
from vgpu_device_plugin import config, dirwatch, inventory, main
from vgpu_device_plugin.dra import healthwatch, prepare, service, slicepub
from vgpu_device_plugin.health import HealthMonitor, HealthTracker

from tests.device_plugin.builders import GPU_A, GPU_B, NODE, cluster, fake_backend, installed_host, short_tmp
from tests.device_plugin.builders import config as plugin_config
from tests.device_plugin.dra import claims as c
from tests.device_plugin.dra.fakedrakubelet import FakeDraKubelet
from tests.device_plugin.dra.test_service_wiring import ClaimsApi

METHOD = "/v1alpha1.DRAResourceHealth/NodeWatchResources"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class NoClaims:
    """The DRAPlugin handler; these tests only watch health."""

    async def prepare(self, claims: Sequence[Any]) -> dict[str, prepare.Prepared]:
        return {}

    async def unprepare(self, claims: Sequence[Any]) -> dict[str, str]:
        return {}


@dataclass
class Plugin:
    root: pathlib.Path
    backend: FakeGpuBackend
    clock: Clock
    server: service.DraServer
    channel: grpc.aio.Channel

    @property
    def service(self) -> healthwatch.HealthService:
        assert self.server.health_service is not None
        return self.server.health_service

    def watch(self) -> Any:
        return pb_grpc.DRAResourceHealthStub(self.channel).NodeWatchResources(pb.NodeWatchResourcesRequest())  # type: ignore[no-untyped-call]


async def serve(root: pathlib.Path, *, refresh_s: float = 3600.0) -> tuple[Plugin, asyncio.Task[None]]:
    backend = fake_backend()
    backend.open()
    cfg = plugin_config()
    inv = inventory.build(backend.devices(), cfg)
    clock = Clock()
    tracker = HealthTracker(
        [g.uuid for g in inv.gpus],
        clock=clock,
        recovery_s=60.0,
        ignored_xids=(),
    )
    monitor = HealthMonitor(backend, tracker, probe_interval_s=0.02)
    source = healthwatch.MonitorHealth(slicepub.MonitorSource(NODE, inv, cfg, monitor))
    server = service.DraServer(
        NoClaims(), root / names.DRA_SOCKET, health=source, health_service={"refresh_s": refresh_s}
    )
    await server.start()
    channel = grpc.aio.insecure_channel(f"unix://{server.socket_path}")
    return Plugin(root, backend, clock, server, channel), asyncio.create_task(monitor.run())


@pytest.fixture
async def plugin() -> AsyncIterator[Plugin]:
    root = short_tmp()
    p, running = await serve(root)
    try:
        yield p
    finally:
        await p.channel.close(None)
        await p.server.stop(grace_s=0)
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        p.backend.close()
        shutil.rmtree(root, ignore_errors=True)


def states(message: pb.NodeWatchResourcesResponse) -> list[tuple[str, str, str, str]]:
    return [
        (d.device.pool_name, d.device.device_name, pb.HealthStatus.Name(d.health), d.message)
        for d in message.devices
    ]


async def read(call: Any) -> pb.NodeWatchResourcesResponse:
    message = await asyncio.wait_for(call.read(), 5)
    assert message is not grpc.aio.EOF
    return message  # type: ignore[no-any-return]


HEALTHY = [(NODE, "gpu-0", "HEALTHY", ""), (NODE, "gpu-1", "HEALTHY", "")]


async def test_a_stream_gets_every_gpu_then_an_xid_and_the_recovery(plugin: Plugin) -> None:
    call = plugin.watch()
    first = await read(call)
    assert states(first) == HEALTHY
    now = int(time.time())
    for d in first.devices:
        assert d.health_check_timeout_seconds == health.TIMEOUT_S
        assert now - 5 <= d.last_updated_time <= now + 1
    plugin.backend.inject_xid(GPU_A, 79)
    assert states(await read(call)) == [(NODE, "gpu-0", "UNHEALTHY", "XID 79 critical error")]
    plugin.clock.now += 61  # quiet for longer than recovery_s: the next passing probe heals it
    assert states(await read(call)) == [(NODE, "gpu-0", "HEALTHY", "")]
    plugin.backend.inject_lost(GPU_B, "GPU has fallen off the bus")
    assert states(await read(call)) == [(NODE, "gpu-1", "UNHEALTHY", "lost: GPU has fallen off the bus")]
    call.cancel()


async def test_a_node_condition_is_the_message_of_every_gpu_it_holds(plugin: Plugin) -> None:
    call = plugin.watch()
    assert states(await read(call)) == HEALTHY
    plugin.backend.inject_xid(GPU_A, 48)
    assert states(await read(call))[0][2] == "UNHEALTHY"
    # the same watcher the slice publisher taints from: HAMi-core's files gone holds both GPUs
    source = plugin.server._feed.source  # type: ignore[union-attr]
    assert isinstance(source, healthwatch.MonitorHealth)
    await source.source.monitor.set_condition(
        "hami-core", "HAMi-core missing", uuids=[GpuUuid(GPU_A), GpuUuid(GPU_B)]
    )
    assert states(await read(call)) == [
        (NODE, "gpu-0", "UNHEALTHY", "XID 48 critical error; HAMi-core missing"),
        (NODE, "gpu-1", "UNHEALTHY", "HAMi-core missing"),
    ]
    call.cancel()


async def test_the_whole_list_is_sent_again_within_kubelets_timeout() -> None:
    root = short_tmp()
    p, running = await serve(root, refresh_s=0.05)
    try:
        call = p.watch()
        for _ in range(3):  # nothing changes, yet every device keeps coming
            assert states(await read(call)) == HEALTHY
        call.cancel()
    finally:
        await p.channel.close(None)
        await p.server.stop(grace_s=0)
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        shutil.rmtree(root, ignore_errors=True)


async def test_many_streams_each_see_the_change_and_cancelling_them_leaves_nothing(plugin: Plugin) -> None:
    warm = plugin.watch()  # the channel's own tasks start with its first call
    await read(warm)
    warm.cancel()
    await wait_for(lambda: plugin.service.open_streams == 0)
    before = running()
    calls = [plugin.watch() for _ in range(25)]
    for call in calls:
        assert states(await read(call)) == HEALTHY
    assert plugin.service.open_streams == 25
    assert running() != before  # the streams' handlers are tasks of their own
    plugin.backend.inject_xid(GPU_B, 79)
    for call in calls:
        assert states(await read(call)) == [(NODE, "gpu-1", "UNHEALTHY", "XID 79 critical error")]
    for call in calls:
        call.cancel()
    await wait_for(lambda: plugin.service.open_streams == 0)
    await wait_for(lambda: running() == before)
    # the server still answers a new stream
    call = plugin.watch()
    assert states(await read(call))[1][2] == "UNHEALTHY"
    call.cancel()


async def test_garbage_and_vanishing_clients_do_not_hurt_the_others(plugin: Plugin) -> None:
    good = plugin.watch()
    assert states(await read(good)) == HEALTHY
    garbage = plugin.channel.unary_stream(METHOD, request_serializer=None, response_deserializer=None)
    bad = garbage(b"\xff\xff\xff")  # not a NodeWatchResourcesRequest
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await asyncio.wait_for(bad.read(), 5)
    assert refused.value.code() == grpc.StatusCode.UNKNOWN  # grpc refuses it before our handler
    assert "NodeWatchResourcesRequest" in (refused.value.details() or "")
    # a client that goes away before reading anything, and one whose connection closes
    plugin.watch().cancel()
    other = grpc.aio.insecure_channel(f"unix://{plugin.server.socket_path}")
    dropped = pb_grpc.DRAResourceHealthStub(other).NodeWatchResources(pb.NodeWatchResourcesRequest())  # type: ignore[no-untyped-call]
    assert states(await read(dropped)) == HEALTHY
    await other.close(None)
    await wait_for(lambda: plugin.service.open_streams == 1)
    plugin.backend.inject_xid(GPU_A, 79)
    assert states(await read(good))[0][2] == "UNHEALTHY"
    good.cancel()


async def test_stopping_the_server_ends_every_stream_with_ok_at_once(plugin: Plugin) -> None:
    calls = [plugin.watch() for _ in range(3)]
    for call in calls:
        await read(call)
    await asyncio.wait_for(plugin.server.stop(grace_s=30), 5)  # no grace period waited out
    for call in calls:
        assert await asyncio.wait_for(call.read(), 5) is grpc.aio.EOF
        assert await call.code() == grpc.StatusCode.OK
    assert not plugin.server.socket_path.exists()


async def test_the_dra_mode_serves_health_on_its_plugin_socket() -> None:
    """The composition root (``main.run_dra``): kubelet, having registered the plugin, opens
    NodeWatchResources on the same endpoint and gets the node's GPUs (before: UNIMPLEMENTED)."""
    root = short_tmp()
    installed_host(root)
    gpus = root / "gpus.yaml"
    gpus.write_text(
        yaml.safe_dump({"gpus": [{"uuid": "GPU-main-1", "name": "NVIDIA L4", "memoryMib": 23034}]})
    )
    argv = ["--node-name", NODE, "--mode", "dra", "--backend", "fake", "--fake-gpus", str(gpus)]
    argv += ["--host-root", str(root), "--plugins-registry", str(root / "registry")]
    argv += ["--dra-plugin-path", str(root / "plugin")]
    settings = config.resolve(argv, {})
    store, _ = cluster()
    stop = asyncio.Event()

    async def no_slices(*args: Any, **kw: Any) -> None:
        await asyncio.Event().wait()

    task = asyncio.create_task(
        main.run_dra(
            settings,
            api=ClaimsApi(store, c.FakeClaims()),
            backend=main.build_backend(settings),
            publish=no_slices,
            watcher=dirwatch.NoWatcher(),
            stop=stop,
        )
    )
    kubelet = FakeDraKubelet()
    try:
        assert await kubelet.register(root / "registry" / names.REGISTRATION_SOCKET, wait_s=5.0)
        assert kubelet.info is not None
        async with grpc.aio.insecure_channel(f"unix:{kubelet.info.endpoint}") as channel:
            call = pb_grpc.DRAResourceHealthStub(channel).NodeWatchResources(pb.NodeWatchResourcesRequest())  # type: ignore[no-untyped-call]
            assert states(await read(call)) == [(NODE, "gpu-0", "HEALTHY", "")]
            stop.set()
            assert await asyncio.wait_for(call.read(), 5) is grpc.aio.EOF
        assert await asyncio.wait_for(task, 10) == 0
    finally:
        await kubelet.close()
        stop.set()
        await asyncio.gather(task, return_exceptions=True)
        shutil.rmtree(root, ignore_errors=True)


def running() -> collections.Counter[str]:
    """The event loop's tasks by coroutine, less grpc's pool of tasks waiting for the next call
    (it replaces them as calls come)."""
    names_ = (getattr(t.get_coro(), "__qualname__", repr(t.get_coro())) for t in asyncio.all_tasks())
    return collections.Counter(n for n in names_ if n not in WAITING)


WAITING = {"AioServer._request_registered_call", "AioServer._request_call"}


async def wait_for(condition: Any, timeout_s: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


async def test_a_server_started_again_after_a_stop_serves_streams(plugin: Plugin) -> None:
    await plugin.server.stop(grace_s=0)
    await plugin.server.start()
    channel = grpc.aio.insecure_channel(f"unix://{plugin.server.socket_path}")
    try:
        call = pb_grpc.DRAResourceHealthStub(channel).NodeWatchResources(pb.NodeWatchResourcesRequest())  # type: ignore[no-untyped-call]
        assert states(await read(call)) == HEALTHY
        plugin.backend.inject_xid(GPU_A, 79)  # the new pump follows the monitor
        assert states(await read(call))[0][2] == "UNHEALTHY"
        call.cancel()
    finally:
        await channel.close(None)
