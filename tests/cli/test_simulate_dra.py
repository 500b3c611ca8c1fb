"""``vgpu simulate --dra FILE``: the capacity DRA claims hold, from ResourceSlices and ResourceClaims
as kubectl lists them, reported beside the run (text and JSON); the run itself is unchanged."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from vgpu.simulate import command as simulate
from vgpu.simulate import dra

from tests.cli.test_simulate import write_case
from tests.core.dra.dra_objects import claim, gpu_device, resource_slice, result

OBJECTS = [
    resource_slice("dra-1", gpu_device(0, "GPU-d0", memory_mib=16000, model="Tesla T4")),
    claim("team", "train-vgpu-0", result("dra-1", 0, memory="4000Mi", cores="30"), reserved=("train",)),
    claim("team", "wait-vgpu-0", result("dra-1", 0)),  # not reserved yet; memory at the default (whole)
    {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}},
]


def call(**opts: Any) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = simulate.main_simulate(opts, out=out, err=err)
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize(
    "shape",
    [
        {"apiVersion": "v1", "kind": "List", "items": OBJECTS},
        OBJECTS,
    ],
    ids=["kubectl-list", "plain-list"],
)
def test_load_reads_kubectl_lists_and_ignores_other_kinds(shape: Any) -> None:
    held = dra.load([shape] if isinstance(shape, dict) else shape)
    assert held.ignored == 1
    node = held.usage.nodes["dra-1"]
    [gpu] = node.inventory.gpus
    used = node.used[gpu.uuid]
    assert (used.slots, used.memory_mib, used.cores) == (
        2,
        20000,
        30,
    )  # 4000 + 16000: the sum shows overcommit
    assert [h.shown for h in node.holders[gpu.uuid]] == ["team/claim:wait-vgpu-0", "team/train"]


def test_text_report_appends_the_dra_section(tmp_path: Path) -> None:
    cluster, workload = write_case(tmp_path)
    objects = tmp_path / "dra.yaml"
    objects.write_text(yaml.safe_dump_all(OBJECTS))
    code, out, err = call(cluster=str(cluster), workload=str(workload), dra=str(objects))
    assert code == 0 and err == ""
    _, _, section = out.partition("\nDRA held before the run (the --dra file's allocated claims)")
    assert section.splitlines() == [
        ": 1 nodes; 1 objects of other kinds ignored",
        "  dra-1 GPU 0 Tesla T4 ok: memory 20000/16000 MiB (125.0%), cores 30/100, 2 shares; pods "
        "team/claim:wait-vgpu-0,team/train",
        "DRA allocated: memory 20000/16000 MiB (125.0%), cores 30/100 (30.0%), 2 shares",
    ]
    # the DRA node is one of the run's: its GPU is a row of the table, with what the file held
    [row] = [line.split() for line in out.splitlines() if line.startswith("dra-1 ")]
    assert row[:7] == ["dra-1", "0", "Tesla", "T4", "ok", "20000/16000", "125.0%"]


def test_json_report_has_a_dra_key(tmp_path: Path) -> None:
    cluster, workload = write_case(tmp_path)
    objects = tmp_path / "dra.yaml"
    objects.write_text(yaml.safe_dump({"kind": "List", "items": OBJECTS}))
    code, out, _ = call(cluster=str(cluster), workload=str(workload), dra=str(objects), json=True)
    assert code == 0
    doc = json.loads(out)
    assert doc["dra"]["simulated"] is False and doc["dra"]["problems"] == []
    [node] = doc["dra"]["nodes"]
    [gpu] = node["gpus"]
    assert (gpu["uuid"], gpu["usedMib"], gpu["usedCores"], gpu["shares"]) == ("GPU-d0", 20000, 30, 2)
    assert gpu["pods"][1] == {"holder": "team/train", "claim": "train-vgpu-0", "memoryMib": 4000, "cores": 30}
    _, without, _ = call(cluster=str(cluster), workload=str(workload), json=True)
    assert "dra" not in json.loads(without)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("- 3\n", "DRA objects file {path}: document 0: expected an object, got list"),
        (
            "kind: List\nitems: 7\n",
            "DRA objects file {path}: document 0.items: a List's items must be a list",
        ),
        ("a: [\n", "DRA objects file {path}: invalid YAML"),
    ],
    ids=["not-objects", "list-items", "yaml"],
)
def test_a_garbage_file_is_exit_2_naming_it(tmp_path: Path, text: str, message: str) -> None:
    cluster, workload = write_case(tmp_path)
    objects = tmp_path / "dra.yaml"
    objects.write_text(text)
    code, out, err = call(cluster=str(cluster), workload=str(workload), dra=str(objects))
    assert code == 2 and out == ""
    assert err.startswith("vgpu simulate: " + message.format(path=objects))


def test_garbage_inside_the_objects_is_reported_not_fatal(tmp_path: Path) -> None:
    cluster, workload = write_case(tmp_path)
    objects = tmp_path / "dra.yaml"
    bad = [OBJECTS[0], claim("team", "junk", result("dra-1", 0, memory="lots")), {"kind": "ResourceSlice"}]
    objects.write_text(yaml.safe_dump_all(bad))
    code, out, _ = call(cluster=str(cluster), workload=str(workload), dra=str(objects))
    assert code == 0
    _, _, held = out.partition("\nDRA held before the run")
    problems = [line for line in held.splitlines() if line.startswith("  ! ")]
    assert len(problems) == 1 and problems[0].startswith("  ! ResourceClaim team/junk: ")
    # the run leaves both out too, and says so under its table
    run_problems = [line for line in out.splitlines() if line.startswith("  ! DRA: ")]
    assert [p.split(":")[1].strip() for p in run_problems] == ["ResourceSlice ?", "ResourceClaim team/junk"]
