"""The engine's fit cache never changes an outcome: random clusters and workloads placed by
``engine.simulate`` match a naive loop that calls ``fit.fit_pod`` on every node for every pod."""

from __future__ import annotations

import contextlib
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from vgpu.core import config, errors, fit, policy, usage
from vgpu.core.config import Policy
from vgpu.core.device import GpuUsage, GpuUuid, NodeName
from vgpu.simulate import engine, model

CFG = config.load(None)

gpu_groups = st.lists(
    st.fixed_dictionaries(
        {
            "model": st.sampled_from(["A100", "T4"]),
            "memoryMib": st.sampled_from([8000, 16000, 40000]),
            "count": st.integers(1, 3),
            "splitCount": st.integers(1, 4),
            "numa": st.integers(0, 1),
        }
    ),
    min_size=1,
    max_size=2,
)
clusters = st.lists(gpu_groups, min_size=1, max_size=4).map(
    lambda nodes: {"nodes": [{"name": f"n{i}", "gpus": g} for i, g in enumerate(nodes)]}
)


@st.composite
def pods(draw: Any) -> dict[str, Any]:
    limits: dict[str, Any] = {"nvidia.com/gpu": draw(st.integers(1, 2))}
    if draw(st.booleans()):
        limits["nvidia.com/gpumem"] = draw(st.sampled_from([1000, 3000, 7000, 20000]))
    else:
        limits["nvidia.com/gpumem-percentage"] = draw(st.sampled_from([10, 25, 50, 100]))
    limits["nvidia.com/gpucores"] = draw(st.sampled_from([0, 20, 50, 100]))
    notes = {}
    if draw(st.booleans()):
        notes["nvidia.com/use-gputype"] = draw(st.sampled_from(["a100", "t4"]))
    if draw(st.booleans()):
        notes["hami.io/gpu-scheduler-policy"] = draw(st.sampled_from(["binpack", "spread"]))
    return {
        "replicas": draw(st.integers(1, 4)),
        "annotations": notes,
        "containers": [{"name": "m", "resources": {"limits": limits}}],
    }


workloads = st.lists(pods(), min_size=1, max_size=6).map(
    lambda ps: {"pods": [{"name": f"p{i}", **p} for i, p in enumerate(ps)]}
)


def naive(cluster: model.Cluster, admitted: list[model.WorkloadPod], node_policy: Policy, gpu_policy: Policy):
    used: dict[NodeName, dict[GpuUuid, GpuUsage]] = {n.node: {} for n in cluster.nodes}
    placed, pending = [], []
    for pod in admitted:
        views = {n.node: fit.NodeGpus.build(n.gpus, used[n.node]) for n in cluster.nodes}
        results = {
            name: fit.fit_pod(pod.request, view, gpu_policy=pod.request.gpu_policy or gpu_policy)
            for name, view in views.items()
        }
        fitting = [(name, views[name].score) for name, r in results.items() if isinstance(r, fit.Placement)]
        chosen = policy.pick_node(fitting, pod.request.node_policy or node_policy)
        if chosen is None:
            pending.append((pod.key, {n: r for n, r in results.items()}))
            continue
        placement = results[NodeName(chosen)]
        assert isinstance(placement, fit.Placement)
        usage.add(used[NodeName(chosen)], placement.usage)
        placed.append((pod.key, chosen, placement.devices))
    return placed, pending, used


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters, workloads, st.sampled_from(list(Policy)), st.sampled_from(list(Policy)))
def test_engine_matches_a_naive_loop(
    cluster_raw: Any, workload_raw: Any, node_policy: Policy, gpu_policy: Policy
) -> None:
    cluster = model.load_cluster(cluster_raw, config=CFG)
    workload = model.load_workload(workload_raw, config=CFG)
    run = engine.simulate(cluster, workload, config=CFG, node_policy=node_policy, gpu_policy=gpu_policy)
    admitted = [p.pod for p in run.placed] + [p.pod for p in run.pending]
    order = {p.key: i for i, p in enumerate(workload.pods)}
    admitted.sort(key=lambda p: order[p.key])
    placed, pending, used = naive(cluster, admitted, node_policy, gpu_policy)
    assert [(p.pod.key, p.node, p.devices) for p in run.placed] == placed
    assert [(p.pod.key, p.reasons) for p in run.pending] == pending
    assert run.used == used


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 50) | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)
cluster_like = st.fixed_dictionaries(
    {"nodes": st.lists(st.fixed_dictionaries({"name": json_values, "gpus": json_values}), max_size=2)}
)
workload_like = st.fixed_dictionaries(
    {"pods": st.lists(st.fixed_dictionaries({"name": st.just("p"), "containers": json_values}), max_size=2)}
)


@settings(max_examples=150, deadline=None)
@given(st.one_of(json_values, cluster_like))
def test_garbage_cluster_only_raises_config_error(raw: Any) -> None:
    with contextlib.suppress(errors.ConfigError):
        model.load_cluster(raw, config=CFG)


@settings(max_examples=150, deadline=None)
@given(st.one_of(json_values, workload_like))
def test_garbage_workload_only_raises_config_error(raw: Any) -> None:
    try:
        workload = model.load_workload(raw, config=CFG)
    except errors.ConfigError:
        return
    cluster = model.load_cluster(
        {"nodes": [{"name": "n", "gpus": [{"model": "T4", "memoryMib": 1000}]}]}, config=CFG
    )
    engine.simulate(cluster, workload, config=CFG, node_policy=Policy.BINPACK, gpu_policy=Policy.SPREAD)
