"""/preempt counts PodDisruptionBudget violations as kube-scheduler does: its own victims use up the
budgets first, and a pod without labels is selected by no budget."""

from __future__ import annotations

from typing import Any

import pytest
from vgpu.core import fit, preempt
from vgpu.core.config import Policy
from vgpu.core.device import GpuUsage, GpuUuid
from vgpu_scheduler.budgets import Budgets

from tests.core.test_preempt import ask, gpu
from tests.scheduler.scenario import Cluster, gpus
from tests.scheduler.test_preempt import LOW, meta_args, preempting, running, victims, web_budget

TWO = (gpu("g0", 0), gpu("g1", 1))


def _node(residents: list[preempt.Resident]) -> fit.NodeGpus:
    used: dict[GpuUuid, GpuUsage] = {}
    for r in residents:
        for uuid, u in r.usage.items():
            have = used.get(uuid, GpuUsage())
            used[uuid] = GpuUsage(have.slots + u.slots, have.memory_mib + u.memory_mib, have.cores + u.cores)
    return fit.NodeGpus.build(TWO, used)


def _resident(
    uid: str, priority: int, memory: dict[str, int], pdbs: tuple[str, ...] = ()
) -> preempt.Resident:
    usage = {GpuUuid(g): GpuUsage(1, m, 0) for g, m in memory.items()}
    return preempt.Resident(uid, priority, usage, pdbs=pdbs)


def test_kube_schedulers_victims_use_up_budgets_before_ours_are_chosen() -> None:
    # kube-scheduler proposes "k" (no GPU; its eviction takes the one disruption "web" allows);
    # either "x" (web) or "y" (no budget) frees enough GPU memory: "x" takes less memory, but
    # evicting it besides "k" breaks the budget, so "y" is the better victim
    residents = [
        _resident("k", 1, {}, pdbs=("web",)),
        _resident("x", 1, {"g0": 10000}, pdbs=("web",)),
        _resident("y", 1, {"g1": 12000}),
    ]
    got = preempt.select_victims(
        ask({"gpu": 1, "mem": 8000}),
        _node(residents),
        residents,
        priority=10,
        gpu_policy=Policy.BINPACK,
        proposed=("k",),
        pdb_allowed={"web": 1},
    )
    assert got == preempt.Victims(("k", "y"), 0)


async def test_kube_schedulers_victims_use_up_budgets_through_http() -> None:
    c = Cluster()
    c.add_node("node-a", gpus("node-a", 2))
    await c.start()
    try:
        web = {"metadata": {"labels": {"app": "web"}}}
        cpu = c.store.create(
            "pods",
            {
                "metadata": {"name": "cpu-web", "labels": {"app": "web"}},
                "spec": {"nodeName": "node-a", "priority": LOW, "containers": [{"name": "c"}]},
                "status": {"phase": "Running"},
            },
            namespace="default",
        )
        running(c, "x", "node-a", 0, 10000, priority=LOW)
        c.store.patch("pods", "x", web, namespace="default")
        y = running(c, "y", "node-a", 1, 12000, priority=LOW)
        pre = await preempting(c, web_budget(1), "train", 8000)
        status, body = await c.post("preempt", meta_args(pre, {"node-a": [cpu["metadata"]["uid"]]}))
        assert status == 200, body
        assert victims(body) == {"node-a": [cpu["metadata"]["uid"], y["metadata"]["uid"]]}
        assert body["NodeNameToMetaVictims"]["node-a"]["NumPDBViolations"] == 0
    finally:
        await c.stop()


def _unlabelled_budget() -> dict[str, Any]:
    return {
        "metadata": {"name": "not-web", "namespace": "default"},
        "spec": {"selector": {"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["web"]}]}},
        "status": {"disruptionsAllowed": 0},
    }


@pytest.mark.parametrize("labels", [None, {}], ids=["no-labels", "empty-labels"])
def test_a_pod_without_labels_is_selected_by_no_budget(labels: dict[str, str] | None) -> None:
    # kube-scheduler's filterPodsWithPDBViolation: "A pod with no labels will not match any PDB"
    # (the eviction API agrees: no budget guards such a pod), even a NotIn or DoesNotExist selector
    index = Budgets()
    index.apply("ADDED", _unlabelled_budget())
    meta: dict[str, Any] = {"name": "p", "namespace": "default", "uid": "u"}
    if labels is not None:
        meta["labels"] = labels
    labelled = {"metadata": {"name": "q", "namespace": "default", "uid": "v", "labels": {"tier": "gpu"}}}
    assert index.for_pods([{"metadata": meta}, labelled]) == (
        {"v": ("default/not-web",)},
        {"default/not-web": 0},
    )


async def test_unlabelled_victim_breaks_no_budget_through_http() -> None:
    c = Cluster()
    c.add_node("node-a", gpus("node-a", 1))
    await c.start()
    try:
        plain = running(c, "plain", "node-a", 0, 12000, priority=LOW)
        pre = await preempting(c, _unlabelled_budget(), "train", 8000)
        status, body = await c.post("preempt", meta_args(pre, {"node-a": []}))
        assert status == 200 and victims(body) == {"node-a": [plain["metadata"]["uid"]]}
        assert body["NodeNameToMetaVictims"]["node-a"]["NumPDBViolations"] == 0
    finally:
        await c.stop()
