"""Health: XID handling, ignored XIDs, lost GPUs, and recovery after a quiet period (fake clock)."""

from __future__ import annotations

import asyncio

import pytest
from vgpu.core.device import GpuUuid
from vgpu.gpu.port import APPLICATION_XIDS, EventKind, GpuEvent
from vgpu_device_plugin.health import HealthMonitor, HealthTracker

from tests.device_plugin.builders import GPU_A, GPU_B, fake_backend

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


def test_a_new_session_keeps_known_gpu_states() -> None:
    clock = Clock()
    old = tracker(clock)
    old.on_event(xid(GPU_A, 79))
    new = HealthTracker([A, GpuUuid("GPU-new")], clock=clock, recovery_s=60, ignored_xids=())
    new.adopt(old)
    assert not new.healthy(A) and new.healthy(GpuUuid("GPU-new"))
    clock.now += 60
    assert new.on_probe(A, True) == {A}
