"""/bind through real HTTP: lock, phase, Binding; contention waits; stale locks; rollback."""

from __future__ import annotations

import asyncio

from vgpu.core import annotations

from tests.scheduler.scenario import Cluster, gpu_container

KEYS = annotations.KEYS


async def _filtered(cluster: Cluster, name: str, mem: int = 1000) -> str:
    cluster.add_pod(name, gpu_container(mem=mem))
    await cluster.synced()
    body = await cluster.filter(name)
    (node,) = body["NodeNames"]
    await cluster.synced()
    return node


def _plugin_allocates(cluster: Cluster, pod: str, node: str) -> None:
    """What the device plugin does after Allocate: bind phase success, lock deleted."""
    cluster.store.patch(
        "pods", pod, {"metadata": {"annotations": {KEYS.bind_phase: "success"}}}, namespace="default"
    )
    cluster.store.patch("nodes", node, {"metadata": {"annotations": {KEYS.node_lock: None}}})


async def test_bind_takes_lock_sets_phase_and_binds(cluster: Cluster) -> None:
    node = await _filtered(cluster, "p1")
    assert await cluster.bind("p1", node) == ""
    pod = cluster.pod("p1")
    assert pod["spec"]["nodeName"] == node
    assert pod["metadata"]["annotations"][KEYS.bind_phase] == "allocating"
    assert pod["metadata"]["annotations"][KEYS.bind_time] == str(int(cluster.clock.now))
    lock = annotations.decode_node_lock(cluster.node(node)["metadata"]["annotations"][KEYS.node_lock])
    assert lock.held_by("default", "p1")
    await cluster.service.events.drain()
    assert [e["message"] for e in cluster.events("BindingSucceed")] == [
        f"Successfully binding node [{node}] to default/p1"
    ]


async def test_second_bind_waits_for_the_lock_then_succeeds(cluster: Cluster) -> None:
    node = await _filtered(cluster, "p1")
    node2 = await _filtered(cluster, "p2")
    assert node == node2
    assert await cluster.bind("p1", node) == ""
    await cluster.synced()
    second = asyncio.ensure_future(cluster.bind("p2", node))
    await cluster.until(lambda: bool(cluster.state._waiters.get(node)))  # the bind is waiting on the node
    assert not second.done()
    _plugin_allocates(cluster, "p1", node)
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
    assert await cluster.bind("p1", node) == ""
    del holder


async def test_bind_failure_rolls_everything_back() -> None:
    c = Cluster()
    c.add_node("node-a")
    c.config = c.config
    await c.start()
    try:
        node = await _filtered(c, "p1", mem=5000)
        # the pod is bound elsewhere meanwhile: the Binding call answers Conflict
        c.store.bind("default", "p1", node="other")
        await c.synced()
        error = await c.bind("p1", node)
        assert "binding pod default/p1 to node node-a failed" in error
        ann = c.pod("p1")["metadata"].get("annotations", {})
        assert (
            KEYS.assigned_node not in ann and KEYS.devices_allocated not in ann and KEYS.bind_phase not in ann
        )
        assert KEYS.assigned_node not in c.pod("p1")["metadata"].get("labels", {})
        assert KEYS.node_lock not in c.node(node)["metadata"].get("annotations", {})
        await c.synced()
        assert c.state.used(node) == {}
        await c.service.events.drain()
        assert len(c.events("BindingFailed")) == 1
    finally:
        await c.stop()


async def test_bind_for_a_node_the_filter_did_not_choose_is_refused(cluster: Cluster) -> None:
    node = await _filtered(cluster, "p1")
    other = "node-b" if node == "node-a" else "node-a"
    error = await cluster.bind("p1", other)
    assert "was not filtered for node" in error
    assert "nodeName" not in cluster.pod("p1")["spec"]


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
