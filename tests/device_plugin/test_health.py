"""Health: XID handling, ignored XIDs, lost GPUs, and recovery after a quiet period (fake clock)."""

from __future__ import annotations

import asyncio

import pytest
from vgpu.core.device import GpuUuid
from vgpu.gpu import nvml
from vgpu.gpu.port import APPLICATION_XIDS, EventKind, GpuEvent
from vgpu_device_plugin.health import HealthMonitor, HealthTracker

from tests.device_plugin.builders import GPU_A, GPU_B, fake_backend
from tests.gpu.fake_pynvml import FakeGpu, NVMLError, make_module

A, B = GpuUuid(GPU_A), GpuUuid(GPU_B)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def tracker(clock: Clock, **kw) -> HealthTracker:
    args = {"recovery_s": 60.0, "ignored_xids": APPLICATION_XIDS, **kw}
    return HealthTracker([A, B], clock=clock, **args)


def xid(uuid: str | None, code: int) -> GpuEvent:
    return GpuEvent(EventKind.XID, GpuUuid(uuid) if uuid else None, xid=code)


@pytest.mark.parametrize("code", sorted(APPLICATION_XIDS))
def test_application_xids_are_ignored(code: int) -> None:
    t = tracker(Clock())
    assert t.on_event(xid(GPU_A, code)) == set() and t.healthy(A)


def test_critical_xid_marks_only_that_gpu_and_it_recovers_after_quiet_probes() -> None:
    clock = Clock()
    t = tracker(clock)
    assert t.on_event(xid(GPU_A, 79)) == {A}
    assert not t.healthy(A) and t.healthy(B)
    assert t.on_event(xid(GPU_A, 79)) == set()  # already unhealthy: no change
    clock.now += 59
    assert t.on_probe(A, True) == set() and not t.healthy(A)  # quiet period not over
    clock.now += 1
    assert t.on_probe(A, True) == {A} and t.healthy(A)


def test_a_new_error_restarts_the_quiet_period() -> None:
    clock = Clock()
    t = tracker(clock)
    t.on_event(xid(GPU_A, 48))
    clock.now += 50
    t.on_event(xid(GPU_A, 48))
    clock.now += 50
    assert t.on_probe(A, True) == set()
    clock.now += 10
    assert t.on_probe(A, True) == {A}


def test_failed_probe_marks_unhealthy_and_blocks_recovery() -> None:
    clock = Clock()
    t = tracker(clock)
    assert t.on_probe(B, False) == {B}
    clock.now += 100
    assert t.on_probe(B, False) == set() and not t.healthy(B)
    clock.now += 60
    assert t.on_probe(B, True) == {B}


@pytest.mark.parametrize(
    "event",
    [
        GpuEvent(EventKind.LOST, None, xid=13, detail="event UUID unreadable: Unknown Error"),
        GpuEvent(EventKind.LOST, A, xid=43),
        GpuEvent(EventKind.XID, None, xid=31),
    ],
    ids=["lost-unattributed", "lost-attributed", "xid-unattributed"],
)
def test_an_application_xid_changes_nothing_whatever_the_event_kind(event: GpuEvent) -> None:
    """NVIDIA's plugin checks the skipped XIDs before it reads the event's GPU."""
    t = tracker(Clock())
    assert t.on_event(event) == set() and t.snapshot() == {A: True, B: True}


async def test_an_application_xid_whose_gpu_nvml_cannot_read_marks_nothing() -> None:
    a, b = FakeGpu(GPU_A), FakeGpu(GPU_B)
    module = make_module([a, b])
    backend = nvml.NvmlBackend(module)
    backend.open()
    assert backend.wait_event(0.0) is None  # the event set made, both GPUs registered
    unreadable = FakeGpu(GPU_A, broken=True)  # the event's device handle: its UUID read fails
    module.events += [(unreadable, module.nvmlEventTypeXidCriticalError, 13)]
    health = tracker(Clock())
    monitor = HealthMonitor(backend, health, probe_interval_s=3600)
    event = backend.wait_event(0.0)
    assert event is not None and (event.kind, event.uuid, event.xid) == (EventKind.LOST, None, 13)
    version = monitor.version
    await monitor.handle_event(event)
    assert monitor.version == version and health.snapshot() == {A: True, B: True}
    backend.close()


