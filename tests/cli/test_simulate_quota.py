"""``vgpu simulate`` applies namespace GPU quotas as the webhook and the filter do (issue 13)."""

from __future__ import annotations

from typing import Any

import pytest
from vgpu.core import config, errors
from vgpu.core.config import Policy
from vgpu.simulate import engine, model

CFG = config.load(None)
NODES = [
    {"name": "n1", "gpus": [{"model": "T4", "memoryMib": 16000, "count": 4}]},
    {"name": "n2", "gpus": [{"model": "A100", "memoryMib": 32000}]},  # the largest GPU: 32000 MiB
]


def pod(
    name: str, *, ns: str = "team", memory: int | None = None, pct: int | None = None, replicas: int = 1
) -> dict:
    limits: dict[str, Any] = {"nvidia.com/gpu": 1, "nvidia.com/gpucores": 10}
    if memory is not None:
        limits["nvidia.com/gpumem"] = memory
    if pct is not None:
        limits["nvidia.com/gpumem-percentage"] = pct
    return {
        "name": name,
        "namespace": ns,
        "replicas": replicas,
        "containers": [{"name": "m", "resources": {"limits": limits}}],
    }


def run(quotas: dict[str, Any], pods: list[dict[str, Any]]) -> engine.Run:
    cluster = model.load_cluster({"nodes": NODES, "quotas": quotas}, config=CFG)
    workload = model.load_workload({"pods": pods}, config=CFG)
    return engine.simulate(
        cluster, workload, config=CFG, node_policy=Policy.BINPACK, gpu_policy=Policy.SPREAD
    )


CASES = [
    # (id, quotas, pods, placed keys, pending reason per pending key, rejected keys)
    (
        "third-replica-over-memory",
        {"team": {"memory": 10000}},
        [pod("a", memory=4000, replicas=3)],
        ["team/a-0", "team/a-1"],
        {"team/a-2": "namespace team: GPU memory quota exceeded (used 8000 of 10000, requested 4000)"},
        [],
    ),
    (
        "percent-counted-at-the-largest-gpu",
        {"team": {"memory": "20000"}},
        [pod("a", pct=50), pod("b", pct=50)],
        ["team/a"],
        {"team/b": "namespace team: GPU memory quota exceeded (used 8000 of 20000, requested 16000)"},
        [],
    ),
    (
        "cores",
        {"team": {"cores": 15}},
        [pod("a", memory=100), pod("b", memory=100)],
        ["team/a"],
        {"team/b": "namespace team: GPU cores quota exceeded (used 10 of 15, requested 10)"},
        [],
    ),
    (
        "other-namespaces-are-free",
        {"team": {"memory": 1000}},
        [pod("a", memory=900), pod("b", memory=900, ns="other")],
        ["team/a", "other/b"],
        {},
        [],
    ),
    (
        "bigger-than-the-whole-quota-is-rejected",
        {"team": {"memory": 100}},
        [pod("a", memory=200)],
        [],
        {},
        ["team/a"],
    ),
]


@pytest.mark.parametrize(
    ("quotas", "pods", "placed", "pending", "rejected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_quota(
    quotas: dict, pods: list, placed: list[str], pending: dict[str, str], rejected: list[str]
) -> None:
    got = run(quotas, pods)
    assert [p.pod.key for p in got.placed] == placed
    assert {p.pod.key: p.summary() for p in got.pending} == {k: f"2 nodes: {v}" for k, v in pending.items()}
    assert all(m.unresolvable for p in got.pending for m in p.reasons.values())
    assert [r.pod.key for r in got.rejected] == rejected


@pytest.mark.parametrize(
    ("quotas", "field"),
    [
        pytest.param(["team"], "cluster.quotas", id="not-a-mapping"),
        pytest.param({"team": {"memory": "lots"}}, "cluster.quotas.team.memory", id="bad-quantity"),
        pytest.param({"team": {"cores": -1}}, "cluster.quotas.team.cores", id="negative-cores"),
        pytest.param({"team": {"gpus": 1}}, "cluster.quotas.team", id="unknown-key"),
        pytest.param({"team": "10Gi"}, "cluster.quotas.team", id="limits-not-a-mapping"),
        pytest.param({"": {"cores": 1}}, "cluster.quotas", id="empty-namespace"),
    ],
)
def test_garbage_quotas_are_config_errors_naming_the_key(quotas: Any, field: str) -> None:
    with pytest.raises(errors.ConfigError) as info:
        model.load_cluster({"nodes": NODES, "quotas": quotas}, config=CFG)
    assert info.value.field == field


def _ctr(name: str, memory: int, cores: int) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": memory, "nvidia.com/gpucores": cores}
    return {"name": name, "resources": {"limits": limits}}


def _init_job(
    *, x: tuple[int, int], y: tuple[int, int], init: tuple[int, int], app: tuple[int, int], limit: int
) -> engine.Run:
    """One node of two 8000 MiB GPUs; pods of another namespace holding (MiB, cores) ``x`` on GPU 0
    and ``y`` on GPU 1; then ``team/job``, an init container and an app container, in a namespace
    with a ``limit`` MiB quota (GPU policy spread)."""
    nodes = [{"name": "n1", "gpus": [{"model": "T4", "memoryMib": 8000, "count": 2}]}]
    pods = [
        {
            "name": name,
            "namespace": "other",
            "annotations": {"nvidia.com/use-gpuuuid": f"GPU-n1-{index}"},
            "containers": [_ctr("m", *held)],
        }
        for index, (name, held) in enumerate((("x", x), ("y", y)))
    ]
    pods.append(
        {
            "name": "job",
            "namespace": "team",
            "initContainers": [_ctr("setup", *init)],
            "containers": [_ctr("main", *app)],
        }
    )
    cluster = model.load_cluster({"nodes": nodes, "quotas": {"team": {"memory": limit}}}, config=CFG)
    return engine.simulate(
        cluster,
        model.load_workload({"pods": pods}, config=CFG),
        config=CFG,
        node_policy=Policy.BINPACK,
        gpu_policy=Policy.SPREAD,
    )


def test_an_init_container_the_app_cannot_reuse_leaves_the_pod_pending() -> None:
    """As the filter: other namespaces' pods leave GPU 0 6000 MiB and GPU 1 7000 MiB but 40 % of its
    cores, so an init container of 7000 fits only on GPU 1 and the app container (6000, 50 %) only
    on GPU 0; kubelet would give the app the init container's device on GPU 1: no placement."""
    got = _init_job(x=(2000, 0), y=(1000, 60), init=(7000, 0), app=(6000, 50), limit=10000)
    assert [p.pod.key for p in got.placed] == ["other/x", "other/y"]
    (pending,) = got.pending
    assert pending.pod.key == "team/job"
    assert "kubelet gives it the devices of init container setup first" in pending.summary()


def test_the_init_container_goes_beside_the_app_it_hands_its_device_on_to() -> None:
    """As the filter: spread alone would put an init container of 2000 on the idler GPU 0 and the
    app container (5000, 50 %) on GPU 1, the only one with its cores free: 7000 charged, over the
    quota of 6000. kubelet hands the init container's device on to the app: both on GPU 1, 5000."""
    got = _init_job(x=(1, 60), y=(3000, 30), init=(2000, 0), app=(5000, 50), limit=6000)
    assert not got.pending
    job = got.placed[-1]
    assert job.pod.key == "team/job"
    assert [[d.uuid for d in devices] for devices in job.devices] == [["GPU-n1-1"], ["GPU-n1-1"]]
