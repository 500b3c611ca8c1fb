"""The own preemption path (issue 50) through the service: a /filter that fails a pod on every node
for GPUs, then ``SelfPreemption.step`` with the fake clock, against the local API server's
Eviction API (budgets checked as kube-apiserver checks them)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from vgpu.core import annotations
from vgpu.core.config import Config, Preemption, SchedulerConfig

from tests.scheduler.scenario import Cluster, gpu_container, gpus

KEYS = annotations.KEYS
LOW, HIGH = 100, 100_000


def running(c: Cluster, name: str, mem: int, *, ns: str = "default", cls: str = "low", **labels: str) -> None:
    devices = f"GPU-node-a-0,NVIDIA,{mem},0:;"
    body = {
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": {
                KEYS.assigned_node: "node-a",
                KEYS.devices_allocated: devices,
                KEYS.bind_phase: "success",
            },
        },
        "spec": {
            "schedulerName": "vgpu-scheduler",
            "nodeName": "node-a",
            "priorityClassName": cls,
            "containers": [gpu_container(mem=mem)],
        },
    }
    pod = c.store.create("pods", body, namespace=ns)
    c.store.update("pods", {**pod, "status": {"phase": "Running"}}, namespace=ns, subresource="status")


def pending(c: Cluster, name: str, mem: int, *, cls: str = "high") -> dict[str, Any]:
    body = {
        "metadata": {"name": name},
        "spec": {
            "schedulerName": "vgpu-scheduler",
            "priorityClassName": cls,
            "containers": [gpu_container(mem=mem)],
        },
    }
    return c.store.create("pods", body, namespace="default")


def config(**scheduler: Any) -> Config:
    return Config(scheduler=SchedulerConfig(**scheduler))


async def start(c: Cluster, *, memory: int = 16000) -> None:
    for name, value, policy in (("low", LOW, None), ("high", HIGH, None), ("polite", HIGH, "Never")):
        body: dict[str, Any] = {"metadata": {"name": name}, "value": value}
        if policy:
            body["preemptionPolicy"] = policy
        c.store.create("priorityclasses", body)
    c.store.create("priorityclasses", {"metadata": {"name": "critical"}, "value": 2_000_000_000})
    c.store.create("namespaces", {"metadata": {"name": "web"}})
    c.add_node("node-a", gpus("node-a", 1, memory=memory))
    await c.start()


@pytest.fixture
async def cluster() -> AsyncIterator[Cluster]:
    c = Cluster()
    yield c
    await c.stop()


def deleting(c: Cluster, name: str, ns: str = "default") -> bool:
    try:
        return bool(c.pod(name, ns)["metadata"].get("deletionTimestamp"))
    except Exception:
        return True  # gone


async def shortfall_then_step(c: Cluster, pod: str, *, after_s: float = 3.0) -> None:
    await c.synced()
    await c.until(lambda: len(c.service.priorities.by_name) >= 4)  # type: ignore[union-attr]
    body = await c.filter(pod)
    assert body["NodeNames"] == [], body
    c.clock.now += after_s
    await c.service.self_preemption.step()  # type: ignore[union-attr]


def outcomes(c: Cluster) -> list[str]:
    return [r.outcome for r in c.service.self_preemption.records]  # type: ignore[union-attr]


async def test_a_gpu_only_shortfall_evicts_the_fewest_holds_the_node_and_binds(cluster: Cluster) -> None:
    c = cluster
    await start(c)
    running(c, "low-a", 6000)
    running(c, "low-b", 9000)
    high = pending(c, "high", 8000)
    await shortfall_then_step(c, "high")

    assert deleting(c, "low-b") and not deleting(c, "low-a")  # one victim is enough: the fewest
    assert c.state.nominations.by_uid == {high["metadata"]["uid"]: "node-a"}
    await c.until(lambda: bool(c.events("Preempting")) and bool(c.events("Preempted")))
    assert [e["involvedObject"]["name"] for e in c.events("Preempted")] == ["low-b"]
    assert (
        "evicting 1 pod(s) on node node-a to make room: default/low-b" in c.events("Preempting")[0]["message"]
    )
    # a lower-priority pod that would fit in what is free now is turned down: the node is held
    pending(c, "sneak", 500, cls="low")
    await c.synced()
    sneak = await c.filter("sneak")
    assert sneak["NodeNames"] == [] and "held for pod default/high" in str(sneak), sneak

    c.store.delete("pods", "low-b", namespace="default")  # its kubelet stopped it
    await c.until(lambda: all(p["metadata"]["name"] != "low-b" for p in c.store.list("pods").items))
    await c.synced()
    await c.service.self_preemption.step()  # type: ignore[union-attr]
    # kube-scheduler is asked to retry it, and its next attempt takes the freed node
    await c.until(lambda: "kube-vgpu.io/filter-retry" in (c.pod("high")["metadata"].get("annotations") or {}))
    assert (await c.filter("high"))["NodeNames"] == ["node-a"]
    assert await c.bind("high", "node-a") == ""
    await c.synced()
    await c.service.self_preemption.step()  # type: ignore[union-attr]
    assert outcomes(c) == ["started", "bound"]
    assert c.state.nominations.by_uid == {}
    assert c.session is not None
    async with c.session.get(f"{c.url}/metrics") as resp:
        text = await resp.text()
    assert 'vgpu_scheduler_preemptions_total{outcome="started",path="self"} 1.0' in text
    assert 'vgpu_scheduler_preemptions_total{outcome="bound",path="self"} 1.0' in text


async def test_nothing_before_the_grace_nor_when_kube_scheduler_calls_preempt(cluster: Cluster) -> None:
    c = cluster
    await start(c)
    running(c, "low-b", 15000)
    high = pending(c, "high", 8000)
    await shortfall_then_step(c, "high", after_s=1.0)
    assert not deleting(c, "low-b") and outcomes(c) == []  # within preemptionGraceS
    status, _ = await c.post(
        "preempt", {"Pod": high, "NodeNameToMetaVictims": {"node-a": {"Pods": [], "NumPDBViolations": 0}}}
    )
    assert status == 200
    c.clock.now += 5
    await c.service.self_preemption.step()  # type: ignore[union-attr]
    assert not deleting(c, "low-b") and outcomes(c) == []  # kube-scheduler preempts for it itself


@pytest.mark.parametrize(
    ("preemptor_class", "victim_ns", "victim_class", "settings"),
    [
        ("polite", "default", "low", {}),  # preemptionPolicy: Never
        ("high", "kube-system", "low", {}),  # an excluded namespace
        ("high", "default", "critical", {}),  # system-critical (and of higher priority)
        ("low", "default", "low", {}),  # equal priority
        ("high", "default", "low", {"preemption": Preemption.VERB}),
        ("high", "default", "low", {"preemption": Preemption.OFF}),
        ("high", "default", "low", {"preemptions_per_minute": 0}),
    ],
    ids=[
        "policy-never",
        "excluded-namespace",
        "system-critical",
        "equal-priority",
        "verb-only",
        "off",
        "rate-0",
    ],
)
async def test_what_the_own_path_never_evicts(
    preemptor_class: str, victim_ns: str, victim_class: str, settings: dict[str, Any]
) -> None:
    c = Cluster(config(**settings))
    try:
        await start(c)
        running(c, "victim", 15000, ns=victim_ns, cls=victim_class)
        pending(c, "pre", 8000, cls=preemptor_class)
        await shortfall_then_step(c, "pre")
        assert not deleting(c, "victim", victim_ns)
        assert c.state.nominations.by_uid == {}
        assert set(outcomes(c)) <= {"none"}
    finally:
        await c.stop()


async def test_a_budget_the_eviction_api_enforces_makes_it_take_the_next_set(cluster: Cluster) -> None:
    c = cluster
    await start(c, memory=17000)
    # the cheapest set is low-b alone; the API server's budget (an empty selector: every pod of
    # namespace web, which kube-scheduler's counting does not see) refuses its eviction
    running(c, "low-b", 9000, ns="web", app="web")
    running(c, "low-a", 4500)
    running(c, "low-c", 2500)
    pdb = c.store.create(
        "poddisruptionbudgets", {"metadata": {"name": "all"}, "spec": {"selector": {}}}, namespace="web"
    )
    c.store.update(
        "poddisruptionbudgets",
        {**pdb, "status": {"disruptionsAllowed": 0}},
        namespace="web",
        subresource="status",
    )
    pending(c, "high", 8000)
    await shortfall_then_step(c, "high")
    assert not deleting(c, "low-b", "web")
    assert deleting(c, "low-a") and deleting(c, "low-c")
    assert outcomes(c) == ["started"]


async def test_victims_that_do_not_go_release_the_node_and_the_pod_backs_off(cluster: Cluster) -> None:
    c = cluster
    c.config = config(preemption_victim_timeout_s=30.0)
    await start(c)
    running(c, "low-b", 15000)
    high = pending(c, "high", 8000)
    await shortfall_then_step(c, "high")
    assert outcomes(c) == ["started"] and deleting(c, "low-b")
    c.clock.now += 31
    await c.service.self_preemption.step()  # type: ignore[union-attr]
    assert outcomes(c) == ["started", "timeout"] and c.state.nominations.by_uid == {}
    assert "victims not gone after 30 s: default/low-b" in c.service.self_preemption.records[-1].message  # type: ignore[union-attr]
    await shortfall_then_step(c, "high", after_s=3.0)  # within its back-off: no second preemption
    assert outcomes(c) == ["started", "timeout"]
    del high


async def test_the_preemptor_going_away_cancels_and_releases_the_node(cluster: Cluster) -> None:
    c = cluster
    await start(c)
    running(c, "low-b", 15000)
    pending(c, "high", 8000)
    await shortfall_then_step(c, "high")
    assert c.state.nominations.by_uid
    c.store.delete("pods", "high", namespace="default")
    await c.synced()
    await c.service.self_preemption.step()  # type: ignore[union-attr]
    assert outcomes(c) == ["started", "cancelled"] and c.state.nominations.by_uid == {}


async def test_the_cluster_wide_rate_limits_preemptions(cluster: Cluster) -> None:
    c = cluster
    c.config = config(preemptions_per_minute=1)
    await start(c)
    running(c, "low-a", 7000)
    running(c, "low-b", 8000)
    pending(c, "high-1", 8000)
    pending(c, "high-2", 8000)
    await c.synced()
    await c.until(lambda: len(c.service.priorities.by_name) >= 4)  # type: ignore[union-attr]
    for name in ("high-1", "high-2"):
        assert (await c.filter(name))["NodeNames"] == []
    c.clock.now += 3
    await c.service.self_preemption.step()  # type: ignore[union-attr]
    assert outcomes(c) == ["started"]  # one a minute: the other waits
    assert sum(deleting(c, n) for n in ("low-a", "low-b")) == 1


async def test_the_dashboard_lists_the_decisions(cluster: Cluster) -> None:
    c = cluster
    await start(c)
    running(c, "low-b", 15000)
    pending(c, "high", 8000)
    await shortfall_then_step(c, "high")
    assert c.session is not None
    async with c.session.get(f"{c.url}/ui/state") as resp:
        snap = await resp.json()
    (row,) = snap["preemptions"]
    assert row["pod"] == "default/high" and row["outcome"] == "started"
    assert row["node"] == "node-a" and row["victims"] == ["default/low-b"]


async def test_fitting_elsewhere_cancels_and_releases_the_node(cluster: Cluster) -> None:
    c = cluster
    await start(c)
    running(c, "low-b", 15000)
    pending(c, "high", 8000)
    await shortfall_then_step(c, "high")
    assert outcomes(c) == ["started"]
    c.add_node("node-b", gpus("node-b", 1))  # room came elsewhere before the victim went
    await c.synced()
    assert (await c.filter("high", ["node-b"]))["NodeNames"] == ["node-b"]
    await c.service.self_preemption.step()  # type: ignore[union-attr]
    assert outcomes(c) == ["started", "cancelled"] and c.state.nominations.by_uid == {}
    assert "it fits on node node-b" in c.service.self_preemption.records[-1].message  # type: ignore[union-attr]


@pytest.mark.parametrize("terminating", [True, False], ids=["its-victim-terminating", "its-victims-gone"])
async def test_a_nomination_by_kube_scheduler_keeps_the_own_path_out_only_while_it_preempts(
    cluster: Cluster, terminating: bool
) -> None:
    # kube-scheduler v1.20 evicts its own (CPU) victim and nominates the pod without asking us:
    # while that victim terminates it is preempting; once it is gone, the GPU shortfall is ours
    c = cluster
    await start(c)
    running(c, "low-b", 15000)
    if terminating:
        running(c, "cpu-victim", 0)
        c.store.delete("pods", "cpu-victim", namespace="default", grace_period_s=30)
    high = pending(c, "high", 8000)
    c.store.update(
        "pods", {**high, "status": {"nominatedNodeName": "node-a"}}, namespace="default", subresource="status"
    )
    await shortfall_then_step(c, "high")
    assert deleting(c, "low-b") is (not terminating)
    assert outcomes(c) == ([] if terminating else ["started"])


async def test_a_filter_that_comes_before_the_pod_watch_shows_the_pod_is_kept(cluster: Cluster) -> None:
    # kube-scheduler can filter a pod before our watch (read by the writes' helper) delivers it
    c = cluster
    await start(c)
    running(c, "low-b", 15000)
    await c.synced()
    await c.until(lambda: len(c.service.priorities.by_name) >= 4)  # type: ignore[union-attr]
    high = pending(c, "high", 8000)
    uid = high["metadata"]["uid"]
    assert uid not in c.state.pods  # no loop turn yet: the watch has not delivered it
    preemption = c.service.self_preemption  # type: ignore[union-attr]
    # what /filter does: the reason first, then the note
    c.service.services.extender.reasons.failed(uid, "no GPU with 8000 MiB free", now=c.clock.now)  # type: ignore[union-attr]
    preemption.shortfall(uid, {"node-a": "no GPU with 8000 MiB free"})
    c.clock.now += 3
    await preemption.step()
    assert outcomes(c) == [] and not deleting(c, "low-b")
    await c.synced()
    await preemption.step()
    assert outcomes(c) == ["started"] and deleting(c, "low-b")
