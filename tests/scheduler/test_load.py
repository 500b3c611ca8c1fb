"""Under load: an event storm does not starve the calls that answer kube-scheduler, /readyz says when
requests cannot be served, and the event queue is bounded (repeats coalesced, overflow counted)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from vgpu import gcfreeze
from vgpu.kube import threads
from vgpu.kube.client import OfficialKubeApi
from vgpu.kube.kubeconfig import write_kubeconfig
from vgpu_scheduler import load
from vgpu_scheduler.events import EventRecorder

from tests.scheduler.gated import GatedApiServer, events_posts
from tests.scheduler.scenario import Cluster, gpu_container

FAILED_FILTERS = 3000


@pytest.fixture
async def gated_cluster(tmp_path: Path) -> AsyncIterator[tuple[Cluster, GatedApiServer]]:
    c = Cluster()
    server = GatedApiServer(c.store, hold=events_posts)
    await server.start()
    api = OfficialKubeApi.from_kubeconfig(str(write_kubeconfig(tmp_path / "kubeconfig", server=server.url)))
    c.api = api
    c.add_node("node-a")
    try:
        await c.start()
        yield c, server
    finally:
        server.gate.set()  # let held event posts finish so their threads end
        await c.stop()
        await api.close()
        await server.stop()


def _unschedulable(i: int) -> dict[str, Any]:
    return {
        "metadata": {"name": f"big-{i}", "namespace": "default", "uid": f"uid-big-{i}"},
        "spec": {"containers": [gpu_container(mem=200_000)]},
    }


@pytest.mark.slow
async def test_placing_filter_and_bind_answer_while_3000_failed_filters_events_are_still_draining(
    gated_cluster: tuple[Cluster, GatedApiServer],
) -> None:
    c, server = gated_cluster
    assert c.service is not None
    extender, recorder = c.service.services.extender, c.service.events
    for i in range(FAILED_FILTERS):
        reply = extender.filter({"Pod": _unschedulable(i), "NodeNames": ["node-a"]})
        assert reply.outcome == "unschedulable"
    # the API server holds every event post: the senders are stuck, the queue is full
    await asyncio.wait_for(server.arrived.wait(), 20)
    c.add_pod("fits", gpu_container(mem=1000))
    await c.synced()

    body = await asyncio.wait_for(c.filter("fits"), 20)
    assert body["NodeNames"] == ["node-a"], body
    # the bind writes through the API (node lock, Binding): it must not queue behind the events
    assert await asyncio.wait_for(c.bind("fits", "node-a"), 20) == ""

    assert c.pod("fits")["spec"]["nodeName"] == "node-a"
    assert c.pod("fits")["metadata"]["annotations"]["hami.io/vgpu-node"] == "node-a"
    # answered while the events were still held and queued: it never waited behind them
    assert server.held >= 1 and recorder.queued > 0
    # every event is held by the server, queued or counted as dropped (+ the placed pod's own)
    placed_events = recorder.queued + recorder.dropped + server.held - FAILED_FILTERS
    assert 1 <= placed_events <= 2
    assert recorder.dropped > 0
    server.gate.set()
    await asyncio.wait_for(recorder.drain(), 60)
    stored = [
        e for e in c.store.list("events", namespace="default").items if e["reason"] == "FilteringFailed"
    ]
    assert len(stored) == FAILED_FILTERS - recorder.dropped
    assert server.held == 0


class _GatedEventsApi:
    """create_event waits for ``gate``; records what it sends."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.sent: list[dict[str, Any]] = []
        self.waiting = 0
        self.first_waiting = asyncio.Event()

    async def create_event(self, **kw: Any) -> None:
        self.waiting += 1
        self.first_waiting.set()
        await self.gate.wait()
        self.waiting -= 1
        self.sent.append(kw)


def _pod(name: str) -> dict[str, Any]:
    return {"kind": "Pod", "metadata": {"name": name, "namespace": "ns", "uid": f"u-{name}"}}


