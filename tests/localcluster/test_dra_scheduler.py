"""kube-scheduler's DynamicResources plugin, emulated in the local cluster: pods with claims from
templates are allocated consumable GPU capacity, bound, and refused with the real wording."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from vgpu.core import errors
from vgpu.core.dra import allocation, names
from vgpu.localcluster import dynamicresources, schedqueue
from vgpu.localcluster.client import LocalKubeApi
from vgpu.localcluster.scheduler import SchedulerEmulator
from vgpu.localcluster.store import Store

from tests.localcluster import draobjects as dra
from tests.localcluster.conftest import make_node, wait_event, wait_for


async def _cluster(local_cluster: Callable[..., Any], *, gpus: dict[str, int]) -> Any:
    cluster = await local_cluster(
        {"nodes": [{"name": n} for n in gpus]},
        scheduler_name="default-scheduler",
        scheduler_initial_backoff_s=0.05,
    )
    cluster.store.create("deviceclasses", dra.device_class())
    for node, count in gpus.items():
        cluster.store.create(
            "resourceslices", dra.resource_slice(node, [dra.gpu(i, memory_mib=16384) for i in range(count)])
        )
    return cluster


async def _failed(cluster: Any, pod: str, *, containing: str, timeout_s: float = 10.0) -> str:
    """The message of the first FailedScheduling event of ``pod`` that contains ``containing``."""

    def wanted(e: dict[str, Any]) -> bool:
        return (
            e["involvedObject"]["name"] == pod
            and e["reason"] == "FailedScheduling"
            and containing in e["message"]
        )

    async with asyncio.timeout(timeout_s):
        listed = await cluster.api.list("events", namespace="default")
        for e in listed.items:
            if wanted(e):
                return str(e["message"])
        async for event in cluster.api.watch(
            "events", resource_version=listed.resource_version, namespace="default"
        ):
            if wanted(event.object):
                return str(event.object["message"])
    raise AssertionError(f"no FailedScheduling with {containing!r} for {pod}")


def _claims_of(cluster: Any, pod: dict[str, Any]) -> list[dict[str, Any]]:
    names_ = [s["resourceClaimName"] for s in pod["status"]["resourceClaimStatuses"]]
    return [cluster.store.get("resourceclaims", n, namespace="default") for n in names_]


async def test_dra_pods_are_allocated_reserved_and_bound_without_overcommit(
    local_cluster: Callable[..., Any],
) -> None:
    cluster = await _cluster(local_cluster, gpus={"n1": 1, "n2": 1})
    cluster.store.create(
        "resourceclaimtemplates",
        dra.template("half", dra.gpu_request(memory_mib=8192, cores=50)),
        namespace="default",
    )
    for i in range(4):
        cluster.store.create("pods", dra.dra_pod(f"p{i}", "half"), namespace="default")
    bound = [
        await wait_for(cluster.api, "pods", f"p{i}", lambda p: bool(p["spec"].get("nodeName")))
        for i in range(4)
    ]
    per_gpu: dict[tuple[str, str], list[int]] = {}
    for bound_pod in bound:
        pod = await wait_for(
            cluster.api,
            "pods",
            bound_pod["metadata"]["name"],
            lambda p: bool(p["status"].get("resourceClaimStatuses")),
        )
        (claim,) = _claims_of(cluster, pod)
        assert claim["status"]["reservedFor"] == [
            {"resource": "pods", "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}
        ]
        (share,) = allocation.shares(claim)
        assert share.pool == pod["spec"]["nodeName"]  # the allocation is on the node it was bound to
        assert claim["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0][
            "values"
        ] == [share.pool]
        per_gpu.setdefault((share.pool, share.device), []).append(share.memory_mib or 0)
    assert sorted(per_gpu.values()) == [[8192, 8192], [8192, 8192]]

    # a fifth pod fits nowhere: kube-scheduler's DRA wording, no preemption help
    cluster.store.create("pods", dra.dra_pod("extra", "half"), namespace="default")
    message = await _failed(cluster, "extra", containing="cannot allocate")
    assert message == (  # the real 1.36's words (tests/realk8s/test_dra_pending_real.py)
        "0/2 nodes are available: 2 cannot allocate all claims. still not schedulable, "
        "preemption: 0/2 nodes are available: 2 Preemption is not helpful for scheduling."
    )
    # deleting a bound pod releases its claim: the waiting pod gets its share
    cluster.store.delete("pods", "p0", namespace="default")
    got = await wait_for(cluster.api, "pods", "extra", lambda p: bool(p["spec"].get("nodeName")))
    assert got["spec"]["nodeName"] == bound[0]["spec"]["nodeName"]


async def test_a_pod_without_its_claim_is_not_tried_until_the_claim_exists(
    local_cluster: Callable[..., Any],
) -> None:
    # kube-scheduler's DynamicResources PreEnqueue: no attempt, no event, no condition (1.36)
    cluster = await _cluster(local_cluster, gpus={"n1": 1})
    cluster.store.create("pods", dra.dra_pod("early", "later"), namespace="default")
    warning = await wait_event(cluster.api, "early", reason="FailedResourceClaimCreation")  # the controller's
    assert (
        'resource claim template "later": resourceclaimtemplate.resource.k8s.io "later" not found'
        in warning["message"]
    )
    queue = cluster.scheduler.queue
    async with asyncio.timeout(10):
        while True:  # the scheduler's own state: poll it
            if queue.where(("default", "early")) is schedqueue.Where.UNSCHEDULABLE:
                break
            await asyncio.sleep(0.01)
    pod = cluster.store.get("pods", "early", namespace="default")
    assert not (pod.get("status") or {}).get("conditions")
    events = cluster.store.list("events", namespace="default").items
    assert [e["reason"] for e in events if e["involvedObject"]["name"] == "early"] == [
        "FailedResourceClaimCreation"
    ]
    cluster.store.create(
        "resourceclaimtemplates", dra.template("later", dra.gpu_request(memory_mib=100)), namespace="default"
    )
    await wait_for(cluster.api, "pods", "early", lambda p: bool(p["spec"].get("nodeName")))


async def test_concurrent_pods_never_overcommit_a_gpu(local_cluster: Callable[..., Any]) -> None:
    # many pods at once: in-flight allocations count before their claims are written
    cluster = await _cluster(local_cluster, gpus={"n1": 2})
    cluster.store.create(
        "resourceclaimtemplates",
        dra.template("q", dra.gpu_request(memory_mib=4096, cores=10)),
        namespace="default",
    )
    for i in range(10):
        cluster.store.create("pods", dra.dra_pod(f"p{i}", "q"), namespace="default")
    async with asyncio.timeout(20):
        while True:
            pods = cluster.store.list("pods", namespace="default").items
            if sum(1 for p in pods if p["spec"].get("nodeName")) == 8:
                break
            await asyncio.sleep(0.02)
    claims = [
        c
        for c in cluster.store.list("resourceclaims", namespace="default").items
        if (c.get("status") or {}).get("allocation")
    ]
    memory: dict[str, int] = {}
    for claim in claims:
        for share in allocation.shares(claim):
            memory[share.device] = memory.get(share.device, 0) + (share.memory_mib or 0)
    assert memory == {"gpu-0": 16384, "gpu-1": 16384}
    unbound = [
        p["metadata"]["name"]
        for p in cluster.store.list("pods", namespace="default").items
        if not p["spec"].get("nodeName")
    ]
    assert len(unbound) == 2
    await _failed(cluster, unbound[0], containing="1 cannot allocate all claims")


async def test_a_tainted_gpu_is_not_allocated(local_cluster: Callable[..., Any]) -> None:
    cluster = await local_cluster({"nodes": [{"name": "n1"}]}, scheduler_name="default-scheduler")
    cluster.store.create("deviceclasses", dra.device_class())
    taint = {"key": names.UNHEALTHY_TAINT_KEY, "value": "true", "effect": "NoSchedule"}
    cluster.store.create("resourceslices", dra.resource_slice("n1", [dra.gpu(0, taints=[taint]), dra.gpu(1)]))
    cluster.store.create(
        "resourceclaimtemplates", dra.template("t", dra.gpu_request(memory_mib=100)), namespace="default"
    )
    cluster.store.create("pods", dra.dra_pod("p", "t"), namespace="default")
    pod = await wait_for(cluster.api, "pods", "p", lambda p: bool(p["spec"].get("nodeName")))
    (claim,) = _claims_of(cluster, pod)
    assert allocation.shares(claim)[0].device == "gpu-1"


async def test_a_nodes_pools_are_read_again_only_when_its_slices_change(
    store: Any, api: Any, status_writer: Any, running: Callable[[Any], asyncio.Task[Any]]
) -> None:
    plugin = dynamicresources.DynamicResources(api, status_writer=status_writer)
    changed = asyncio.Event()
    plugin.on_change = changed.set
    store.create("resourceslices", dra.resource_slice("n1", [dra.gpu(0)]))
    store.create("resourceslices", dra.resource_slice("n2", [dra.gpu(0)]))
    running(plugin.slices.run())
    await asyncio.wait_for(plugin.slices.synced.wait(), 10)
    first = plugin.node_pools("n1")
    assert plugin.node_pools("n1") is first  # cached: the scheduler asks for every node, every pod
    assert [d.id for pool in first for d in pool] == [(names.DRIVER, "n1", "gpu-0")]
    changed.clear()
    store.create(
        "resourceslices", {**dra.resource_slice("n2", [dra.gpu(1)]), "metadata": {"name": "other-n2"}}
    )
    await asyncio.wait_for(changed.wait(), 10)
    assert plugin.node_pools("n1") is first  # another node's slice changed
    updated = store.get("resourceslices", f"n1-{names.DRIVER}")
    updated["spec"]["devices"] = [dra.gpu(0), dra.gpu(1)]
    updated["spec"]["pool"]["generation"] = 2
    changed.clear()
    store.update("resourceslices", updated)
    await asyncio.wait_for(changed.wait(), 10)
    assert [d.id[2] for pool in plugin.node_pools("n1") for d in pool] == ["gpu-0", "gpu-1"]


class _BindFailsOnce(LocalKubeApi):
    """The local API whose first pods/binding fails (an API error in the binding cycle)."""

    def __init__(self, store: Store) -> None:
        super().__init__(store)
        self.refused: list[str] = []

    async def bind_pod(self, namespace: str, name: str, **kwargs: Any) -> None:
        if not self.refused:
            self.refused.append(name)
            raise errors.KubeError("the binding failed", status=500, reason="InternalError")
        await super().bind_pod(namespace, name, **kwargs)


async def test_a_failed_binding_undoes_the_claims_allocation_and_the_pod_is_tried_again(
    store: Store, status_writer: Any, running: Callable[[Any], asyncio.Task[Any]]
) -> None:
    api = _BindFailsOnce(store)
    store.create("nodes", make_node("n1"))
    store.create("deviceclasses", dra.device_class())
    store.create("resourceslices", dra.resource_slice("n1", [dra.gpu(0)]))
    claim = store.create(
        "resourceclaims", dra.claim("c", dra.gpu_request(memory_mib=16384)), namespace="default"
    )
    body = dra.dra_pod("p", "unused")
    body["spec"]["schedulerName"] = "vgpu-scheduler"
    body["spec"]["resourceClaims"] = [{"name": "vgpu-0", "resourceClaimName": "c"}]
    store.create("pods", body, namespace="default")
    seen: list[dict[str, Any]] = []
    watch = store.watch("resourceclaims", namespace="default", resource_version=store.resource_version)
    sched = SchedulerEmulator(
        api,
        scheduler_config=None,
        scheduler_name="vgpu-scheduler",
        status_writer=status_writer,
        initial_backoff_s=0.05,
    )
    running(sched.run())
    await wait_for(api, "pods", "p", lambda p: bool(p["spec"].get("nodeName")))
    assert api.refused == ["p"]
    async with asyncio.timeout(10):
        async for event in watch:
            seen.append(event.object.get("status") or {})
            if len(seen) == 3:
                break
    watch.close()
    # allocated and reserved, undone when the binding failed, then allocated and reserved again
    assert [bool(s.get("allocation")) for s in seen] == [True, False, True]
    assert [len(s.get("reservedFor") or []) for s in seen] == [1, 0, 1]
    assert (
        seen[2]["allocation"]["devices"]["results"][0]["shareID"]
        != seen[0]["allocation"]["devices"]["results"][0]["shareID"]
    )
    assert claim["metadata"]["uid"]
