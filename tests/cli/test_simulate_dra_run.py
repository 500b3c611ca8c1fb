"""``vgpu simulate --dra``, through the real command line: the DRA nodes of the file take part in the
run, DRA pods (by namespace label, pod annotation or the config's default mode) are converted by the
webhook's own code and placed by kube-scheduler's allocation, extender pods keep the extender's fit;
checked by recomputing every GPU's usage from the input file and the reported placements."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from vgpu.core import quantity
from vgpu.core.dra import names

from tests.cli.simdra import gpu_pod, held_claim, node_slice

CLUSTER = {"nodes": [{"name": "ext", "gpus": [{"model": "A100", "memoryMib": 40000}]}]}
NAMESPACE = {
    "apiVersion": "v1",
    "kind": "Namespace",
    "metadata": {"name": "team", "labels": {names.MODE_ANNOTATION: "dra"}},
}
OBJECTS = [
    NAMESPACE,
    node_slice("dra-1", 16000, 16000),
    held_claim("dra-1", 0, namespace="team", pod="old", memory_mib=6000, cores=30),
    {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "other"}},
]
# GPU 0 has 10000 MiB and 70 % cores left, GPU 1 all of its 16000 MiB: the first three fill both
WORKLOAD = [
    gpu_pod("half-0", memory=5000, cores=35, mode=None),  # DRA by the namespace's label
    gpu_pod("half-1", memory=5000, cores=35, mode=None),
    gpu_pod("whole", memory=16000, cores=100, mode=None),
    gpu_pod("extra", memory=1000, cores=1, mode=None),  # nothing left anywhere in the DRA mode
    gpu_pod("legacy", memory=8000, cores=20, mode="extender"),  # the annotation wins: the extender's
    gpu_pod("plain", memory=4000, cores=10, namespace="default", mode=None),  # the config's default
]


def vgpu(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "vgpu.cli", "simulate", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def write(tmp_path: Path, objects: Any) -> list[str]:
    files = {
        "cluster.yaml": CLUSTER,
        "workload.yaml": WORKLOAD,
        "dra.yaml": {"kind": "List", "items": objects},
    }
    for name, doc in files.items():
        (tmp_path / name).write_text(
            yaml.safe_dump(doc) if name != "workload.yaml" else yaml.safe_dump_all(doc)
        )
    return [
        *("--cluster", str(tmp_path / "cluster.yaml")),
        *("--workload", str(tmp_path / "workload.yaml")),
        *("--dra", str(tmp_path / "dra.yaml")),
    ]


def _held_by_the_file() -> dict[tuple[str, str], list[int]]:
    """(pool, device) -> [memory MiB, cores] the input file's claims hold."""
    out: dict[tuple[str, str], list[int]] = {}
    for obj in OBJECTS:
        if obj["kind"] != "ResourceClaim":
            continue
        for r in obj["status"]["allocation"]["devices"]["results"]:
            used = out.setdefault((r["pool"], r["device"]), [0, 0])
            used[0] += quantity.parse_mib(r["consumedCapacity"]["memory"], field="memory")
            used[1] += quantity.parse_int(r["consumedCapacity"]["cores"], field="cores")
    return out


def test_dra_pods_fill_the_partly_held_node_and_the_rest_is_explained(tmp_path: Path) -> None:
    done = vgpu(*write(tmp_path, OBJECTS), "--json")
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    doc = json.loads(done.stdout)
    [run] = doc["runs"]
    assert doc["cluster"] == {"nodes": 2, "draNodes": 1, "gpus": 3}
    modes = {p["pod"]: (p["mode"], p["node"]) for p in run["placements"]}
    assert modes == {
        "team/half-0": ("dra", "dra-1"),
        "team/half-1": ("dra", "dra-1"),
        "team/whole": ("dra", "dra-1"),
        "team/legacy": ("extender", "ext"),
        "default/plain": ("extender", "ext"),
    }
    [pending] = run["pending"]
    assert pending["pod"] == "team/extra"
    dra_rows = [r for r in run["gpus"] if r["mode"] == "dra"]
    best = max((r["memoryMib"] - r["memoryUsedMib"], r["cores"] - r["coresUsed"]) for r in dra_rows)
    assert pending["nodes"]["dra-1"] == {
        "reason": f"cannot allocate all claims (best GPU free: {best[0]} MiB, {best[1]}% cores)",
        "unresolvable": True,
    }
    summary = run["summary"]
    assert summary["podsPlaced"] == len(run["placements"]) and summary["podsPending"] == 1
    assert summary["podsPlacedDra"] == sum(1 for p in run["placements"] if p["mode"] == "dra")

    # every GPU's row = what the file held + what the reported placements put there, within its size
    held = _held_by_the_file()
    placed: dict[str, list[int]] = {}
    for p in run["placements"]:
        for container in p["containers"]:
            for d in container:
                got = placed.setdefault(d["uuid"], [0, 0])
                got[0] += d["memoryMib"]
                got[1] += d["cores"]
    for row in run["gpus"]:
        before = held.get((row["node"], f"gpu-{row['index']}"), [0, 0]) if row["mode"] == "dra" else [0, 0]
        after = placed.get(row["uuid"], [0, 0])
        assert row["memoryUsedMib"] == before[0] + after[0] <= row["memoryMib"], row
        assert row["coresUsed"] == before[1] + after[1] <= row["cores"], row
    assert [(r["memoryUsedMib"], r["coresUsed"]) for r in dra_rows] == [
        (r["memoryMib"], r["cores"]) for r in dra_rows
    ]
    assert {pod for r in dra_rows for pod in r["pods"]} == {
        "team/old",
        "team/half-0",
        "team/half-1",
        "team/whole",
    }
    # the section on what the file held is still the file's alone
    [node] = doc["dra"]["nodes"]
    assert [g["usedMib"] for g in node["gpus"]] == [
        held.get(("dra-1", f"gpu-{g['index']}"), [0])[0] for g in node["gpus"]
    ]


