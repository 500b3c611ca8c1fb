"""/bind through real HTTP: lock, phase, Binding; contention waits; stale locks; rollback."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
from typing import Any

import pytest
from vgpu.core import allocation, annotations, errors
from vgpu.core.config import Config, NodeLock, SchedulerConfig
from vgpu.localcluster.client import LocalKubeApi
from vgpu_scheduler import retries

from tests.scheduler.scenario import Cluster, gpu_container, gpus

KEYS = annotations.KEYS


async def _locked_by_a_live_holder(cluster: Cluster, node: str) -> None:
    """``node``'s lock held by pod default/holder, bound and waiting for its Allocate (not stale)."""
    cluster.add_pod("holder", gpu_container(mem=1), annotations={KEYS.bind_phase: "allocating"})
    stamp = annotations.format_rfc3339(cluster.clock.wall())
    cluster.store.patch(
        "nodes", node, {"metadata": {"annotations": {KEYS.node_lock: f"{stamp},default,holder"}}}
    )
    await cluster.synced()


async def _filtered(cluster: Cluster, name: str, mem: int = 1000, nodes: list[str] | None = None) -> str:
    cluster.add_pod(name, gpu_container(mem=mem))
    await cluster.synced()
    body = await cluster.filter(name, nodes=nodes)
    (node,) = body["NodeNames"]
    await cluster.synced()
    return node


async def test_bind_takes_lock_and_binds_with_the_decision_in_one_write(cluster: Cluster) -> None:
    node = await _filtered(cluster, "p1")
    devices = cluster.decision("p1")
    pod_rv = int(cluster.pod("p1")["metadata"]["resourceVersion"])
    assert await cluster.bind("p1", node) == ""
    pod = cluster.pod("p1")
    assert pod["spec"]["nodeName"] == node
    ann = pod["metadata"]["annotations"]
    assert ann[KEYS.assigned_node] == node
    assert (
        ann[KEYS.devices_allocated]
        == ann[KEYS.devices_to_allocate]
        == devices
        == f"GPU-{node}-0,NVIDIA,1000,0:;"
    )
    assert ann[KEYS.assigned_time] == ann[KEYS.bind_time] == str(int(cluster.clock.now))
    assert ann[KEYS.bind_phase] == "allocating"
    lock = annotations.decode_node_lock(cluster.node(node)["metadata"]["annotations"][KEYS.node_lock])
    assert lock.held_by("default", "p1")
    # the Binding carried the annotations: the pod's first change since the filter is the binding
    watch = cluster.store.watch(
        "pods", resource_version=str(pod_rv), namespace="default", field_selector="metadata.name=p1"
    )
    first = await anext(aiter(watch))
    watch.close()
    assert first.object["spec"]["nodeName"] == node
    assert first.object["metadata"]["annotations"][KEYS.devices_allocated] == devices
    await cluster.synced()
    assert cluster.decision("p1") == devices  # the reservation became the pod's own charge
    assert sum(u.memory_mib for u in cluster.state.used(node).values()) == 1000
    await cluster.service.events.drain()
    assert [e["message"] for e in cluster.events("BindingSucceed")] == [
        f"Successfully binding node [{node}] to default/p1"
    ]


@pytest.mark.parametrize("wanted", [False, True], ids=["default", "labelAssignedPods"])
async def test_the_node_label_is_left_to_the_device_plugin_unless_asked_for(wanted: bool) -> None:
    """Default: no label write (our device plugin sets it with bind-phase success); with
    ``labelAssignedPods`` (for tools that need the label from the bind on) the scheduler writes it
    after the bind."""
    cluster = Cluster(Config(scheduler=SchedulerConfig(label_assigned_pods=wanted)))
    cluster.add_node("node-a")
    await cluster.start()
    try:
        node = await _filtered(cluster, "p1")
        assert await cluster.bind("p1", node) == ""
        if wanted:
            await cluster.until(
                lambda: cluster.pod("p1")["metadata"].get("labels", {}).get(KEYS.assigned_node) == node
            )
        else:
            assert not cluster.service.services.binder._tasks  # no write scheduled after the bind
            assert KEYS.assigned_node not in (cluster.pod("p1")["metadata"].get("labels") or {})
    finally:
        await cluster.stop()


async def test_second_bind_waits_for_the_lock_then_succeeds(cluster: Cluster) -> None:
    node = await _filtered(cluster, "p1")
    node2 = await _filtered(cluster, "p2", nodes=[node])  # only the busy node offered
    assert node == node2
    assert await cluster.bind("p1", node) == ""
    await cluster.synced()
    second = asyncio.ensure_future(cluster.bind("p2", node))
    await cluster.until(lambda: bool(cluster.state._waiters.get(node)))  # the bind is waiting on the node
    assert not second.done()
    cluster.plugin_allocates("p1", node)
    assert await asyncio.wait_for(second, 5) == ""
    lock = annotations.decode_node_lock(cluster.node(node)["metadata"]["annotations"][KEYS.node_lock])
    assert lock.held_by("default", "p2")