async def test_event_queue_coalesces_repeats_and_drops_with_a_count_when_full() -> None:
    api = _GatedEventsApi()
    recorder = EventRecorder(api, component="t", max_queued=3, senders=1)  # type: ignore[arg-type]
    try:
        recorder.emit(_pod("a"), reason="R", message="m")  # taken by the sender at once
        await api.first_waiting.wait()
        for _ in range(4):
            recorder.emit(_pod("b"), reason="R", message="same")  # one queued event, count 4
        recorder.emit(_pod("b"), reason="R", message="other")
        recorder.emit(_pod("c"), reason="R", message="m")
        recorder.emit(_pod("d"), reason="R", message="m")  # the queue holds 3: dropped
        assert (recorder.queued, recorder.coalesced, recorder.dropped) == (3, 3, 1)
        api.gate.set()
        await recorder.drain()
        sent = [(kw["involved"]["metadata"]["name"], kw["message"], kw["count"]) for kw in api.sent]
        assert sent == [("a", "m", 1), ("b", "same", 4), ("b", "other", 1), ("c", "m", 1)]
        assert recorder.sent == 4
    finally:
        await recorder.aclose()


async def test_metrics_show_the_event_queue_and_the_api_pool(cluster: Cluster) -> None:
    assert c_service(cluster).services.metrics is not None
    recorder = c_service(cluster).events
    recorder.dropped += 2  # as if the queue had overflowed twice
    assert cluster.session is not None
    async with cluster.session.get(f"{cluster.url}/metrics") as resp:
        text = await resp.text()
    assert 'vgpu_scheduler_events_total{result="dropped"} 2.0' in text
    assert "vgpu_scheduler_events_queued" in text
    assert "vgpu_scheduler_event_loop_lag_seconds" in text


def c_service(cluster: Cluster) -> Any:
    assert cluster.service is not None
    return cluster.service


class _Backlog:
    def __init__(self) -> None:
        self.busy, self.queued, self.wait_s = 16, 0, 0.0

    def oldest_wait_s(self) -> float:
        return self.wait_s


async def test_metrics_count_the_starts_of_the_writes_helper(cluster: Cluster) -> None:
    backlog = _Backlog()
    c_service(cluster).services.load.pool = backlog
    assert cluster.session is not None
    async with cluster.session.get(f"{cluster.url}/metrics") as resp:
        assert "vgpu_scheduler_api_writer_starts" not in await resp.text()  # inline: no helper
    backlog.starts = 2  # type: ignore[attr-defined]  # OffloadedKubeApi.starts: one helper replaced
    async with cluster.session.get(f"{cluster.url}/metrics") as resp:
        text = await resp.text()
    assert "vgpu_scheduler_api_writer_starts_total 2.0" in text
    assert "vgpu_scheduler_api_calls_in_flight 16.0" in text


async def test_readyz_is_503_while_api_calls_wait_too_long_and_recovers(cluster: Cluster) -> None:
    backlog = _Backlog()
    c_service(cluster).services.load.pool = backlog
    assert cluster.session is not None

    async def readyz() -> tuple[int, str]:
        assert cluster.session is not None
        async with cluster.session.get(f"{cluster.url}/readyz") as resp:
            return resp.status, await resp.text()

    assert await readyz() == (200, "ok")
    backlog.queued, backlog.wait_s = 40, load.MAX_API_WAIT_S + 1
    status, text = await readyz()
    assert status == 503
    assert "API calls waiting for a worker: 40 queued, 16 in flight" in text
    backlog.queued, backlog.wait_s = 0, 0.0
    assert await readyz() == (200, "ok")


async def test_readyz_is_503_while_the_loop_lags(cluster: Cluster) -> None:
    probe = c_service(cluster).lag_probe
    probe.observed.clear()
    await asyncio.wait_for(probe.observed.wait(), 10)  # the wake-up after readiness's collection
    probe.observe(expected_at=10.0, woke_at=10.0 + load.MAX_LOOP_LAG_S + 0.5)
    assert cluster.session is not None
    async with cluster.session.get(f"{cluster.url}/readyz") as resp:
        assert resp.status == 503
        assert "event loop lagging" in await resp.text()
    probe.observe(expected_at=20.0, woke_at=20.01)
    async with cluster.session.get(f"{cluster.url}/readyz") as resp:
        assert resp.status == 200


class _LongCollection(gcfreeze.SurvivorFreezer):
    """The collection at readiness over a large state: it holds the loop past the lag limit."""

    def install(self) -> None:
        threading.Event().wait(load.MAX_LOOP_LAG_S + 0.5)
        super().install()


