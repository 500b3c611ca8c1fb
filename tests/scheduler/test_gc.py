"""The scheduler keeps its long-lived objects out of the collector's full scans (vgpu.gcfreeze) and
gives back the cycles frozen since while the extender is idle, busy or not once its resident memory
grew past the bound, or once a compaction is overdue."""

from __future__ import annotations

import asyncio
import gc
import subprocess
import sys
import weakref

import pytest
from vgpu import gcfreeze
from vgpu_scheduler.app import SchedulerService

from tests.scheduler.scenario import Cluster, gpu_container
from tests.scheduler.test_webhook import review as admission_review


class Cycle:
    def __init__(self) -> None:
        self.me = self


def _grow_frozen(service: SchedulerService) -> list[list[int]]:
    """Long-lived objects, frozen at the next young collection, enough to pass the growth factor."""
    growth = gcfreeze.Bounds().idle_growth
    grown = [[i] for i in range(int(service.gc.frozen() * growth) + 1000)]
    gc.collect(1)
    assert service.gc.frozen() >= service.gc.frozen_after_compaction * growth
    return grown


def _frozen_garbage() -> weakref.ref[Cycle]:
    """A cycle frozen while alive, then dropped: garbage only a compaction finds."""
    obj = Cycle()
    ref = weakref.ref(obj)
    gc.collect(1)
    del obj
    gc.collect()
    assert ref() is not None
    return ref


async def test_the_synced_state_and_later_survivors_are_frozen_until_stop(cluster: Cluster) -> None:
    service = cluster.service
    assert service is not None and service.gc.installed and service.gc.frozen() > 0
    cluster.add_pod("p", gpu_container(gpu=1, mem=1000))
    await cluster.synced()
    pod = cluster.state.pods[cluster.pod("p")["metadata"]["uid"]]
    gc.collect(1)
    assert gc.is_tracked(pod) and not any(any(o is pod for o in gc.get_objects(g)) for g in range(3))
    assert service.gc_check() is None  # counts the frozen objects; nothing grew
    text = service.services.metrics.render(service.services.metrics.snapshot()).decode()
    assert f"vgpu_scheduler_gc_frozen_objects {float(service.gc.counted)}" in text
    assert service.gc.counted > 0 and "vgpu_scheduler_gc_compactions_total 0.0" in text
    await cluster.stop()
    assert not service.gc.installed and gc.get_freeze_count() == 0


async def test_an_idle_extender_compacts_once_the_frozen_objects_grew(cluster: Cluster) -> None:
    service = cluster.service
    assert service is not None
    assert service.gc_check() is None  # idle, but nothing grew
    grown = _grow_frozen(service)
    garbage = _frozen_garbage()
    done = service.gc_check()
    assert done is not None and done.collected >= 1 and garbage() is None
    assert service.gc.compactions == 1 and service.gc_compacted.is_set()
    assert service.gc_check() is None  # the growth is counted from the compaction on
    del grown


async def test_no_compaction_while_kube_scheduler_is_calling(cluster: Cluster) -> None:
    service = cluster.service
    assert service is not None
    grown = _grow_frozen(service)
    garbage = _frozen_garbage()
    cluster.add_pod("p", gpu_container(gpu=1, mem=1000))
    await cluster.synced()
    await cluster.filter("p")  # a call since the last check: not idle
    assert service.gc_check() is None and garbage() is not None
    assert service.gc_check() is not None and garbage() is None  # no call since: idle now
    del grown


async def test_an_admission_review_is_a_call_too(cluster: Cluster) -> None:
    service = cluster.service
    assert service is not None
    grown = _grow_frozen(service)
    review = admission_review({"metadata": {"name": "p"}, "spec": {"containers": [gpu_container(gpu=1)]}})
    status, body = await cluster.post("webhook", review)
    assert status == 200 and body["response"]["allowed"] is True
    assert service.gc_check() is None  # the API server was waiting on us
    assert service.gc_check() is not None
    del grown


async def test_the_service_checks_on_its_own() -> None:
    c = Cluster()
    c.add_node("node-a")
    await c.start(gc_check_s=0.01)
    try:
        assert c.service is not None
        grown = _grow_frozen(c.service)
        garbage = _frozen_garbage()
        await asyncio.wait_for(c.service.gc_compacted.wait(), 10)
        assert garbage() is None
        del grown
    finally:
        await c.stop()


async def test_a_scheduler_never_idle_still_compacts_once_overdue() -> None:
    c = Cluster()
    c.add_node("node-a")
    await c.start(gc_check_s=3600.0, gc_bounds=gcfreeze.Bounds(overdue_s=0.0))
    try:
        assert c.service is not None
        garbage = _frozen_garbage()  # and the frozen objects have not grown by the factor
        c.add_pod("p", gpu_container(gpu=1, mem=1000))
        await c.synced()
        await c.filter("p")  # kube-scheduler is calling: not idle
        done = c.service.gc_check()
        assert done is not None and done.collected >= 1 and garbage() is None
        assert c.service.gc.compactions == 1
    finally:
        await c.stop()


class Resident:
    """A resident set the test sets (bytes)."""

    def __init__(self) -> None:
        self.bytes = 200 << 20

    def __call__(self) -> int:
        return self.bytes


async def test_a_busy_scheduler_compacts_once_its_memory_grew_past_the_bound() -> None:
    resident = Resident()
    bounds = gcfreeze.Bounds()
    c = Cluster()
    c.add_node("node-a")
    # the periodic checks are the test's to make
    await c.start(gc=gcfreeze.SurvivorFreezer(rss=resident), gc_check_s=3600.0, gc_memory_check_s=3600.0)
    try:
        assert c.service is not None
        garbage = _frozen_garbage()  # the frozen objects have not grown by the idle factor
        c.add_pod("p", gpu_container(gpu=1, mem=1000))
        await c.synced()
        await c.filter("p")  # kube-scheduler is calling: not idle
        slack = max(bounds.memory_slack_bytes, bounds.memory_slack_ratio * resident.bytes)
        resident.bytes += int(slack)  # at the bound, not past it
        assert c.service.gc_memory_check() is None and garbage() is not None
        resident.bytes += 1 << 20
        done = c.service.gc_memory_check()
        assert done is not None and done.collected >= 1 and garbage() is None
        assert done.rss_before == done.rss_after == resident.bytes
        assert c.service.gc_memory_check() is None  # the bound counts from the compaction on
    finally:
        await c.stop()


async def test_the_memory_bound_is_checked_every_second_not_when_idle() -> None:
    resident = Resident()
    c = Cluster()
    c.add_node("node-a")
    await c.start(gc=gcfreeze.SurvivorFreezer(rss=resident), gc_check_s=3600.0, gc_memory_check_s=0.01)
    try:
        assert c.service is not None
        garbage = _frozen_garbage()
        resident.bytes *= 2
        await asyncio.wait_for(c.service.gc_compacted.wait(), 10)
        assert garbage() is None
    finally:
        await c.stop()


@pytest.mark.slow
def test_the_gc_bench_shows_no_full_collection_with_the_freezer() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bench.gc_bench", "--nodes", "300", "--policies", "survivors"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    fill, churn = (line for line in out.splitlines() if line.lstrip().startswith(("fill", "churn")))
    assert "full   0," in fill and "full   0," in churn, out
    assert "2400 pods added" in fill and "2400 pods replaced" in churn