async def test_lock_of_a_deleted_pod_is_taken_over_at_once(cluster: Cluster) -> None:
    node = await _filtered(cluster, "p1")
    stamp = annotations.format_rfc3339(cluster.clock.wall())
    cluster.store.patch(
        "nodes", node, {"metadata": {"annotations": {KEYS.node_lock: f"{stamp},default,ghost"}}}
    )
    await cluster.synced()
    assert await cluster.bind("p1", node) == ""


async def test_expired_lock_is_stolen_and_fresh_one_times_out(cluster: Cluster) -> None:
    cluster.config = cluster.config  # defaults: lock timeout 60 s
    node = await _filtered(cluster, "p1")
    holder = cluster.add_pod("holder", gpu_container(mem=1))
    old = annotations.format_rfc3339(cluster.clock.wall())
    cluster.store.patch(
        "nodes", node, {"metadata": {"annotations": {KEYS.node_lock: f"{old},default,holder"}}}
    )
    await cluster.synced()
    cluster.clock.now += 61
    cluster.renew_lease(node)
    await cluster.synced()
    # 61 s later the filter's reservation has expired too: the bind fits the pod again, it still fits
    assert await cluster.bind("p1", node) == ""
    del holder


class _ConflictingBindings(LocalKubeApi):
    """The API for a scheduler whose Binding POSTs are refused as kube-apiserver refuses one for a
    pod bound meanwhile (the scheduler's watch not having shown it yet)."""

    def __init__(self, cluster: Cluster) -> None:
        super().__init__(cluster.store, clock=cluster.clock.wall)

    async def bind_pod(self, namespace: str, name: str, **kwargs: Any) -> None:
        raise errors.Conflict(
            f'Operation cannot be fulfilled on pods/binding "{name}": pod {name} is already assigned'
        )


async def test_bind_failure_rolls_everything_back() -> None:
    c = Cluster()
    c.api = _ConflictingBindings(c)
    c.add_node("node-a")
    c.config = c.config
    await c.start()
    try:
        node = await _filtered(c, "p1", mem=5000)
        error = await c.bind("p1", node)  # the Binding call answers Conflict
        assert "binding pod default/p1 to node node-a failed" in error and "already assigned" in error
        ann = c.pod("p1")["metadata"].get("annotations", {})
        assert (
            KEYS.assigned_node not in ann and KEYS.devices_allocated not in ann and KEYS.bind_phase not in ann
        )
        assert KEYS.assigned_node not in c.pod("p1")["metadata"].get("labels", {})
        assert c.decision("p1") is None
        assert KEYS.node_lock not in c.node(node)["metadata"].get("annotations", {})
        await c.synced()
        assert c.state.used(node) == {}
        await c.service.events.drain()
        assert len(c.events("BindingFailed")) == 1
    finally:
        await c.stop()


async def test_bind_for_another_node_fits_the_pod_there_or_is_refused(cluster: Cluster) -> None:
    node = await _filtered(cluster, "p1", mem=9000)
    other = "node-b" if node == "node-a" else "node-a"
    cluster.add_pod("filler", gpu_container(gpu=2, mem=9000))
    await cluster.synced()
    assert (await cluster.filter("filler", nodes=[other]))["NodeNames"] == [other]
    error = await cluster.bind("p1", other)  # the other node is now too full for p1
    assert "no longer fits there: no GPU with 9000 MiB free: best has 7000" in error
    assert "nodeName" not in cluster.pod("p1")["spec"]
    assert KEYS.node_lock not in cluster.node(other)["metadata"].get("annotations", {})
    assert cluster.decision("p1") is None  # the decision for the first node no longer applies either
    cluster.store.delete("pods", "filler", namespace="default")
    await cluster.synced()
    assert await cluster.bind("p1", other) == ""
    assert cluster.state.used(node) == {}
    assert cluster.pod("p1")["spec"]["nodeName"] == other


async def test_a_late_bind_is_refused_when_its_share_was_taken_meanwhile(cluster: Cluster) -> None:
    node = await _filtered(cluster, "late", mem=9000, nodes=["node-a"])
    # kube-scheduler's binding cycle lags (PreBind, Permit) beyond the reservation's TTL
    cluster.clock.now += cluster.config.scheduler.reservation_ttl_s + 1
    cluster.renew_lease(node)
    cluster.add_pod("quick", gpu_container(gpu=2, mem=9000))
    await cluster.synced()
    assert (await cluster.filter("quick", nodes=["node-a"]))["NodeNames"] == ["node-a"]
    assert await cluster.bind("quick", node) == ""
    error = await cluster.bind("late", node)
    assert "expired or made before a restart" in error and "best has 7000" in error
    assert "nodeName" not in cluster.pod("late")["spec"]
    await cluster.synced()
    for used in cluster.state.used(node).values():
        assert used.memory_mib <= 16000