def test_unattributed_lost_event_marks_every_gpu() -> None:
    t = tracker(Clock())
    assert t.on_event(GpuEvent(EventKind.LOST, None, detail="event wait failed")) == {A, B}


def test_unknown_gpu_and_disabled_xid_checks() -> None:
    t = tracker(Clock(), xid_checks=False)
    assert t.on_event(xid("GPU-other", 79)) == set()
    assert t.on_event(xid(GPU_A, 79)) == set() and t.healthy(A)
    assert t.on_event(GpuEvent(EventKind.LOST, A)) == {A}  # a lost GPU still counts


def test_custom_ignored_list() -> None:
    t = tracker(Clock(), ignored_xids=[79])
    assert t.on_event(xid(GPU_A, 79)) == set()
    assert t.on_event(xid(GPU_A, 13)) == {A}


async def test_monitor_turns_backend_events_into_versions_and_recovers() -> None:
    clock = Clock()
    backend = fake_backend()
    monitor = HealthMonitor(backend, tracker(clock), probe_interval_s=3600, event_wait_s=5)
    task = asyncio.create_task(monitor.run())
    try:
        version = monitor.version
        backend.inject_xid(GPU_B, 79)
        version = await asyncio.wait_for(monitor.wait_changed(version), 5)
        assert not monitor.tracker.healthy(B)
        backend.vanish(GPU_A)
        await asyncio.wait_for(monitor.wait_changed(version), 5)
        assert not monitor.tracker.healthy(A)
        clock.now += 61
        backend.restore(GPU_A)
        await monitor.probe_all()
        assert monitor.tracker.healthy(A) and monitor.tracker.healthy(B)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_failing_event_wait_marks_every_gpu_lost_and_backs_off() -> None:
    """A GPU off the bus makes nvmlEventSetWait fail at once, every time: GPUs lost, then the next
    wait only after the probe interval (a returned LOST event looped straight back: a core spun)."""
    module = make_module([FakeGpu(GPU_A), FakeGpu(GPU_B)])
    waits: list[int] = []

    def lost_wait(event_set: object, timeout_ms: int) -> object:
        waits.append(timeout_ms)
        raise NVMLError("GPU is lost")

    module.nvmlEventSetWait_v2 = lost_wait
    backend = nvml.NvmlBackend(module)
    backend.open()
    naps: list[float] = []
    napping = asyncio.Condition()

    async def sleep(seconds: float) -> None:
        async with napping:
            naps.append(seconds)
            napping.notify_all()
        await asyncio.Event().wait()  # parked: each loop's first nap is all this test needs

    health = tracker(Clock())
    monitor = HealthMonitor(backend, health, probe_interval_s=3600, event_wait_s=1, sleep=sleep)
    task = asyncio.create_task(monitor.run())
    try:
        async with napping:  # the probe loop's nap and the event loop's back-off
            await asyncio.wait_for(napping.wait_for(lambda: len(naps) == 2), 5)
        assert naps == [3600, 3600] and waits == [1000]
        assert not health.healthy(A) and not health.healthy(B)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        backend.close()


def test_a_new_session_keeps_known_gpu_states() -> None:
    clock = Clock()
    old = tracker(clock)
    old.on_event(xid(GPU_A, 79))
    new = HealthTracker([A, GpuUuid("GPU-new")], clock=clock, recovery_s=60, ignored_xids=())
    new.adopt(old)
    assert not new.healthy(A) and new.healthy(GpuUuid("GPU-new"))
    clock.now += 60
    assert new.on_probe(A, True) == {A}
