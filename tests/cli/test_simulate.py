"""``vgpu simulate``: placements, pending reasons, utilisation and fragmentation on a hand-computed case.

The case (``CLUSTER`` / ``WORKLOAD``)::

    n1: 2 GPUs x 10000 MiB, 4 slots each      n2: 1 GPU x 20000 MiB, 2 slots
    a-0, a-1, a-2: 1 GPU, 4000 MiB, 30 % cores
    b:             1 GPU, 9000 MiB, 50 % cores
    c:             2 GPUs, 1000 MiB each, 0 % cores (n2 has one GPU: unresolvable there)
    d:             1 GPU, 12000 MiB, 0 % cores

Scores (vgpu.core.policy): node = 10 x (slots/count + cores/total + memory/total) over existing
usage, binpack takes the highest, spread the lowest, ties go to the first name; GPU score counts
the container being placed, binpack takes the fullest-after, spread the emptiest-after, ties the
lower index.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from vgpu import simulate
from vgpu.core import config, errors
from vgpu.core.config import Policy
from vgpu.simulate import analysis, engine, model, report

CFG = config.load(None)

CLUSTER: dict[str, Any] = {
    "nodes": [
        {"name": "n1", "splitCount": 4, "gpus": [{"model": "T4", "memoryMib": 10000, "count": 2}]},
        {"name": "n2", "splitCount": 2, "gpus": [{"model": "A10", "memoryMib": 20000}]},
    ]
}


def gpu_pod(name: str, *, gpus: int, memory: int, cores: int, replicas: int = 1) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": gpus, "nvidia.com/gpumem": memory, "nvidia.com/gpucores": cores}
    return {
        "name": name,
        "replicas": replicas,
        "containers": [{"name": "main", "resources": {"limits": limits}}],
    }


WORKLOAD: dict[str, Any] = {
    "pods": [
        gpu_pod("a", gpus=1, memory=4000, cores=30, replicas=3),
        gpu_pod("b", gpus=1, memory=9000, cores=50),
        gpu_pod("c", gpus=2, memory=1000, cores=0),
        gpu_pod("d", gpus=1, memory=12000, cores=0),
    ]
}


def run_case(node_policy: Policy, gpu_policy: Policy) -> analysis.Analysis:
    cluster = model.load_cluster(CLUSTER, config=CFG)
    workload = model.load_workload(WORKLOAD, config=CFG)
    return analysis.analyse(
        engine.simulate(cluster, workload, config=CFG, node_policy=node_policy, gpu_policy=gpu_policy)
    )


def placements(a: analysis.Analysis) -> dict[str, list[list[str]]]:
    return {p.pod.key: [[d.uuid for d in c] for c in p.devices] for p in a.run.placed}


def gpu_table(a: analysis.Analysis) -> dict[str, tuple[int, int, int, int]]:
    return {r.gpu.uuid: (r.used.memory_mib, r.used.cores, r.used.slots, r.stranded_mib) for r in a.gpus}


def test_binpack_binpack_by_hand() -> None:
    """a-0: all scores 0, tie -> n1, GPU tie -> GPU 0.
    a-1: n1 = 10 x (1/8 + 30/200 + 4000/20000) = 4.75 > n2 = 0 -> n1; GPU 0 after = 10 x (2/4 + 60/100
         + 8000/10000) = 19 > GPU 1 after = 9.5 -> GPU 0 (8000 MiB, 60 %, 2 slots).
    a-2: n1 = 9.5 -> n1; GPU 0 has 2000 MiB free < 4000 -> GPU 1 (4000, 30, 1).
    b:   n1 has at most 6000 MiB free per GPU -> only n2 fits -> n2 GPU 0 (9000, 50, 1).
    c:   n2 has 1 GPU (unresolvable); n1: GPU 0 (2000 free, 40 % cores) and GPU 1 fit -> both, +1000 each.
    d:   12000 MiB: n1 best 5000 free, n2 11000 free -> pending.
    Final: n1 GPU 0 = 9000 MiB / 60 % / 3 slots, GPU 1 = 5000 / 30 / 2, n2 GPU 0 = 9000 / 50 / 1.
    Typical: memories [4000 x3, 9000, 1000, 12000] -> median_low 4000; cores [30 x3, 50, 0, 0] -> 30.
    Stranded: n1 GPU 0 has 1000 free < 4000 -> 1000; n1 GPU 1 (5000 free, 70 % cores, 2/4 slots) and
    n2 GPU 0 (11000 free, 50 %, 1/2) take a typical container -> 0. Free 1000 + 5000 + 11000 = 17000,
    fragmentation 1000 / 17000.
    """
    a = run_case(Policy.BINPACK, Policy.BINPACK)
    assert placements(a) == {
        "default/a-0": [["GPU-n1-0"]],
        "default/a-1": [["GPU-n1-0"]],
        "default/a-2": [["GPU-n1-1"]],
        "default/b": [["GPU-n2-0"]],
        "default/c": [["GPU-n1-0", "GPU-n1-1"]],
    }
    assert gpu_table(a) == {
        "GPU-n1-0": (9000, 60, 3, 1000),
        "GPU-n1-1": (5000, 30, 2, 0),
        "GPU-n2-0": (9000, 50, 1, 0),
    }
    assert a.typical is not None
    assert a.typical.cores == 30
    assert a.typical.memory_mib_by_gpu_size == {10000: 4000, 20000: 4000}
    t = a.totals
    assert (t.placed, t.pending, t.rejected, t.pods) == (5, 1, 0, 6)
    assert (t.memory_used_mib, t.memory_total_mib) == (23000, 40000)
    assert (t.cores_used, t.cores_total, t.slots_used, t.slots_total) == (140, 300, 6, 10)
    assert (t.free_mib, t.stranded_mib) == (17000, 1000)
    assert t.fragmentation == pytest.approx(1000 / 17000)
    assert (t.gpus_in_use, t.nodes_in_use) == (3, 2)
    [pending] = a.run.pending
    assert pending.pod.key == "default/d"
    assert set(pending.reasons) == {"n1", "n2"}
    assert "12000" in pending.reasons["n1"].reason and "5000" in pending.reasons["n1"].reason
    assert "11000" in pending.reasons["n2"].reason
    assert not pending.reasons["n2"].unresolvable  # an empty n2 would take it


def test_spread_spread_by_hand() -> None:
    """a-0: tie -> n1 GPU 0.  a-1: n1 = 4.75, n2 = 0 -> spread takes n2 (4000, 30, 1).
    a-2: n1 = 4.75 < n2 = 10 x (1/2 + 30/100 + 4000/20000) = 10 -> n1; GPU 0 after 19 > GPU 1 after 9.5
         -> spread takes GPU 1.
    b:   n1 has 6000 MiB free per GPU -> n2 only: 13000 MiB, 80 %, 2/2 slots.
    c:   n1 GPU 0 and GPU 1 (4000 / 30 / 1 each, a tie) +1000 each -> 5000 / 30 / 2 on both.
    d:   n1 best 5000 free, n2 has no free slot -> pending.
    Stranded: n1 GPUs take a typical (5000 free, 70 % cores, 2/4 slots) -> 0; n2 has no slot -> its
    7000 free MiB are stranded. Free 17000, stranded 7000.
    """
    a = run_case(Policy.SPREAD, Policy.SPREAD)
    assert placements(a) == {
        "default/a-0": [["GPU-n1-0"]],
        "default/a-1": [["GPU-n2-0"]],
        "default/a-2": [["GPU-n1-1"]],
        "default/b": [["GPU-n2-0"]],
        "default/c": [["GPU-n1-0", "GPU-n1-1"]],  # equal usage on both: lower index first
    }
    assert gpu_table(a) == {
        "GPU-n1-0": (5000, 30, 2, 0),
        "GPU-n1-1": (5000, 30, 2, 0),
        "GPU-n2-0": (13000, 80, 2, 7000),
    }
    t = a.totals
    assert (t.free_mib, t.stranded_mib, t.pending) == (17000, 7000, 1)
    assert t.fragmentation == pytest.approx(7000 / 17000)
    assert "slot" in a.run.pending[0].reasons["n2"].reason


def test_admission_makes_a_bare_gpu_exclusive_and_rejects_bad_pods() -> None:
    """The webhook's decision runs first: ``nvidia.com/gpu: 1`` alone becomes 100 % cores and the
    whole memory, so two such pods need two GPUs; a privileged GPU container is denied."""
    cluster = model.load_cluster(CLUSTER, config=CFG)
    bare = {
        "name": "bare",
        "replicas": 4,
        "containers": [{"name": "m", "resources": {"limits": {"nvidia.com/gpu": 1}}}],
    }
    privileged = {
        "name": "root",
        "containers": [
            {
                "name": "m",
                "securityContext": {"privileged": True},
                "resources": {"limits": {"nvidia.com/gpu": 1}},
            }
        ],
    }
    workload = model.load_workload({"pods": [bare, privileged]}, config=CFG)
    a = analysis.analyse(
        engine.simulate(cluster, workload, config=CFG, node_policy=Policy.BINPACK, gpu_policy=Policy.BINPACK)
    )
    used = gpu_table(a)
    assert used["GPU-n1-0"][:3] == (10000, 100, 1)
    assert used["GPU-n1-1"][:3] == (10000, 100, 1)
    assert used["GPU-n2-0"][:3] == (20000, 100, 1)
    assert [p.pod.key for p in a.run.pending] == ["default/bare-3"]
    [rejected] = a.run.rejected
    assert rejected.pod.key == "default/root" and "privileged" in rejected.message
    assert (a.totals.placed, a.totals.pending, a.totals.rejected, a.totals.pods) == (3, 1, 1, 5)


def test_pod_policy_annotation_overrides_the_run() -> None:
    """Two 1000 MiB pods on n1 under GPU spread go to GPU 0 then GPU 1; the second one asks for
    binpack in its annotation and joins GPU 0 instead (score after 10 x (2/4 + 0 + 2000/10000) = 7
    beats 10 x (1/4 + 1000/10000) = 3.5)."""
    cluster = model.load_cluster(CLUSTER, config=CFG)
    first = gpu_pod("first", gpus=1, memory=1000, cores=0)
    second = {
        **gpu_pod("second", gpus=1, memory=1000, cores=0),
        "annotations": {"hami.io/gpu-scheduler-policy": "binpack"},
    }
    workload = model.load_workload({"pods": [first, second]}, config=CFG)
    a = analysis.analyse(
        engine.simulate(cluster, workload, config=CFG, node_policy=Policy.BINPACK, gpu_policy=Policy.SPREAD)
    )
    assert placements(a) == {"default/first": [["GPU-n1-0"]], "default/second": [["GPU-n1-0"]]}


def test_cluster_model_expands_replicas_and_groups() -> None:
    cluster = model.load_cluster(
        {
            "splitCount": 5,
            "nodes": [
                {
                    "name": "x",
                    "replicas": 2,
                    "gpus": [{"model": "A100", "memory": "40Gi", "count": 2, "numa": 1}],
                },
                {
                    "name": "y",
                    "gpus": [
                        {"model": "NVIDIA-T4", "memoryMib": 15360, "splitCount": 3, "healthy": False},
                        {"model": "V100", "memoryMib": 32768, "cores": 200},
                    ],
                },
            ],
        },
        config=CFG,
    )
    assert [n.node for n in cluster.nodes] == ["x-0", "x-1", "y"]
    x0 = cluster.nodes[0].gpus
    assert [(g.uuid, g.index, g.memory_mib, g.count, g.numa, g.type) for g in x0] == [
        ("GPU-x-0-0", 0, 40960, 5, 1, "NVIDIA-A100"),
        ("GPU-x-0-1", 1, 40960, 5, 1, "NVIDIA-A100"),
    ]
    t4, v100 = cluster.nodes[2].gpus
    assert (t4.type, t4.count, t4.health, t4.index) == ("NVIDIA-T4", 3, False, 0)
    assert (v100.cores, v100.count, v100.index, v100.uuid) == (200, 5, 1, "GPU-y-1")
    assert cluster.gpu_count == 6


def test_workload_model_accepts_manifests_and_short_pods() -> None:
    manifest = {
        "apiVersion": "v1",
        "kind": "Pod",
        "replicas": 2,
        "metadata": {"name": "m", "namespace": "ml", "annotations": {"nvidia.com/use-gputype": "a100"}},
        "spec": {
            "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpumem-percentage": 50}}}]
        },
    }
    workload = model.load_workload(
        {"pods": [manifest, gpu_pod("s", gpus=2, memory=100, cores=5)]}, config=CFG
    )
    assert [p.key for p in workload.pods] == ["ml/m-0", "ml/m-1", "default/s"]
    m0 = workload.pods[0]
    assert m0.pod["metadata"]["name"] == "m-0" and workload.pods[1].pod["metadata"]["name"] == "m-1"
    assert m0.request.selectors.use_types == ("a100",)
    [c] = m0.request.containers
    assert c is not None and (c.count, c.memory_percent) == (1, 50)


GARBAGE_CLUSTERS = [
    pytest.param(None, "cluster", id="empty-document"),
    pytest.param([], "cluster", id="a-list"),
    pytest.param({"nodes": []}, "cluster.nodes", id="no-nodes"),
    pytest.param(
        {"nodes": [{"gpus": [{"model": "T4", "memoryMib": 1}]}]}, "cluster.nodes[0].name", id="no-name"
    ),
    pytest.param({"nodes": [{"name": "a", "gpus": []}]}, "cluster.nodes[0].gpus", id="no-gpus"),
    pytest.param(
        {"nodes": [{"name": "a", "gpus": [{"model": "T4"}]}]}, "cluster.nodes[0].gpus[0]", id="no-memory"
    ),
    pytest.param(
        {"nodes": [{"name": "a", "gpus": [{"model": "T4", "memoryMib": "lots"}]}]},
        "cluster.nodes[0].gpus[0].memoryMib",
        id="memory-not-int",
    ),
    pytest.param(
        {"nodes": [{"name": "a", "gpus": [{"model": "T4", "memory": "16Q"}]}]},
        "cluster.nodes[0].gpus[0].memory",
        id="memory-bad-quantity",
    ),
    pytest.param(
        {"nodes": [{"name": "a", "gpus": [{"model": "T4", "memoryMib": 10, "count": -1}]}]},
        "cluster.nodes[0].gpus[0].count",
        id="negative-count",
    ),
    pytest.param(
        {"nodes": [{"name": "a", "gpus": [{"model": "T4", "memoryMib": 10, "healthy": "yes"}]}]},
        "cluster.nodes[0].gpus[0].healthy",
        id="health-not-bool",
    ),
    pytest.param(
        {"nodes": [{"name": "a", "gpus": [{"model": "T4", "memoryMib": 10, "colour": "red"}]}]},
        "cluster.nodes[0].gpus[0]",
        id="unknown-key",
    ),
    pytest.param(
        {"nodes": [{"name": "a", "count": 2, "replicas": 2, "gpus": [{"model": "T4", "memoryMib": 10}]}]},
        "cluster.nodes[0]",
        id="count-and-replicas",
    ),
    pytest.param(
        {
            "nodes": [
                {"name": "a", "gpus": [{"model": "T4", "memoryMib": 1}]},
                {"name": "a", "gpus": [{"model": "T4", "memoryMib": 1}]},
            ]
        },
        "cluster.nodes[1].name",
        id="duplicate-node",
    ),
    pytest.param(
        {"nodes": [{"name": "a", "splitCount": 0, "gpus": [{"model": "T4", "memoryMib": 1}]}]},
        "cluster.nodes[0].splitCount",
        id="zero-split",
    ),
]


@pytest.mark.parametrize(("raw", "field"), GARBAGE_CLUSTERS)
def test_garbage_cluster_is_a_config_error_naming_the_key(raw: Any, field: str) -> None:
    with pytest.raises(errors.ConfigError) as info:
        model.load_cluster(raw, config=CFG)
    assert info.value.field == field


GARBAGE_WORKLOADS = [
    pytest.param(None, "workload", id="empty-document"),
    pytest.param({"pods": "many"}, "workload.pods", id="pods-not-a-list"),
    pytest.param({"pods": [{"name": "x"}]}, "workload.pods[0].containers", id="no-containers"),
    pytest.param({"pods": [{"containers": [{"name": "c"}]}]}, "workload.pods[0].name", id="no-name"),
    pytest.param(
        {"pods": [{**gpu_pod("x", gpus=1, memory=1, cores=1), "replicas": 0}]},
        "workload.pods[0].replicas",
        id="zero-replicas",
    ),
    pytest.param(
        {"pods": [{**gpu_pod("x", gpus=1, memory=1, cores=1), "annotations": {"a": 1}}]},
        "workload.pods[0].annotations",
        id="annotation-not-string",
    ),
    pytest.param(
        {"pods": [gpu_pod("x", gpus=1, memory=1, cores=1), gpu_pod("x", gpus=1, memory=1, cores=1)]},
        "workload.pods[1].name",
        id="duplicate-pod",
    ),
    pytest.param(
        {"pods": [{"kind": "Deployment", "metadata": {"name": "d"}, "spec": {}}]},
        "workload.pods[0].kind",
        id="not-a-pod",
    ),
    pytest.param(
        {
            "pods": [
                {
                    "name": "x",
                    "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpumem": "lots"}}}],
                }
            ]
        },
        "workload.pods[0] (default/x): container c: nvidia.com/gpumem",
        id="bad-quantity",
    ),
    pytest.param(
        {
            "pods": [
                {
                    "name": "x",
                    "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpucores": 150}}}],
                }
            ]
        },
        "workload.pods[0] (default/x): container c: nvidia.com/gpucores",
        id="cores-over-100",
    ),
]


@pytest.mark.parametrize(("raw", "field"), GARBAGE_WORKLOADS)
def test_garbage_workload_is_a_config_error_naming_the_pod(raw: Any, field: str) -> None:
    with pytest.raises(errors.ConfigError) as info:
        model.load_workload(raw, config=CFG)
    assert info.value.field == field


def write_case(tmp_path: Path) -> tuple[Path, Path]:
    cluster, workload = tmp_path / "cluster.yaml", tmp_path / "workload.yaml"
    cluster.write_text(yaml.safe_dump(CLUSTER))
    workload.write_text(yaml.safe_dump(WORKLOAD))
    return cluster, workload


def call(**opts: Any) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = simulate.main_simulate(opts, out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def test_json_output_schema(tmp_path: Path) -> None:
    cluster, workload = write_case(tmp_path)
    code, out, err = call(
        cluster=str(cluster), workload=str(workload), json=True, node_policy="binpack", gpu_policy="binpack"
    )
    assert code == 0, err
    doc = json.loads(out)
    assert doc["schemaVersion"] == report.SCHEMA_VERSION
    assert doc["cluster"] == {"nodes": 2, "draNodes": 0, "gpus": 3}
    assert doc["workload"] == {"pods": 6}
    assert doc["typical"] == {"cores": 30, "memoryMibByGpuMemoryMib": {"10000": 4000, "20000": 4000}}
    [run] = doc["runs"]
    assert (run["nodePolicy"], run["gpuPolicy"]) == ("binpack", "binpack")
    summary = run["summary"]
    assert summary["podsPlaced"] == 5 and summary["podsPending"] == 1 and summary["podsRejected"] == 0
    assert summary["strandedMemoryMib"] == 1000 and summary["freeMemoryMib"] == 17000
    assert summary["fragmentation"] == pytest.approx(1000 / 17000, abs=1e-6)
    assert {type(v) for k, v in summary.items() if k != "fragmentation"} == {int}
    placement = next(p for p in run["placements"] if p["pod"] == "default/c")
    assert placement["node"] == "n1"
    assert placement["containers"] == [
        [
            {"uuid": "GPU-n1-0", "memoryMib": 1000, "cores": 0},
            {"uuid": "GPU-n1-1", "memoryMib": 1000, "cores": 0},
        ]
    ]
    [pending] = run["pending"]
    assert pending["pod"] == "default/d" and set(pending["nodes"]) == {"n1", "n2"}
    assert all(set(v) == {"reason", "unresolvable"} for v in pending["nodes"].values())
    assert run["rejected"] == []
    gpu_keys = {
        "node",
        "mode",
        "index",
        "uuid",
        "model",
        "numa",
        "healthy",
        "cordoned",
        "memoryUsedMib",
        "memoryMib",
        "coresUsed",
        "cores",
        "slotsUsed",
        "slots",
        "strandedMib",
        "pods",
    }
    assert [set(g) for g in run["gpus"]] == [gpu_keys] * 3
    n1_0 = run["gpus"][0]
    assert (n1_0["uuid"], n1_0["memoryUsedMib"], n1_0["slotsUsed"], n1_0["pods"]) == (
        "GPU-n1-0",
        9000,
        3,
        ["default/a-0", "default/a-1", "default/c"],
    )


def test_text_report_names_pending_reason_and_fragmentation(tmp_path: Path) -> None:
    cluster, workload = write_case(tmp_path)
    code, out, _ = call(
        cluster=str(cluster), workload=str(workload), node_policy="binpack", gpu_policy="binpack"
    )
    assert code == 0
    assert "pods: 5 placed, 1 pending, 0 rejected at admission" in out
    assert "default/d PENDING: " in out
    assert "fragmentation: 1000 MiB stranded of 17000 MiB free (5.9%)" in out
    row = next(line for line in out.splitlines() if line.startswith("n1") and " 0 " in line)
    assert row.split()[:8] == ["n1", "0", "T4", "ok", "9000/10000", "90.0%", "60/100", "3/4"]


def test_compare_puts_every_policy_pair_in_one_table(tmp_path: Path) -> None:
    cluster, workload = write_case(tmp_path)
    code, out, _ = call(cluster=str(cluster), workload=str(workload), compare=True)
    assert code == 0
    lines = out.splitlines()
    header = next(line for line in lines if line.startswith("node/GPU policy"))
    assert header.split()[2:] == ["binpack/binpack", "binpack/spread", "spread/binpack", "spread/spread"]
    stranded = next(line for line in lines if line.startswith("stranded memory MiB")).split()[3:]
    assert stranded[0] == "1000" and stranded[3] == "7000"
    code, out, _ = call(cluster=str(cluster), workload=str(workload), compare=True, json=True)
    assert [(r["nodePolicy"], r["gpuPolicy"]) for r in json.loads(out)["runs"]] == [
        ("binpack", "binpack"),
        ("binpack", "spread"),
        ("spread", "binpack"),
        ("spread", "spread"),
    ]


def test_config_file_sets_the_default_policies_and_split(tmp_path: Path) -> None:
    cluster, workload = write_case(tmp_path)
    cfg = tmp_path / "vgpu.yaml"
    cfg.write_text("scheduler: {nodePolicy: spread, gpuPolicy: spread}\n")
    code, out, _ = call(cluster=str(cluster), workload=str(workload), config=str(cfg), json=True)
    assert code == 0
    [run] = json.loads(out)["runs"]
    assert (run["nodePolicy"], run["gpuPolicy"], run["summary"]["strandedMemoryMib"]) == (
        "spread",
        "spread",
        7000,
    )


@pytest.mark.parametrize(
    ("cluster_text", "workload_text", "config_text", "needle"),
    [
        pytest.param(None, "pods: []", None, "No such file", id="missing-cluster"),
        pytest.param("nodes: [", "pods: []", None, "invalid YAML", id="bad-yaml"),
        pytest.param("nodes: []", "pods: []", None, "cluster.nodes", id="empty-nodes"),
        pytest.param(
            yaml.safe_dump(CLUSTER),
            "pods: [{name: x}]",
            None,
            "workload.pods[0].containers",
            id="bad-workload",
        ),
        pytest.param(
            yaml.safe_dump(CLUSTER),
            yaml.safe_dump(WORKLOAD),
            "scheduler: {nodePolicy: random}",
            "nodePolicy",
            id="bad-config",
        ),
    ],
)
def test_bad_inputs_exit_2_with_the_file_and_key(
    tmp_path: Path, cluster_text: str | None, workload_text: str, config_text: str | None, needle: str
) -> None:
    cluster, workload, cfg = tmp_path / "c.yaml", tmp_path / "w.yaml", tmp_path / "cfg.yaml"
    if cluster_text is not None:
        cluster.write_text(cluster_text)
    workload.write_text(workload_text)
    opts: dict[str, Any] = {"cluster": str(cluster), "workload": str(workload)}
    if config_text is not None:
        cfg.write_text(config_text)
        opts["config"] = str(cfg)
    code, out, err = call(**opts)
    assert code == 2
    assert out == ""
    assert needle in err and err.startswith("vgpu simulate: ")


def test_binary_file_is_an_input_error(tmp_path: Path) -> None:
    cluster = tmp_path / "c.yaml"
    cluster.write_bytes(b"\xff\xfe\x00garbage")
    code, _, err = call(cluster=str(cluster), workload=str(cluster))
    assert code == 2 and "not UTF-8" in err


def test_add_arguments_parses_the_documented_options() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    simulate.add_arguments(parser)
    opts = parser.parse_args(
        [
            "--cluster",
            "c.yaml",
            "--workload",
            "w.yaml",
            "--node-policy",
            "spread",
            "--gpu-policy",
            "binpack",
            "--compare",
            "--json",
            "--html",
            "r.html",
        ]
    )
    assert (opts.cluster, opts.workload, opts.node_policy, opts.gpu_policy) == (
        "c.yaml",
        "w.yaml",
        "spread",
        "binpack",
    )
    assert (opts.compare, opts.json, opts.html, opts.config) == (True, True, "r.html", None)
    with pytest.raises(SystemExit):
        parser.parse_args(["--cluster", "c.yaml", "--workload", "w.yaml", "--node-policy", "random"])


def test_examples_run(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[2] / "examples"
    html = tmp_path / "r.html"
    code, out, err = call(
        cluster=str(root / "cluster.yaml"), workload=str(root / "workload.yaml"), html=str(html)
    )
    assert code == 0, err
    assert "PENDING" in out and "default/huge" in out
    assert html.read_text().startswith("<!DOCTYPE html>")


def test_container_that_is_not_a_mapping_is_named() -> None:
    raw = {"pods": [{"name": "x", "initContainers": [{"name": "i"}, "oops"], "containers": [{"name": "c"}]}]}
    with pytest.raises(errors.ConfigError) as info:
        model.load_workload(raw, config=CFG)
    assert info.value.field == "workload.pods[0].initContainers[1]"


def test_cordoned_gpu_takes_no_pods_and_strands_its_memory() -> None:
    """n1 GPU 0 cordoned: the 4000 MiB pod goes to GPU 1 (the only open GPU of n1 under node binpack:
    both nodes score 0, n1 sorts first). The typical container (4000 MiB, 0 %) fits on the open
    GPUs, not on the cordoned one: its 10000 free MiB are stranded; free 10000 + 6000 + 20000."""
    raw = {
        "nodes": [
            {
                "name": "n1",
                "gpus": [
                    {"model": "T4", "memoryMib": 10000, "cordoned": True},
                    {"model": "T4", "memoryMib": 10000},
                ],
            },
            {"name": "n2", "gpus": [{"model": "A10", "memoryMib": 20000}]},
        ]
    }
    cluster = model.load_cluster(raw, config=CFG)
    assert cluster.cordoned == frozenset({"GPU-n1-0"})
    workload = model.load_workload({"pods": [gpu_pod("a", gpus=1, memory=4000, cores=0)]}, config=CFG)
    a = analysis.analyse(
        engine.simulate(cluster, workload, config=CFG, node_policy=Policy.BINPACK, gpu_policy=Policy.SPREAD)
    )
    assert placements(a) == {"default/a": [["GPU-n1-1"]]}
    assert gpu_table(a)["GPU-n1-0"] == (0, 0, 0, 10000)
    assert (a.totals.free_mib, a.totals.stranded_mib) == (36000, 10000)
    assert [r.cordoned for r in a.gpus] == [True, False, False]
    text = report.render_text(a)
    assert next(line for line in text.splitlines() if line.startswith("n1") and "cordoned" in line).split()[
        :2
    ] == ["n1", "0"]
