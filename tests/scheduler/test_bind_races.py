"""A decision that changes under a bind: it expired while the bind waited, a Binding of an earlier
try landed after a re-filter, a pod bound behind the scheduler's back took the GPU exclusively or
memory used outside kube-vgpu grew. None of them may leave a GPU overcommitted."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from vgpu.core import annotations, errors
from vgpu.core.config import Config, NodeLock, SchedulerConfig
from vgpu.core.device import GpuUuid
from vgpu.localcluster.client import LocalKubeApi

from tests.scheduler.scenario import Cluster, gpu_container, gpus
from tests.scheduler.test_bind import _bound_behind_our_back, _hang_up, _HeldBindings, _stuck_allocating

KEYS = annotations.KEYS
GPU_MIB = 16000  # gpus()' default memory per GPU


class _RefusedBindings(_HeldBindings):
    """The API for a scheduler whose Binding POSTs wait for ``gate``, then are refused (409)."""

    async def bind_pod(self, *args: Any, **kwargs: Any) -> None:
        self.arrived.set()
        await self.gate.wait()
        raise errors.Conflict("the Binding was refused", status=409)


def _memory_on(cluster: Cluster, node: str, gpu: str) -> int:
    used = cluster.state.used(node).get(GpuUuid(gpu))
    return 0 if used is None else used.memory_mib


async def test_a_decision_that_expired_while_its_bind_waited_is_not_bound_on() -> None:
    """``nodeLock: contended``: the bind waits for the pod being handed its GPUs on the node. Its
    decision's TTL runs out meanwhile and the next filter gives the GPU to another pod. When the
    node is free the bind must not go ahead on the old decision: it fits the pod again on the
    usage now, and here nothing fits."""
    cluster = Cluster(Config(scheduler=SchedulerConfig(node_lock=NodeLock.CONTENDED)))
    cluster.add_node("node-a", gpus("node-a", n=2))
    await cluster.start()
    try:
        await _stuck_allocating(cluster, "node-a")  # 1,000 MiB of GPU-node-a-1, still allocating
        cluster.add_pod("p1", gpu_container(mem=GPU_MIB))
        await cluster.synced()
        assert (await cluster.filter("p1"))["NodeNames"] == ["node-a"]
        assert cluster.decision("p1") == f"GPU-node-a-0,NVIDIA,{GPU_MIB},0:;"
        bind = asyncio.ensure_future(cluster.bind("p1", "node-a"))
        await cluster.until(lambda: "node-a" in cluster.state._waiters)  # the bind waits for the node
        cluster.clock.now += 61  # the reservation's TTL (60 s) passes
        cluster.renew_lease("node-a")
        cluster.add_pod("p2", gpu_container(mem=GPU_MIB))
        await cluster.synced()
        assert (await cluster.filter("p2"))["NodeNames"] == ["node-a"]
        assert cluster.decision("p1") is None  # expired: its share went to p2
        assert cluster.decision("p2") == f"GPU-node-a-0,NVIDIA,{GPU_MIB},0:;"
        cluster.plugin_allocates("stuck", "node-a")  # the node is free: the bind goes on
        failure = await asyncio.wait_for(bind, 10)
        assert "no longer fits" in failure and "dropped while the bind waited" in failure
        await cluster.synced()
        assert cluster.pod("p1")["spec"].get("nodeName") is None
        assert _memory_on(cluster, "node-a", "GPU-node-a-0") == GPU_MIB  # p2's reservation only
        assert cluster.decision("p2") == f"GPU-node-a-0,NVIDIA,{GPU_MIB},0:;"  # the roll-back kept it
    finally:
        await cluster.stop()


async def test_a_pod_whose_binding_is_on_its_way_is_not_placed_again_and_keeps_its_share() -> None:
    """kube-scheduler hangs up on a bind whose Binding is already on its way (it is seen through)
    and filters the pod again. The Binding may land at any moment, so the pod is not placed
    elsewhere meanwhile, its share is neither expired nor given to another pod, and once it lands
    the pod holds what it was bound with; neither a filter nor a bind of the pod again lets go of it."""
    cluster = Cluster()
    api = _HeldBindings(cluster)
    cluster.api = api
    cluster.add_node("node-a", gpus("node-a", n=1))
    cluster.add_node("node-b", gpus("node-b", n=1))
    await cluster.start()
    try:
        cluster.add_pod("p1", gpu_container(mem=GPU_MIB))
        await cluster.synced()
        assert (await cluster.filter("p1", nodes=["node-a"]))["NodeNames"] == ["node-a"]
        call = asyncio.ensure_future(cluster.bind("p1", "node-a"))
        await api.arrived.wait()  # the Binding is sent; the API server is slow to answer
        await _hang_up(call)
        body = await cluster.filter("p1", nodes=["node-b"])
        assert body["Error"] == "pod default/p1 has a Binding to node node-a on its way"
        assert _memory_on(cluster, "node-b", "GPU-node-b-0") == 0
        cluster.clock.now += 61  # the reservation's TTL (60 s) passes while the Binding is out
        cluster.renew_lease("node-a")
        assert cluster.state.expire() == 0
        cluster.add_pod("p2", gpu_container(mem=GPU_MIB))
        await cluster.synced()
        body = await cluster.filter("p2", nodes=["node-a"])
        assert body["NodeNames"] == [] and "no GPU with" in body["FailedNodes"]["node-a"]
        api.gate.set()  # the Binding lands
        await cluster.until(lambda: cluster.pod("p1")["spec"].get("nodeName") == "node-a")
        await cluster.synced()
        assert _memory_on(cluster, "node-a", "GPU-node-a-0") == GPU_MIB
        body = await cluster.filter("p1", nodes=["node-b"])  # kube-scheduler's cache lags: again
        assert body["Error"] == "pod default/p1 is already bound to node node-a"
        failure = await cluster.bind("p1", "node-b")
        assert "already bound to node node-a" in failure
        assert _memory_on(cluster, "node-a", "GPU-node-a-0") == GPU_MIB
        body = await cluster.filter("p2", nodes=["node-a"])
        assert body["NodeNames"] == [] and "no GPU with" in body["FailedNodes"]["node-a"]
    finally:
        await cluster.stop()


async def test_a_binding_refused_after_its_ttl_gives_the_share_back() -> None:
    """The other outcome: the Binding that kept the decision from expiring is refused; the bind's
    roll-back gives its share back, and the pod can be placed again."""
    cluster = Cluster()
    api = _RefusedBindings(cluster)
    cluster.api = api
    cluster.add_node("node-a", gpus("node-a", n=1))
    await cluster.start()
    try:
        cluster.add_pod("p1", gpu_container(mem=GPU_MIB))
        await cluster.synced()
        assert (await cluster.filter("p1"))["NodeNames"] == ["node-a"]
        call = asyncio.ensure_future(cluster.bind("p1", "node-a"))
        await api.arrived.wait()
        cluster.clock.now += 61
        cluster.renew_lease("node-a")
        assert cluster.state.expire() == 0
        assert _memory_on(cluster, "node-a", "GPU-node-a-0") == GPU_MIB
        api.gate.set()
        failure = await asyncio.wait_for(call, 10)
        assert "refused" in failure
        assert _memory_on(cluster, "node-a", "GPU-node-a-0") == 0
        assert (await cluster.filter("p1"))["NodeNames"] == ["node-a"]
    finally:
        await cluster.stop()


async def test_a_pod_bound_behind_the_schedulers_back_holds_what_it_was_bound_with() -> None:
    """A Binding this scheduler did not send (the old leader's, at a hand-over) lands for a pod it
    holds another decision for: the pod runs where it was bound, so that is what it holds."""
    cluster = Cluster()
    cluster.add_node("node-a", gpus("node-a", n=1))
    cluster.add_node("node-b", gpus("node-b", n=1))
    await cluster.start()
    try:
        _bound_behind_our_back(cluster, "p1", "node-a", "GPU-node-a-0,NVIDIA,9000,0:;")
        pod = cluster.pod("p1")
        await cluster.synced()
        assert (await cluster.filter("p1", nodes=["node-b"]))["Error"] == (
            "pod default/p1 is already bound to node node-a"
        )
        assert _memory_on(cluster, "node-a", "GPU-node-a-0") == 9000
        assert _memory_on(cluster, "node-b", "GPU-node-b-0") == 0
        assert pod["spec"]["nodeName"] == "node-a"
    finally:
        await cluster.stop()


async def test_a_bind_refuses_a_gpu_a_pod_bound_behind_its_back_uses_exclusively() -> None:
    """Exclusive use (cores 100) is a rule of the filter's that totals do not show: a pod bound by
    someone else onto the GPU with no cores, beside one holding it whole, sums to 100 cores."""
    cluster = Cluster()
    cluster.add_node("node-a", gpus("node-a", n=1))
    await cluster.start()
    try:
        cluster.add_pod("p1", gpu_container(mem=1000, cores=100))
        await cluster.synced()
        assert (await cluster.filter("p1"))["NodeNames"] == ["node-a"]
        _bound_behind_our_back(cluster, "rogue", "node-a", "GPU-node-a-0,NVIDIA,9000,0:;")
        await cluster.synced()
        failure = await cluster.bind("p1", "node-a")
        assert "exclusive use" in failure
        await cluster.synced()
        assert cluster.pod("p1")["spec"].get("nodeName") is None
        assert cluster.state.used("node-a")[GpuUuid("GPU-node-a-0")].slots == 1  # the rogue only
    finally:
        await cluster.stop()


async def test_a_bind_refuses_memory_taken_outside_kube_vgpu_since_its_filter() -> None:
    cluster = Cluster()
    cluster.add_node("node-a", gpus("node-a", n=1))
    await cluster.start()
    try:
        cluster.add_pod("p1", gpu_container(mem=10000))
        await cluster.synced()
        assert (await cluster.filter("p1"))["NodeNames"] == ["node-a"]
        outside = {KEYS.node_outside_usage: '{"GPU-node-a-0":8000}'}
        cluster.store.patch("nodes", "node-a", {"metadata": {"annotations": outside}})
        await cluster.synced()
        failure = await cluster.bind("p1", "node-a")
        assert "8000 MiB used outside kube-vgpu" in failure
        assert cluster.pod("p1")["spec"].get("nodeName") is None
    finally:
        await cluster.stop()


WATCH_HISTORY = 5  # events the store keeps for resuming watches


class _PodsWatchDown(LocalKubeApi):
    """A LocalKubeApi whose pods watch fails (a broken connection) while ``down``."""

    down = False

    async def watch(self, kind: Any, **kwargs: Any) -> AsyncIterator[Any]:  # type: ignore[override]
        if kind == "pods" and self.down:
            raise errors.KubeError("watch pods: connection refused", status=0)
            yield  # pragma: no cover
        async for event in super().watch(kind, **kwargs):
            if kind == "pods" and self.down:
                raise errors.KubeError("watch pods: connection reset", status=0)
            yield event


async def test_a_pod_bound_and_deleted_while_the_pods_watch_was_down_gives_its_share_back() -> None:
    """The pods watch is down while a GPU job is filtered, bound (its Binding marked as on its way),
    run and deleted; the gap ends in 410 Gone, and the re-list never shows the pod (a re-list
    reports deletions only of pods the cache held). No event would ever settle its decision: the
    list, asked for after its Binding was sent and without the pod, must."""
    cluster = Cluster(history_size=WATCH_HISTORY)
    api = _PodsWatchDown(cluster.store, clock=cluster.clock.wall)
    cluster.api = api
    cluster.add_node("node-a", gpus("node-a", n=1))
    await cluster.start()
    try:
        await cluster.synced()
        pods = next(i for i in cluster.service.informers if i.kind == "pods")
        relists = pods.relists
        api.down = True
        cluster.store.close_watchers()
        await cluster.until(lambda: pods.resource_version and cluster.store.watcher_count < 5)
        # kube-scheduler (its own watch fine) filters and binds a job pod; it runs and is deleted
        cluster.add_pod("job", gpu_container(mem=16000))
        assert (await cluster.filter("job"))["NodeNames"] == ["node-a"]
        assert await cluster.bind("job", "node-a") == ""
        cluster.plugin_allocates("job", "node-a")
        cluster.store.delete("pods", "job", namespace="default")
        for i in range(WATCH_HISTORY + 1):  # the API server's watch history no longer covers the gap
            cluster.store.create(
                "events", {"metadata": {"name": f"f-{i}"}, "reason": "F"}, namespace="default"
            )
        api.down = False
        await cluster.until(lambda: pods.relists > relists, timeout_s=15)
        await cluster.synced()
        cluster.clock.now += 3600  # an hour later: any decision's TTL long gone
        cluster.renew_lease("node-a")
        await cluster.synced()
        cluster.state.expire()
        assert cluster.store.list("pods").items == []
        # the pod is gone from the cluster: its GPU must be free again
        assert dict(cluster.state.used("node-a")) == {}
        cluster.add_pod("next", gpu_container(mem=16000))
        await cluster.synced()
        assert (await cluster.filter("next"))["NodeNames"] == ["node-a"]
    finally:
        await cluster.stop()