def test_the_text_report_marks_dra_placements(tmp_path: Path) -> None:
    done = vgpu(*write(tmp_path, OBJECTS))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "(3 by kube-scheduler's DRA allocation)" in lines[3]
    assert [line.split(" -> ")[0].strip() for line in lines if " (DRA): " in line] == [
        "team/half-0",
        "team/half-1",
        "team/whole",
    ]
    rows = [line.split() for line in lines if line.startswith("dra-1 ")]
    assert [r[5] for r in rows] == ["16000/16000", "16000/16000"]
    assert (
        "DRA held before the run (the --dra file's allocated claims): 1 nodes; 1 objects of other kinds ignored"
        in lines
    )


GARBAGE = [
    NAMESPACE,
    node_slice("dra-1", 16000),
    {"kind": "ResourceSlice", "metadata": {"name": "junk"}, "spec": {"driver": names.DRIVER, "pool": 7}},
    {"kind": "ResourceSlice", "metadata": "junk"},
    {
        "kind": "ResourceSlice",
        "metadata": {"name": "bad-capacity"},
        "spec": {
            "driver": names.DRIVER,
            "nodeName": "dra-2",
            "pool": {"name": "dra-2", "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0", "capacity": {"memory": {"value": "lots"}}}],
        },
    },
    {
        "kind": "ResourceClaim",
        "metadata": {"name": "c1", "namespace": "team"},
        "status": {"allocation": ["x"]},
    },
    {
        "kind": "ResourceClaim",
        "metadata": {"name": "c2", "namespace": "team"},
        "status": {"allocation": {"devices": {"results": 5}}},
    },
    {"kind": "ResourceClaim", "metadata": 9},
    {"kind": "ResourceClaimTemplate", "metadata": {"name": "t", "namespace": "team"}, "spec": "x"},
    {"kind": "DeviceClass", "metadata": {"name": names.DEVICE_CLASS}, "spec": {"selectors": "x"}},
    "not an object",
]


def test_garbage_dra_objects_are_reported_never_a_traceback(tmp_path: Path) -> None:
    args = write(tmp_path, GARBAGE)
    text, as_json = vgpu(*args), vgpu(*args, "--json")
    for done in (text, as_json):
        assert done.returncode == 0 and done.stderr == "", done.stderr
    problems = [line for line in text.stdout.splitlines() if line.startswith("  ! DRA: ")]
    assert any("ResourceSlice junk: no spec.pool.name" in p for p in problems)
    assert any(p.startswith("  ! DRA: node dra-2: ") for p in problems)
    assert any("ResourceClaim team/c1: allocation unreadable" in p for p in problems)
    doc = json.loads(as_json.stdout)
    [run] = doc["runs"]
    assert len(run["draProblems"]) == len(problems)
    # the DRA pods still get an answer: the garbage DeviceClass cannot be read, so every one waits
    # with the allocator's reason, as kube-scheduler would keep them pending
    pending = {p["pod"]: p["reason"] for p in run["pending"]}
    assert {"team/half-0", "team/half-1", "team/whole", "team/extra"} <= set(pending)
    assert all(
        "cannot read the pod's claims" in pending[p]
        for p in pending
        if p.startswith("team/") and p != "team/legacy"
    )


def test_the_configs_default_mode_and_the_conversions_refusals(tmp_path: Path) -> None:
    """``webhook.defaultMode: dra`` (``--config``) puts every pod without a mode in the DRA mode; a
    percentage with no GPU size published is refused at admission with the conversion's message."""
    from vgpu.simulate import command

    config = tmp_path / "vgpu.yaml"
    config.write_text(yaml.safe_dump({"webhook": {"defaultMode": "dra"}}))
    pods = [
        gpu_pod("plain", memory=4000, namespace="default", mode=None),
        gpu_pod("pct", percent=50, mode=None),
    ]
    for name, doc in {
        "cluster.yaml": CLUSTER,
        "dra.yaml": {"kind": "List", "items": [node_slice("dra-1", 16000)]},
    }.items():
        (tmp_path / name).write_text(yaml.safe_dump(doc))
    (tmp_path / "workload.yaml").write_text(yaml.safe_dump_all(pods))
    files = {"cluster": str(tmp_path / "cluster.yaml"), "workload": str(tmp_path / "workload.yaml")}
    [with_dra] = command.run({**files, "config": str(config), "dra": str(tmp_path / "dra.yaml")})
    assert {(p.pod.key, p.pod.dra, p.node) for p in with_dra.run.placed} == {
        ("default/plain", True, "dra-1"),
        ("team/pct", True, "dra-1"),
    }
    [without] = command.run({**files, "config": str(config)})
    assert [p.pod.key for p in without.run.pending] == ["default/plain"]  # no DRA node to take it
    [refused] = without.run.rejected
    assert (
        refused.pod.key == "team/pct" and "gpumem-percentage needs the GPUs' memory sizes" in refused.message
    )