async def test_a_bind_after_a_scheduler_restart_fits_the_pod_again(cluster: Cluster) -> None:
    node = await _filtered(cluster, "p1", mem=4000)
    await cluster.stop()  # the reservation lived in memory only
    await cluster.start()
    assert cluster.decision("p1") is None
    assert await cluster.bind("p1", node) == ""
    assert cluster.pod("p1")["metadata"]["annotations"][KEYS.devices_allocated].endswith(",NVIDIA,4000,0:;")


async def test_a_lock_dated_in_the_future_is_taken_over(cluster: Cluster) -> None:
    node = await _filtered(cluster, "p1")
    cluster.add_pod("holder", gpu_container(mem=1), annotations={KEYS.bind_phase: "allocating"})
    ahead = annotations.format_rfc3339(
        datetime.datetime.fromtimestamp(cluster.clock.now + 3600, datetime.UTC)
    )
    cluster.store.patch(
        "nodes", node, {"metadata": {"annotations": {KEYS.node_lock: f"{ahead},default,holder"}}}
    )
    await cluster.synced()
    assert await cluster.bind("p1", node) == ""
    lock = annotations.decode_node_lock(cluster.node(node)["metadata"]["annotations"][KEYS.node_lock])
    assert lock.held_by("default", "p1")


async def test_a_lock_slightly_ahead_is_still_respected() -> None:
    from vgpu.core.config import Config, SchedulerConfig

    c = Cluster(Config(scheduler=SchedulerConfig(bind_lock_wait_s=0.2)))
    c.add_node("node-a")
    await c.start()
    try:
        node = await _filtered(c, "p1")
        c.add_pod("holder", gpu_container(mem=1), annotations={KEYS.bind_phase: "allocating"})
        ahead = annotations.format_rfc3339(datetime.datetime.fromtimestamp(c.clock.now + 5, datetime.UTC))
        c.store.patch(
            "nodes", node, {"metadata": {"annotations": {KEYS.node_lock: f"{ahead},default,holder"}}}
        )
        await c.synced()
        assert "is locked by default/holder" in await c.bind("p1", node)
    finally:
        await c.stop()


async def test_bind_garbage_is_400(cluster: Cluster) -> None:
    for raw in (
        b"nope",
        b"[]",
        b'{"PodName": "x"}',
        b'{"PodName": "", "PodNamespace": "d", "PodUID": "", "Node": "n"}',
    ):
        status, body = await cluster.post("bind", raw)
        assert status == 400 and body["Error"], raw


async def test_bind_of_unknown_pod_is_an_error(cluster: Cluster) -> None:
    status, body = await cluster.post(
        "bind", {"PodName": "nope", "PodNamespace": "default", "PodUID": "u", "Node": "node-a"}
    )
    assert status == 200 and "nope" in body["Error"]


async def test_lock_held_by_a_live_pod_fails_after_the_wait_budget() -> None:
    from vgpu.core.config import Config, SchedulerConfig

    c = Cluster(Config(scheduler=SchedulerConfig(bind_lock_wait_s=0.2)))
    c.add_node("node-a")
    await c.start()
    try:
        node = await _filtered(c, "p1")
        c.add_pod("holder", gpu_container(mem=1), annotations={KEYS.bind_phase: "allocating"})
        stamp = annotations.format_rfc3339(c.clock.wall())
        c.store.patch(
            "nodes", node, {"metadata": {"annotations": {KEYS.node_lock: f"{stamp},default,holder"}}}
        )
        await c.synced()
        error = await c.bind("p1", node)
        assert "node node-a is locked by default/holder" in error and "waited 0.2 s" in error
        assert c.node(node)["metadata"]["annotations"][KEYS.node_lock].endswith(",default,holder")
        assert KEYS.assigned_node not in c.pod("p1")["metadata"].get("annotations", {})
    finally:
        await c.stop()


async def test_pod_without_gpus_is_bound_without_the_lock(cluster: Cluster) -> None:
    cluster.add_pod("cpu", {"name": "c", "image": "busybox"})
    await cluster.synced()
    assert await cluster.bind("cpu", "node-a") == ""
    assert cluster.pod("cpu")["spec"]["nodeName"] == "node-a"
    assert KEYS.node_lock not in cluster.node("node-a")["metadata"].get("annotations", {})


