"""`vgpu simulate` with priorities: a pod that fits nowhere evicts the fewest lower-priority pods."""

from __future__ import annotations

from typing import Any

import pytest
from vgpu.core import config, errors
from vgpu.core.config import Policy
from vgpu.simulate import analysis, engine, model, report

CFG = config.load(None)
CLUSTER = {"nodes": [{"name": "n", "count": 2, "gpus": [{"model": "T4", "memoryMib": 16000}]}]}


def pod(name: str, memory: int, priority: int | None = None, replicas: int = 1) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": name,
        "replicas": replicas,
        "containers": [
            {"name": "c", "resources": {"limits": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": memory}}}
        ],
    }
    if priority is not None:
        out["priority"] = priority
    return out


def run(pods: list[dict[str, Any]]) -> engine.Run:
    cluster = model.load_cluster(CLUSTER, config=CFG)
    workload = model.load_workload({"pods": pods}, config=CFG)
    return engine.simulate(
        cluster, workload, config=CFG, node_policy=Policy.BINPACK, gpu_policy=Policy.BINPACK
    )


def test_high_priority_pod_evicts_the_fewest_low_pods_and_they_wait_again() -> None:
    got = run([pod("low", 6000, priority=1, replicas=4), pod("big", 12000, priority=100)])
    assert [p.preemptor for p in got.preemptions] == ["default/big"]
    (pre,) = got.preemptions
    assert len(pre.victims) == 2 and all(v.startswith("default/low-") for v in pre.victims)
    assert {p.pod.key for p in got.pending} == set(pre.victims)
    assert all("preempted by default/big" in p.summary() for p in got.pending)
    assert "default/big" in {p.pod.key for p in got.placed}
    assert max(u.memory_mib for used in got.used.values() for u in used.values()) <= 16000


def test_equal_or_no_priority_never_preempts() -> None:
    got = run([pod("low", 6000, replicas=4), pod("big", 12000)])
    assert got.preemptions == () and [p.pod.key for p in got.pending] == ["default/big"]
    got = run([pod("low", 6000, priority=5, replicas=4), pod("big", 12000, priority=5)])
    assert got.preemptions == ()


def test_report_counts_preemptions_in_text_json_and_comparison() -> None:
    got = run([pod("low", 6000, priority=1, replicas=4), pod("big", 12000, priority=100)])
    a = analysis.analyse(got)
    assert a.totals.preemptions == 1
    text = report.render_text(a)
    assert "preemptions: 1 (2 lower-priority pods evicted)" in text
    doc = report.to_json([a])
    assert doc["runs"][0]["summary"]["preemptions"] == 1
    assert doc["runs"][0]["preemptions"][0]["pod"] == "default/big"
    assert "preemptions" in report.render_compare([a, a])


@pytest.mark.parametrize("bad", ["high", True, 1.5, 10**12], ids=["string", "bool", "float", "huge"])
def test_bad_priority_is_refused_naming_the_pod(bad: Any) -> None:
    with pytest.raises(errors.ConfigError, match="priority"):
        model.load_workload({"pods": [{**pod("p", 1000), "priority": bad}]}, config=CFG)
