"""/preempt through real HTTP against a local cluster: victims, both modes, nominated pods, garbage."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from vgpu.core import annotations

from tests.scheduler.scenario import Cluster, gpu_container, gpus

KEYS = annotations.KEYS
LOW, HIGH = 10, 1000


def running(
    cluster: Cluster,
    name: str,
    node: str,
    gpu: int,
    mem: int,
    *,
    priority: int,
    start: str = "2027-01-01T00:00:00Z",
) -> dict[str, Any]:
    """A bound, running pod holding ``mem`` MiB on GPU ``gpu`` of ``node``."""
    devices = f"GPU-{node}-{gpu},NVIDIA,{mem},0:;"
    body = {
        "metadata": {
            "name": name,
            "annotations": {
                KEYS.assigned_node: node,
                KEYS.devices_allocated: devices,
                KEYS.bind_phase: "success",
            },
        },
        "spec": {
            "schedulerName": "vgpu-scheduler",
            "nodeName": node,
            "priority": priority,
            "containers": [gpu_container(mem=mem)],
        },
        "status": {"phase": "Running", "startTime": start},
    }
    return cluster.store.create("pods", body, namespace="default")


def pending(cluster: Cluster, name: str, mem: int, *, priority: int, gpu: int = 1) -> dict[str, Any]:
    body = {
        "metadata": {"name": name},
        "spec": {
            "schedulerName": "vgpu-scheduler",
            "priority": priority,
            "containers": [gpu_container(gpu=gpu, mem=mem)],
        },
    }
    return cluster.store.create("pods", body, namespace="default")


def meta_args(pod: dict[str, Any], nodes: dict[str, list[str]]) -> dict[str, Any]:
    return {
        "Pod": pod,
        "NodeNameToMetaVictims": {
            n: {"Pods": [{"UID": u} for u in uids], "NumPDBViolations": 0} for n, uids in nodes.items()
        },
    }


async def preempting(cluster: Cluster, budget: dict[str, Any], name: str, mem: int) -> dict[str, Any]:
    """``budget`` created in ``default`` and seen by the scheduler; then the HIGH-priority pod ``name``
    asking for ``mem`` MiB, pending."""
    cluster.store.create("poddisruptionbudgets", budget, namespace="default")
    pre = pending(cluster, name, mem, priority=HIGH)
    await cluster.synced()
    assert cluster.service is not None
    await cluster.until(lambda: bool(cluster.service.budgets.by_namespace))  # type: ignore[union-attr]
    return pre


def web_budget(allowed: int) -> dict[str, Any]:
    return {
        "metadata": {"name": "web"},
        "spec": {"selector": {"matchLabels": {"app": "web"}}},
        "status": {"disruptionsAllowed": allowed},
    }


def victims(body: dict[str, Any]) -> dict[str, list[str]]:
    return {n: [p["UID"] for p in v["Pods"]] for n, v in body["NodeNameToMetaVictims"].items()}


@pytest.fixture
async def full() -> Any:
    """node-a: two GPUs full of low-priority slices; node-b: one GPU held by a high-priority pod."""
    c = Cluster()
    c.add_node("node-a", gpus("node-a", 2))
    c.add_node("node-b", gpus("node-b", 1))
    await c.start()
    running(c, "a0-small", "node-a", 0, 6000, priority=LOW, start="2027-01-01T00:00:00Z")
    running(c, "a0-big", "node-a", 0, 9000, priority=LOW, start="2027-01-01T00:00:00Z")
    running(c, "a1-x", "node-a", 1, 8000, priority=LOW, start="2027-01-01T00:00:00Z")
    running(c, "a1-y", "node-a", 1, 7000, priority=LOW, start="2027-01-02T00:00:00Z")
    running(c, "b0", "node-b", 0, 15000, priority=HIGH)
    await c.synced()
    yield c
    await c.stop()


def uid(cluster: Cluster, name: str) -> str:
    return str(cluster.pod(name)["metadata"]["uid"])


async def test_meta_mode_picks_minimal_victims_and_drops_nodes_without_a_solution(full: Cluster) -> None:
    pre = pending(full, "train", 8000, priority=HIGH)
    await full.synced()
    status, body = await full.post("preempt", meta_args(pre, {"node-a": [], "node-b": []}))
    assert status == 200, body
    # one victim is enough on either GPU: the least memory taken is a1-y (7000) over a0-small (6000)?
    # no: freeing a0-small leaves 15000-9000=... GPU 0 has 1000 free + 6000 = 7000 < 8000; a1-y frees
    # 1000 + 7000 = 8000: the only single victim that works
    assert victims(body) == {"node-a": [uid(full, "a1-y")]}
    assert "Error" not in body


async def test_full_pod_mode_answers_the_same(full: Cluster) -> None:
    pre = pending(full, "train", 8000, priority=HIGH)
    await full.synced()
    args = {"Pod": pre, "NodeNameToVictims": {"node-a": {"Pods": [], "NumPDBViolations": 0}}}
    status, body = await full.post("preempt", args)
    assert status == 200 and victims(body) == {"node-a": [uid(full, "a1-y")]}


async def test_kube_scheduler_victims_are_kept_and_extended(full: Cluster) -> None:
    pre = pending(full, "train", 15000, priority=HIGH)
    await full.synced()
    status, body = await full.post("preempt", meta_args(pre, {"node-a": [uid(full, "a0-small")]}))
    assert status == 200
    assert victims(body) == {"node-a": [uid(full, "a0-small"), uid(full, "a0-big")]}


async def test_a_victim_named_twice_frees_its_gpus_once(full: Cluster) -> None:
    # a0-small frees 6,000 of GPU 0 (1,000 free): 7,000 < 8,000, so one more victim is needed;
    # counted twice it would seem to free 12,000
    pre = pending(full, "train", 8000, priority=HIGH)
    await full.synced()
    small = uid(full, "a0-small")
    status, body = await full.post("preempt", meta_args(pre, {"node-a": [small, small]}))
    assert status == 200, body
    assert victims(body) == {"node-a": [small, uid(full, "a1-y")]}


async def test_equal_priority_never_evicted(full: Cluster) -> None:
    pre = pending(full, "peer", 8000, priority=LOW)
    await full.synced()
    status, body = await full.post("preempt", meta_args(pre, {"node-a": [], "node-b": []}))
    assert status == 200 and body == {"NodeNameToMetaVictims": {}}


async def test_non_gpu_preemptor_gets_kube_schedulers_proposal(full: Cluster) -> None:
    cpu = full.store.create(
        "pods",
        {"metadata": {"name": "cpu"}, "spec": {"priority": HIGH, "containers": [{"name": "c"}]}},
        namespace="default",
    )
    await full.synced()
    status, body = await full.post("preempt", meta_args(cpu, {"node-a": [uid(full, "a1-x")], "node-b": []}))
    assert status == 200 and victims(body) == {"node-a": [uid(full, "a1-x")]}


async def test_nomination_emits_preempted_events_naming_preemptor_and_gpu(full: Cluster) -> None:
    pre = pending(full, "train", 8000, priority=HIGH)
    await full.synced()
    await full.post("preempt", meta_args(pre, {"node-a": []}))
    full.store.patch(
        "pods",
        "train",
        {"status": {"nominatedNodeName": "node-a"}},
        namespace="default",
        subresource="status",
    )
    await full.synced()
    assert full.service is not None
    await full.service.events.drain()
    got = full.events("Preempted")
    assert [e["involvedObject"]["name"] for e in got] == ["a1-y"]
    assert "default/train" in got[0]["message"] and "GPU-node-a-1" in got[0]["message"]


async def test_nominated_slice_is_held_against_lower_priority_pods(full: Cluster) -> None:
    pre = pending(full, "train", 8000, priority=HIGH)
    full.store.patch(
        "pods",
        "train",
        {"status": {"nominatedNodeName": "node-a"}},
        namespace="default",
        subresource="status",
    )
    # the victim is terminating: it still holds its GPU, the node is held for the nominated pod
    full.store.patch(
        "pods", "a1-y", {"metadata": {"deletionTimestamp": "2027-01-03T00:00:00Z"}}, namespace="default"
    )
    pending(full, "sneak", 500, priority=LOW)
    await full.synced()
    body = await full.filter("sneak", ["node-a"])
    assert body["NodeNames"] == []
    assert "held for pod default/train" in body["FailedAndUnresolvableNodes"]["node-a"]
    own = await full.filter("train", ["node-a"])
    assert own["NodeNames"] == []
    assert full.service is not None
    await full.service.events.drain()
    failed = [e for e in full.events("FilteringFailed") if e["involvedObject"]["name"] == "train"]
    assert "preemption under way: nominated to node node-a, waiting for 1 victim(s)" in failed[-1]["message"]
    # the victim is gone: the preemptor's slice is added to node-a, a lower pod cannot take it
    full.store.delete("pods", "a1-y", namespace="default")
    pending(full, "sneak2", 1500, priority=LOW)
    await full.synced()
    assert (await full.filter("sneak2", ["node-a"]))["NodeNames"] == []
    assert (await full.filter("train", ["node-a"]))["NodeNames"] == ["node-a"]
    assert full.decision("train") == "GPU-node-a-1,NVIDIA,8000,0:;"
    del pre


GARBAGE_400 = [
    pytest.param(b"{not json", id="not-json"),
    pytest.param([1, 2], id="not-an-object"),
    pytest.param({"NodeNameToMetaVictims": {}}, id="no-pod"),
    pytest.param({"Pod": {"metadata": {"name": "x"}}, "NodeNameToMetaVictims": {}}, id="pod-without-uid"),
    pytest.param({"Pod": {"metadata": {"name": 5, "uid": "u"}}}, id="pod-name-not-string"),
    pytest.param(
        {"Pod": {"metadata": {"name": "x", "uid": "u"}}, "NodeNameToMetaVictims": []}, id="victims-not-map"
    ),
    pytest.param(
        {"Pod": {"metadata": {"name": "x", "uid": "u"}}, "NodeNameToMetaVictims": {"n": {"Pods": "a"}}},
        id="pods-not-list",
    ),
    pytest.param(
        {
            "Pod": {"metadata": {"name": "x", "uid": "u"}},
            "NodeNameToMetaVictims": {"n": {"Pods": [{"UID": 3}]}},
        },
        id="uid-not-string",
    ),
    pytest.param(
        {
            "Pod": {"metadata": {"name": "x", "uid": "u"}},
            "NodeNameToVictims": {"n": {"Pods": [{"metadata": {}}]}},
        },
        id="full-pod-without-uid",
    ),
    pytest.param(
        {
            "Pod": {"metadata": {"name": "x", "uid": "u"}},
            "NodeNameToMetaVictims": {"n": {"NumPDBViolations": "2"}},
        },
        id="pdb-count-not-int",
    ),
]


@pytest.mark.parametrize("body", GARBAGE_400)
async def test_garbage_is_400_and_changes_nothing(full: Cluster, body: Any) -> None:
    before = (full.store.resource_version, copy.deepcopy(full.state.charges))
    status, reply = await full.post("preempt", body)
    assert status == 400
    assert reply["Error"]
    assert (full.store.resource_version, full.state.charges) == before


async def test_unknown_victim_and_victim_on_other_node_are_refused_with_a_reason(full: Cluster) -> None:
    pre = pending(full, "train", 8000, priority=HIGH)
    await full.synced()
    before = (full.store.resource_version, copy.deepcopy(full.state.charges))
    status, body = await full.post("preempt", meta_args(pre, {"node-a": ["no-such-uid"]}))
    assert status == 200 and body["NodeNameToMetaVictims"] == {}
    assert "not a known pod" in body["Error"]
    status, body = await full.post("preempt", meta_args(pre, {"node-a": [uid(full, "b0")]}))
    assert status == 200 and body["NodeNameToMetaVictims"] == {}
    assert "is on node node-b, not on node-a" in body["Error"]
    assert (full.store.resource_version, full.state.charges) == before


async def test_a_node_whose_proposal_names_an_unknown_victim_is_left_out_and_the_others_answered(
    full: Cluster,
) -> None:
    pre = pending(full, "train", 8000, priority=HIGH)
    await full.synced()
    status, body = await full.post("preempt", meta_args(pre, {"node-a": [], "node-b": ["no-such-uid"]}))
    assert status == 200
    assert list(victims(body)) == ["node-a"] and victims(body)["node-a"]
    assert (
        "refused on 1 node(s): node-b: victim uid no-such-uid on node node-b is not a known pod"
        in body["Error"]
    )


async def test_bad_pod_request_is_refused_with_a_reason(full: Cluster) -> None:
    pod = {
        "metadata": {"name": "bad", "uid": "u-bad"},
        "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpumem": "lots"}}}]},
    }
    status, body = await full.post("preempt", meta_args(pod, {"node-a": []}))
    assert status == 200 and body["NodeNameToMetaVictims"] == {} and "default/bad" in body["Error"]


async def test_preempt_is_not_served_on_the_service_port(full: Cluster) -> None:
    assert full.session is not None
    async with full.session.post(f"{full.url}/preempt", json={}) as resp:
        assert resp.status == 404


async def test_nodes_whose_victims_break_a_budget_are_left_out_when_others_break_none() -> None:
    c = Cluster()
    c.add_node("node-a", gpus("node-a", 1))
    c.add_node("node-b", gpus("node-b", 1))
    await c.start()
    try:
        guarded = running(c, "guarded", "node-a", 0, 12000, priority=LOW)
        free = running(c, "free", "node-b", 0, 12000, priority=LOW)
        c.store.patch("pods", "guarded", {"metadata": {"labels": {"app": "web"}}}, namespace="default")
        pre = await preempting(c, web_budget(0), "train", 8000)
        status, body = await c.post("preempt", meta_args(pre, {"node-a": [], "node-b": []}))
        assert status == 200 and victims(body) == {"node-b": [free["metadata"]["uid"]]}
        # alone, the violating node is offered, with its violation counted
        status, body = await c.post("preempt", meta_args(pre, {"node-a": []}))
        assert victims(body) == {"node-a": [guarded["metadata"]["uid"]]}
        assert body["NodeNameToMetaVictims"]["node-a"]["NumPDBViolations"] == 1
    finally:
        await c.stop()


async def test_metrics_count_preempt_calls_by_outcome(full: Cluster) -> None:
    pre = pending(full, "train", 8000, priority=HIGH)
    await full.synced()
    await full.post("preempt", meta_args(pre, {"node-a": []}))
    await full.post("preempt", b"{not json")
    assert full.session is not None
    async with full.session.get(f"{full.url}/metrics") as resp:
        text = await resp.text()
    assert 'vgpu_scheduler_preempt_duration_seconds_count{outcome="victims"} 1.0' in text
    assert 'vgpu_scheduler_preempt_duration_seconds_count{outcome="bad_request"} 1.0' in text
    assert 'vgpu_scheduler_errors_total{verb="preempt"} 1.0' in text