async def test_lock_of_a_running_pod_is_taken_over_at_once(cluster: Cluster) -> None:
    node = await _filtered(cluster, "p1")
    cluster.add_pod("runner", gpu_container(mem=1), annotations={KEYS.bind_phase: "allocating"})
    cluster.store.patch(
        "pods", "runner", {"status": {"phase": "Running"}}, namespace="default", subresource="status"
    )
    stamp = annotations.format_rfc3339(cluster.clock.wall())
    cluster.store.patch(
        "nodes", node, {"metadata": {"annotations": {KEYS.node_lock: f"{stamp},default,runner"}}}
    )
    await cluster.synced()
    assert await cluster.bind("p1", node) == ""


async def test_a_late_bind_refits_within_the_namespace_quota(cluster: Cluster) -> None:
    cluster.store.create(
        "resourcequotas",
        {"metadata": {"name": "gpu"}, "spec": {"hard": {"limits.nvidia.com/gpumem": "10000"}}},
        namespace="default",
    )
    await cluster.until(lambda: cluster.state.quota.quota_limits("default") != (None, None))
    node = await _filtered(cluster, "late", mem=6000, nodes=["node-a"])
    cluster.clock.now += cluster.config.scheduler.reservation_ttl_s + 1  # the reservation expires
    cluster.renew_lease("node-a")
    cluster.renew_lease("node-b")
    cluster.add_pod("quick", gpu_container(mem=6000))
    await cluster.synced()
    assert (await cluster.filter("quick", nodes=["node-b"]))["NodeNames"] == ["node-b"]
    error = await cluster.bind("late", node)
    assert error.endswith("namespace default: GPU memory quota exceeded (used 6000 of 10000, requested 6000)")
    assert "nodeName" not in cluster.pod("late")["spec"]
    assert cluster.decision("late") is None


async def _contended(*nodes: str) -> Cluster:
    cluster = Cluster(Config(scheduler=SchedulerConfig(node_lock=NodeLock.CONTENDED)))
    for node in nodes:
        cluster.add_node(node)
    await cluster.start()
    return cluster


async def test_contended_mode_binds_a_quiet_node_without_the_lock_and_serialises_hand_offs() -> None:
    cluster = await _contended("node-a")
    try:
        node = await _filtered(cluster, "p1")
        node_rv = cluster.node(node)["metadata"]["resourceVersion"]
        assert await cluster.bind("p1", node) == ""
        assert cluster.pod("p1")["metadata"]["annotations"][KEYS.bind_phase] == "allocating"
        assert cluster.node(node)["metadata"]["resourceVersion"] == node_rv  # no node write at all
        await cluster.synced()
        assert node in cluster.state.busy_nodes()
        # a second pod for the same node waits for p1's hand-off, without taking any lock (it lists
        # before p1, so even HAMi's search, which also takes p1 once it is success, finds it first)
        await _filtered(cluster, "a2", nodes=[node])
        second = asyncio.ensure_future(cluster.bind("a2", node))
        await cluster.until(lambda: bool(cluster.state._waiters.get(node)))
        assert not second.done()
        cluster.plugin_allocates("p1", node)  # the device plugin's success (no lock to delete)
        assert await asyncio.wait_for(second, 5) == ""
        assert KEYS.node_lock not in cluster.node(node)["metadata"].get("annotations", {})
        await cluster.synced()
        pending = [
            p["metadata"]["name"]
            for p in cluster.store.list("pods").items
            if p["metadata"]["annotations"].get(KEYS.bind_phase) == "allocating"
        ]
        assert pending == ["a2"]  # never two pods allocating on one node: the plugin can tell which
    finally:
        await cluster.stop()


async def test_contended_mode_binds_lock_less_beside_a_pod_that_has_not_started() -> None:
    """A pod past Allocate whose containers are still starting (an image pull) is not handed
    over any more: the next pod is bound without the lock, and kube-vgpu's device plugin, which
    takes only ``allocating`` pods, finds it. (HAMi's v2.x search would take the starting pod,
    first in LIST order: this mode is for kube-vgpu's plugin, docs/scheduler.md.)"""
    cluster = await _contended("node-a")
    try:
        await _filtered(cluster, "p1")
        assert await cluster.bind("p1", "node-a") == ""
        cluster.plugin_allocates("p1", "node-a")  # success; its containers still starting
        await cluster.synced()
        assert "node-a" not in cluster.state.busy_nodes()
        await _filtered(cluster, "p2", nodes=["node-a"])
        assert await cluster.bind("p2", "node-a") == ""
        assert KEYS.node_lock not in cluster.node("node-a")["metadata"].get("annotations", {})
        on_node = [p for p in cluster.store.list("pods").items if p["spec"].get("nodeName") == "node-a"]
        picked = allocation.oldest_pending(on_node, node="node-a", keys=KEYS)
        assert picked is not None and picked["metadata"]["name"] == "p2"
    finally:
        await cluster.stop()