async def test_the_collection_at_readiness_is_not_held_against_readiness() -> None:
    """The pause of the collection that comes with readiness is over when the probe sees it: /readyz
    stays 200 (it was 503 for the probe's next interval, in every test that asked it at once)."""
    c = Cluster()
    c.add_node("node-a")
    await c.start(gc=_LongCollection())
    try:
        probe = c_service(c).lag_probe
        await c.until(lambda: probe.max_lag_s > load.MAX_LOOP_LAG_S)  # it saw the pause
        assert c.session is not None
        async with c.session.get(f"{c.url}/readyz") as resp:
            assert (resp.status, await resp.text()) == (200, "ok")
        probe.observe(expected_at=10.0, woke_at=10.0 + load.MAX_LOOP_LAG_S + 0.5)  # a later lag counts
        async with c.session.get(f"{c.url}/readyz") as resp:
            assert resp.status == 503
    finally:
        await c.stop()


async def test_loop_lag_probe_measures_a_blocked_loop() -> None:
    probe = load.LoopLagProbe(interval_s=0.01)
    task = asyncio.get_running_loop().create_task(probe.run())
    try:
        await asyncio.sleep(0)  # the probe arms its 10 ms timer
        threading.Event().wait(0.2)  # one 200 ms step that blocks the loop (the thing measured)
        probe.observed.clear()
        await asyncio.wait_for(probe.observed.wait(), 10)
        assert probe.max_lag_s >= 0.15
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


class _FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_call_pool_reports_how_long_the_oldest_call_has_waited_for_a_worker() -> None:
    clock = _FakeClock()
    pool = threads.CallPool(1, name="t", clock=clock)
    release = threading.Event()
    started = threading.Event()

    def hold() -> str:
        started.set()
        release.wait(timeout=30)
        return "first"

    try:
        first = asyncio.ensure_future(pool.run(hold))
        await asyncio.to_thread(started.wait, 30)
        second = asyncio.ensure_future(pool.run(lambda: "second"))
        await asyncio.sleep(0)  # the second call is queued behind the busy worker
        assert (pool.busy, pool.queued) == (1, 1)
        clock.now += 7.5
        assert pool.oldest_wait_s() == 7.5
        backlog_problem = load.Load(pool=pool, max_api_wait_s=5).problem()
        assert backlog_problem is not None and "1 queued, 1 in flight" in backlog_problem
        release.set()
        assert await first == "first" and await second == "second"
        assert (pool.queued, pool.oldest_wait_s()) == (0, 0.0)
    finally:
        release.set()
        pool.close()


async def test_call_pool_hands_exceptions_back_and_skips_calls_abandoned_while_queued() -> None:
    pool = threads.CallPool(1, name="t")
    release = threading.Event()
    ran: list[str] = []

    def hold() -> None:
        release.wait(timeout=30)

    def boom() -> None:
        raise ValueError("boom")

    try:
        busy = asyncio.ensure_future(pool.run(hold))
        abandoned = asyncio.ensure_future(pool.run(lambda: ran.append("abandoned")))
        await asyncio.sleep(0)
        abandoned.cancel()
        await asyncio.gather(abandoned, return_exceptions=True)
        release.set()
        await busy
        with pytest.raises(ValueError, match="boom"):
            await pool.run(boom)
        assert ran == []
    finally:
        release.set()
        pool.close()


class _BrokenOnceApi(_GatedEventsApi):
    """The first create_event fails with a bug (not a KubeError), the others are recorded."""

    def __init__(self) -> None:
        super().__init__()
        self.gate.set()
        self.failed = False

    async def create_event(self, **kw: Any) -> None:
        if not self.failed:
            self.failed = True
            raise TypeError("a bug in the adapter")
        await super().create_event(**kw)


async def test_a_failing_event_does_not_stop_the_sender(caplog: pytest.LogCaptureFixture) -> None:
    api = _BrokenOnceApi()
    recorder = EventRecorder(api, component="t", senders=1)  # type: ignore[arg-type]
    try:
        recorder.emit(_pod("a"), reason="R", message="m")
        recorder.emit(_pod("b"), reason="R", message="m")
        await recorder.drain()
        assert [kw["involved"]["metadata"]["name"] for kw in api.sent] == ["b"]
        assert "could not record event R on Pod a" in caplog.text
    finally:
        await recorder.aclose()