async def _stuck_allocating(cluster: Cluster, node: str, name: str = "stuck") -> None:
    """A pod bound to ``node`` an hour ago, as the scheduler binds, still waiting for its Allocate
    (kubelet was down)."""
    stuck = cluster.add_pod(name, gpu_container(mem=1000))
    old = str(int(cluster.clock.now - 3600))
    devices = f"GPU-{node}-1,NVIDIA,1000,0:;"
    notes = {
        KEYS.assigned_node: node,
        KEYS.assigned_time: old,
        KEYS.devices_to_allocate: devices,
        KEYS.devices_allocated: devices,
        KEYS.bind_phase: "allocating",
        KEYS.bind_time: old,
    }
    cluster.store.bind("default", name, node=node, uid=stuck["metadata"]["uid"], annotations=notes)
    assert cluster.pod(name)["status"]["phase"] == "Pending"
    await cluster.synced()


async def test_contended_mode_waits_for_an_overdue_hand_off_and_for_a_lock_that_is_there() -> None:
    """A pod still waiting for its Allocate holds its node however long it has waited: its Allocate
    may yet come, and the device plugin must then find it, not a pod bound beside it (with or
    without a lock naming the newcomer, which would hand the newcomer's GPUs to it)."""
    cluster = await _contended("node-a", "node-b")
    try:
        await _stuck_allocating(cluster, "node-a")
        node = await _filtered(cluster, "p1", nodes=["node-a"])
        first = asyncio.ensure_future(cluster.bind("p1", node))
        await cluster.until(lambda: bool(cluster.state._waiters.get("node-a")))
        assert not first.done()
        cluster.plugin_allocates("stuck", "node-a")  # kubelet is back: the stuck pod is allocated
        assert await asyncio.wait_for(first, 5) == ""
        assert KEYS.node_lock not in cluster.node("node-a")["metadata"].get("annotations", {})
        # node-b: a lock is already there (HAMi's scheduler, or an upgrade): wait for it like HAMi
        stamp = annotations.format_rfc3339(cluster.clock.wall())
        cluster.store.patch(
            "nodes", "node-b", {"metadata": {"annotations": {KEYS.node_lock: f"{stamp},default,other"}}}
        )
        cluster.add_pod("other", gpu_container(mem=1000))
        await cluster.synced()
        node = await _filtered(cluster, "p2", nodes=["node-b"])
        second = asyncio.ensure_future(cluster.bind("p2", node))
        await cluster.until(lambda: bool(cluster.state._waiters.get("node-b")))
        assert not second.done()
        cluster.store.patch("nodes", "node-b", {"metadata": {"annotations": {KEYS.node_lock: None}}})
        assert await asyncio.wait_for(second, 5) == ""
        lock = annotations.decode_node_lock(cluster.node("node-b")["metadata"]["annotations"][KEYS.node_lock])
        assert lock.held_by("default", "p2")
    finally:
        await cluster.stop()


async def test_an_expired_lock_is_kept_while_its_holder_waits_for_its_allocate_on_the_node() -> None:
    """HAMi takes over any lock past its expiry; if the holder is bound there and its Allocate has
    not come yet (kubelet was down), its device plugin then reads a lock naming the newcomer and
    serves it the newcomer's GPUs (HAMi issue #3096). The lock is kept until the holder is
    allocated, fails or goes; a holder that was never bound there loses it at expiry as before
    (test_expired_lock_is_stolen_and_fresh_one_times_out)."""
    cluster = Cluster()
    cluster.add_node("node-a")
    await cluster.start()
    try:
        await _stuck_allocating(cluster, "node-a")
        old = annotations.format_rfc3339(cluster.clock.wall() - datetime.timedelta(hours=1))
        cluster.store.patch(
            "nodes", "node-a", {"metadata": {"annotations": {KEYS.node_lock: f"{old},default,stuck"}}}
        )
        await cluster.synced()
        node = await _filtered(cluster, "p1", nodes=["node-a"])
        bind = asyncio.ensure_future(cluster.bind("p1", node))
        await cluster.until(lambda: bool(cluster.state._waiters.get("node-a")))
        assert not bind.done()
        assert cluster.node("node-a")["metadata"]["annotations"][KEYS.node_lock].endswith(",default,stuck")
        cluster.plugin_allocates("stuck", "node-a")
        assert await asyncio.wait_for(bind, 5) == ""
        lock = annotations.decode_node_lock(cluster.node("node-a")["metadata"]["annotations"][KEYS.node_lock])
        assert lock.held_by("default", "p1")
    finally:
        await cluster.stop()


async def test_contended_mode_releases_the_claim_when_the_binding_fails() -> None:
    cluster = await _contended("node-a", "node-b")
    try:
        node = await _filtered(cluster, "p1", nodes=["node-a"])
        cluster.store.bind("default", "p1", node="node-b")  # bound elsewhere meanwhile: ours fails
        assert "failed" in await cluster.bind("p1", node)
        assert node not in cluster.state.handoffs.nodes()
        assert KEYS.node_lock not in cluster.node(node)["metadata"].get("annotations", {})
    finally:
        await cluster.stop()


async def test_contended_mode_holds_the_node_in_memory_while_a_bind_takes_the_lock() -> None:
    """A bind that must take the annotation (a lock is on the node) claims the node in memory
    first: another bind of this process then waits for it instead of going lock-less beside it
    while the watch has not shown the new lock yet."""
    cluster = await _contended("node-a")
    try:
        stamp = annotations.format_rfc3339(cluster.clock.wall())
        cluster.store.patch(
            "nodes", "node-a", {"metadata": {"annotations": {KEYS.node_lock: f"{stamp},default,other"}}}
        )
        cluster.add_pod("other", gpu_container(mem=1000))
        await cluster.synced()
        node = await _filtered(cluster, "p1", nodes=["node-a"])
        uid = cluster.pod("p1")["metadata"]["uid"]
        first = asyncio.ensure_future(cluster.bind("p1", node))
        await cluster.until(lambda: bool(cluster.state._waiters.get("node-a")))  # waiting for the lock
        assert cluster.state.handoffs.others(
            "node-a", "someone-else", now=cluster.clock.now, claim_timeout_s=60
        ) == [uid]
        cluster.store.patch("nodes", "node-a", {"metadata": {"annotations": {KEYS.node_lock: None}}})
        assert await asyncio.wait_for(first, 5) == ""
        lock = annotations.decode_node_lock(cluster.node("node-a")["metadata"]["annotations"][KEYS.node_lock])
        assert lock.held_by("default", "p1")
    finally:
        await cluster.stop()


class _HeldBindings(LocalKubeApi):
    """The API for a scheduler whose Binding POSTs wait for ``gate`` (a slow API server)."""

    def __init__(self, cluster: Cluster) -> None:
        super().__init__(cluster.store, clock=cluster.clock.wall)
        self.gate = asyncio.Event()
        self.arrived = asyncio.Event()

    async def bind_pod(self, *args: Any, **kwargs: Any) -> None:
        self.arrived.set()
        await self.gate.wait()
        await super().bind_pod(*args, **kwargs)


def _binds(cluster: Cluster, outcome: str) -> float:
    assert cluster.service is not None
    registry = cluster.service.services.metrics.registry
    return (
        registry.get_sample_value("vgpu_scheduler_bind_duration_seconds_count", {"outcome": outcome}) or 0.0
    )


async def _hang_up(call: asyncio.Future[str]) -> None:
    """kube-scheduler stops waiting (its httpTimeout, or its process ends): the connection closes."""
    call.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await call


@pytest.mark.parametrize("mode", [NodeLock.ALWAYS, NodeLock.CONTENDED], ids=["always", "contended"])
async def test_a_bind_kube_scheduler_stops_waiting_for_is_rolled_back_and_never_binds_later(
    mode: NodeLock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kube-scheduler gives a bind ``httpTimeout`` and then schedules the pod again (or, at a
    leader hand-over, its successor does). A bind still waiting for its node when kube-scheduler
    hangs up must give back what it took, not bind the pod on the old decision later, when the
    node frees up: that decision's share is no longer reserved, and the next bind of the pod races it.
    To kube-scheduler the bind failed, so the pod is nudged after its back-off as after a failure
    (v1.20 may park it)."""
    monkeypatch.setattr(retries, "BIND_RETRY_INITIAL_S", 0.01)
    cluster = Cluster(Config(scheduler=SchedulerConfig(node_lock=mode)))
    cluster.add_node("node-a")
    await cluster.start()
    try:
        node = await _filtered(cluster, "p1")
        uid = cluster.pod("p1")["metadata"]["uid"]
        holder = "holder"  # a pod being handed its GPUs on the node: the bind of p1 must wait
        cluster.add_pod(holder, gpu_container(mem=1000), annotations={KEYS.bind_phase: "allocating"})
        cluster.store.bind("default", holder, node=node)
        stamp = annotations.format_rfc3339(cluster.clock.wall())
        cluster.store.patch(
            "nodes", node, {"metadata": {"annotations": {KEYS.node_lock: f"{stamp},default,holder"}}}
        )
        await cluster.synced()
        call = asyncio.ensure_future(cluster.bind("p1", node))
        await cluster.until(lambda: bool(cluster.state._waiters.get(node)))  # waiting on the node
        await _hang_up(call)
        await cluster.until(lambda: _binds(cluster, "abandoned") == 1)
        assert cluster.state.decision(uid) is None  # the reservation is given back
        assert uid not in cluster.state.handoffs.others(
            node, "another", now=cluster.clock.now, claim_timeout_s=60
        )
        await cluster.service.events.drain()
        (failed,) = cluster.events("BindingFailed")
        assert "abandoned before its Binding" in failed["message"]
        # the node frees up: nothing is left that could bind p1 now
        cluster.plugin_allocates(holder, node)
        await cluster.synced()
        assert not cluster.service.services.binder._tasks
        assert "nodeName" not in cluster.pod("p1")["spec"]
        assert KEYS.assigned_node not in (cluster.pod("p1")["metadata"].get("annotations") or {})
        assert _binds(cluster, "bound") == 0
        await cluster.service.retries.flush()
        assert retries.RETRY_ANNOTATION in cluster.pod("p1")["metadata"]["annotations"]
    finally:
        await cluster.stop()


async def test_a_binding_already_sent_when_kube_scheduler_hangs_up_is_seen_through(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Once the Binding is on its way it may take effect: the bind is not rolled back under it (the
    lock stays with the pod for its device plugin, the share stays charged), and the bound pod is
    not nudged."""
    monkeypatch.setattr(retries, "BIND_RETRY_INITIAL_S", 0.01)
    cluster = Cluster()
    api = _HeldBindings(cluster)
    cluster.api = api
    cluster.add_node("node-a")
    await cluster.start()
    try:
        node = await _filtered(cluster, "p1")
        devices = cluster.decision("p1")
        call = asyncio.ensure_future(cluster.bind("p1", node))
        await api.arrived.wait()  # the Binding is sent, its answer held
        await _hang_up(call)
        api.gate.set()
        await cluster.until(lambda: _binds(cluster, "abandoned") == 1)
        pod = cluster.pod("p1")
        assert pod["spec"]["nodeName"] == node
        assert pod["metadata"]["annotations"][KEYS.devices_allocated] == devices
        lock = annotations.decode_node_lock(cluster.node(node)["metadata"]["annotations"][KEYS.node_lock])
        assert lock.held_by("default", "p1")
        await cluster.synced()
        assert cluster.decision("p1") == devices
        await cluster.service.events.drain()
        assert not cluster.events("BindingFailed")
        assert len(cluster.events("BindingSucceed")) == 1
        await cluster.service.retries.flush()
        assert retries.RETRY_ANNOTATION not in cluster.pod("p1")["metadata"]["annotations"]
    finally:
        await cluster.stop()


def _bound_behind_our_back(cluster: Cluster, name: str, node: str, devices: str) -> None:
    """A GPU pod bound by someone else (a second scheduler, or the old leader at a hand-over): the
    decision travels in its Binding, which this scheduler only sees through its pod watch."""
    cluster.add_pod(name, gpu_container(mem=9000))
    stamp = str(int(cluster.clock.now))
    notes = {
        KEYS.assigned_node: node,
        KEYS.assigned_time: stamp,
        KEYS.devices_to_allocate: devices,
        KEYS.devices_allocated: devices,
        KEYS.bind_phase: "allocating",
        KEYS.bind_time: stamp,
    }
    cluster.store.bind("default", name, node=node, annotations=notes)


async def test_a_bind_fits_the_pod_again_when_its_gpus_were_taken_behind_the_schedulers_back(
    cluster: Cluster,
) -> None:
    """The filter's reservation counts only what this scheduler knows. A pod bound meanwhile by
    another binder onto the same GPU would overcommit it if the bind went ahead on the old decision:
    the bind checks the GPUs it is about to hand out and fits the pod again on the node's usage
    now, or refuses it."""
    node = await _filtered(cluster, "p1", mem=9000, nodes=["node-a"])
    first = cluster.decision("p1")
    assert first is not None
    gpu = first.split(",")[0]
    _bound_behind_our_back(cluster, "rogue", node, f"{gpu},NVIDIA,9000,0:;")
    await cluster.synced()
    assert await cluster.bind("p1", node) == ""
    devices = cluster.pod("p1")["metadata"]["annotations"][KEYS.devices_allocated]
    assert not devices.startswith(gpu) and devices.endswith(",NVIDIA,9000,0:;")
    await cluster.synced()
    for used in cluster.state.used(node).values():
        assert used.memory_mib <= 16000
    # both GPUs taken behind its back: refused, with the reason, and nothing left held
    cluster.plugin_allocates("p1", node)
    await _filtered(cluster, "p2", mem=7000, nodes=["node-a"])
    _bound_behind_our_back(
        cluster, "rogue2", node, f"GPU-{node}-0,NVIDIA,7000,0:GPU-{node}-1,NVIDIA,7000,0:;"
    )
    await cluster.synced()
    error = await cluster.bind("p2", node)
    assert "the one held lost its GPUs" in error and "no longer fits there" in error, error
    assert "nodeName" not in cluster.pod("p2")["spec"]
    assert cluster.decision("p2") is None


async def test_a_bind_fits_the_pod_again_when_its_gpu_turned_unhealthy_after_the_filter(
    cluster: Cluster,
) -> None:
    """The device plugin reports a GPU unhealthy between the filter and the bind: the pod is not
    handed a broken GPU but fitted again on the node's healthy ones."""
    node = await _filtered(cluster, "p1", nodes=["node-a"])
    held = cluster.decision("p1")
    assert held is not None
    broken = held.split(",")[0]
    report = [dataclasses.replace(g, health=g.uuid != broken) for g in gpus(node)]
    cluster.store.patch(
        "nodes",
        node,
        {"metadata": {"annotations": {KEYS.node_register: annotations.encode_node_register(report)}}},
    )
    await cluster.synced()
    assert await cluster.bind("p1", node) == ""
    devices = cluster.pod("p1")["metadata"]["annotations"][KEYS.devices_allocated]
    assert devices.split(",")[0] != broken


class _CountingApi(LocalKubeApi):
    """The local API, counting the node PATCHes and GETs (the lock's writes and re-reads)."""

    node_patches = 0
    node_gets = 0

    async def merge_patch(self, kind: str, name: str, patch: Any, **kw: Any) -> Any:
        if kind == "nodes":
            self.node_patches += 1
        return await super().merge_patch(kind, name, patch, **kw)

    async def get(self, kind: str, name: str, **kw: Any) -> Any:
        if kind == "nodes":
            self.node_gets += 1
        return await super().get(kind, name, **kw)


async def test_binds_waiting_for_one_nodes_lock_take_it_in_turn_with_one_write_each() -> None:
    """Six binds wait for node-a's lock (held by a pod whose Allocate is under way). Each time the
    device plugin releases it, only the next in line tries to take it: one PATCH per bind, and no
    Conflict to re-read after (all six racing for each release would make it 21 PATCHes)."""
    c = Cluster()
    c.api = api = _CountingApi(c.store, clock=c.clock.wall)
    c.add_node("node-a")
    await c.start()
    try:
        names = [f"p{i}" for i in range(6)]
        for name in names:
            assert await _filtered(c, name) == "node-a"
        await _locked_by_a_live_holder(c, "node-a")
        binder = c.service.services.binder if c.service else None
        assert binder is not None
        patches_before = api.node_patches
        binds = [asyncio.create_task(c.bind(name, "node-a")) for name in names]
        await c.until(lambda: binder.locks.waiting("node-a") == 6)
        holder = "holder"
        for _ in names:  # the device plugin: Allocate for the pod holding the lock, which it releases
            c.plugin_allocates(holder, "node-a")

            def taken_by_next(previous: str = holder) -> bool:
                raw = c.node("node-a")["metadata"]["annotations"].get(KEYS.node_lock)
                return bool(raw) and not annotations.decode_node_lock(raw).held_by("default", previous)

            await c.until(taken_by_next)
            holder = annotations.decode_node_lock(
                c.node("node-a")["metadata"]["annotations"][KEYS.node_lock]
            ).pod
        assert await asyncio.gather(*binds) == [""] * 6
        assert api.node_patches - patches_before == 6 and api.node_gets == 0
        assert binder.locks.waiting("node-a") == 0
    finally:
        await c.stop()


async def test_a_bind_in_line_for_a_lock_gives_up_at_its_deadline_and_leaves_the_line() -> None:
    c = Cluster(Config(scheduler=SchedulerConfig(bind_lock_wait_s=0.2)))
    c.add_node("node-a")
    await c.start()
    try:
        for name in ("first", "second"):
            assert await _filtered(c, name) == "node-a"
        await _locked_by_a_live_holder(c, "node-a")
        errors_seen = await asyncio.gather(c.bind("first", "node-a"), c.bind("second", "node-a"))
        assert all("waited 0.2 s" in e and "node-a" in e for e in errors_seen), errors_seen
        assert c.service is not None and c.service.services.binder.locks.waiting("node-a") == 0
        assert c.node("node-a")["metadata"]["annotations"][KEYS.node_lock].endswith(",default,holder")
    finally:
        await c.stop()
