"""``vgpu status`` with nodes in the DRA mode: our ResourceSlices and the claims allocated on them
appear in the same table as the extender's nodes, marked ``DRA (ResourceSlice)``.

The local cluster's store serves no ``resource.k8s.io`` kinds yet (the emulation adds them), so
``DraLists`` serves the slices and claims beside it, as recorded ``resource.k8s.io/v1`` JSON;
``tests/realk8s/test_status_dra_real.py`` reads the same objects from a real kube-apiserver."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from vgpu.core import annotations, config, errors
from vgpu.core.device import Gpu, GpuUsage, GpuUuid
from vgpu.kube.port import Kind, ObjectList
from vgpu.localcluster.client import LocalKubeApi
from vgpu.localcluster.store import Store
from vgpu.status import snapshot, table

from tests.cli import test_status as local
from tests.core.dra.dra_objects import claim, gpu_device, resource_slice, result

CFG = config.load(None)
KEYS = annotations.KEYS
NOW = local.NOW
D0, D1 = GpuUuid("GPU-d0"), GpuUuid("GPU-d1")


class DraLists(LocalKubeApi):
    """The local cluster plus DRA objects to list (or the error their list answers)."""

    def __init__(self, store: Store, *, slices: list[Any], claims: list[Any], error: Exception | None = None):
        super().__init__(store)
        self.dra: dict[str, list[Any]] = {"resourceslices": slices, "resourceclaims": claims}
        self.error = error

    async def list(self, kind: Kind, **kwargs: Any) -> ObjectList:
        if kind in self.dra:
            if self.error is not None:
                raise self.error
            return ObjectList(list(self.dra[kind]), "1")
        return await super().list(kind, **kwargs)


def _cluster(**kwargs: Any) -> DraLists:
    store = Store()
    a = [Gpu(GpuUuid("GPU-a0"), 0, 10, 40960, 100, "NVIDIA-A100")]
    store.create("nodes", local.node("gpu-a", {KEYS.node_register: annotations.encode_node_register(a)}))
    store.create("nodes", local.node("dra-1"))  # a DRA node has no register annotation, no lease
    store.create("leases", local.lease("gpu-a", NOW), namespace="kube-system")
    store.create("pods", local.pod("p1", "gpu-a", "GPU-a0,NVIDIA,4000,30:;"), namespace="default")
    defaults: dict[str, Any] = {
        "slices": [
            resource_slice(
                "dra-1",
                gpu_device(0, "GPU-d0", memory_mib=15360, model="Tesla T4"),
                gpu_device(1, "GPU-d1", memory_mib=15360, model="Tesla T4", unhealthy=True),
            )
        ],
        "claims": [
            claim("team", "train-vgpu-0", result("dra-1", 0, memory="4Gi", cores="30"), reserved=("train",)),
            claim("team", "infer-vgpu-0", result("dra-1", 0, memory="2Gi"), owner="infer"),
        ],
    }
    return DraLists(store, **{**defaults, **kwargs})


async def test_dra_nodes_join_the_snapshot() -> None:
    """dra-1 GPU 0: train (4096 MiB, 30 %) + infer (2048 MiB, cores at the policy default 0) = 2
    shares; GPU 1 is tainted unhealthy. The Node dra-1 is not counted among the nodes without GPUs."""
    snap = await snapshot.collect(_cluster(), config=CFG, now=lambda: NOW)
    assert [(n.name, n.mode) for n in snap.nodes] == [("dra-1", "dra"), ("gpu-a", "extender")]
    assert snap.other_nodes == 0 and snap.warnings == ()
    dra = snap.nodes[0]
    assert [(r.gpu.uuid, r.used, r.pods, r.gpu.health) for r in dra.gpus] == [
        (D0, GpuUsage(slots=2, memory_mib=6144, cores=30), ("team/infer", "team/train"), True),
        (D1, GpuUsage(), (), False),
    ]
    assert dra.gpus[0].gpu.type == "NVIDIA-Tesla T4"  # the model column reads "Tesla T4" in both modes


async def test_render_marks_dra_nodes_and_counts_their_shares() -> None:
    text = table.render(await snapshot.collect(_cluster(), config=CFG, now=lambda: NOW))
    lines = text.splitlines()
    assert lines[0] == "kube-vgpu status at 2026-11-23 02:00:00 UTC: 2 GPU nodes"
    row = next(line for line in lines if line.startswith("dra-1"))
    assert row.split() == [
        "dra-1", "DRA", "(ResourceSlice)", "0", "Tesla", "T4", "ok", "6144/15360", "40.0%", "-", "30/100",
        "2/-", "team/infer,team/train",
    ]  # fmt: skip
    assert any("UNHEALTHY" in line and "1/-" not in line and "0/-" in line for line in lines)
    assert next(line for line in lines if line.startswith("gpu-a")).split()[1:4] == [
        "reporting",
        "(0s",
        "ago)",
    ]
    assert lines[-1] == (
        "allocated: memory 10144/71680 MiB (14.2%), cores 60/300 (20.0%), slots 1/10, 2 DRA shares; 3 GPUs, "
        "1 unhealthy"
    )


async def test_garbage_dra_objects_are_warnings_not_failures() -> None:
    bad_slice = resource_slice("dra-2", {**gpu_device(0, "GPU-x"), "attributes": {}})
    cluster = _cluster(
        slices=[*_cluster().dra["resourceslices"], bad_slice, "not a slice"],
        claims=[
            *_cluster().dra["resourceclaims"],
            claim("team", "lost", result("dra-1", 5, memory="1Gi"), reserved=("ghost",)),
            claim("team", "junk", result("dra-1", 0, memory="lots")),
        ],
    )
    snap = await snapshot.collect(cluster, config=CFG, now=lambda: NOW)
    by_name = {(n.name, n.mode): n for n in snap.nodes}
    assert by_name["dra-1", "dra"].gpus[0].used.memory_mib == 6144  # the good claims still count
    assert by_name["dra-1", "dra"].warnings == (
        "ResourceClaim team/lost holds gpu-5 on node dra-1, whose ResourceSlice does not publish it "
        "(gone or unhealthy)",
    )
    assert by_name["dra-2", "dra"].gpus == ()
    assert (
        by_name["dra-2", "dra"]
        .warnings[0]
        .startswith("ResourceSlice dra-2-gpu.kube-vgpu.io spec.devices[0]:")
    )
    [junk] = snap.warnings
    assert junk.startswith("ResourceClaim team/junk: ") and "lots" in junk
    text = table.render(snap)
    assert "  ! dra-1: ResourceClaim team/lost holds gpu-5" in text and "  ! ResourceClaim team/junk" in text


async def test_a_node_in_both_modes_is_shown_twice_with_a_warning() -> None:
    both = resource_slice("gpu-a", gpu_device(0, "GPU-a0"))
    snap = await snapshot.collect(_cluster(slices=[both]), config=CFG, now=lambda: NOW)
    assert [(n.name, n.mode) for n in snap.nodes] == [("gpu-a", "extender"), ("gpu-a", "dra")]
    assert snap.warnings[0].startswith("node gpu-a has GPUs in both modes")


@pytest.mark.parametrize(
    ("error", "warned"),
    [
        (errors.NotFound("the server could not find the requested resource", status=404), False),
        (errors.KubeError("resourceslices is forbidden", status=403, reason="Forbidden"), True),
    ],
    ids=["not-served", "forbidden"],
)
async def test_without_resource_k8s_io_the_extender_table_still_shows(error: Exception, warned: bool) -> None:
    snap = await snapshot.collect(_cluster(error=error), config=CFG, now=lambda: NOW)
    assert [(n.name, n.mode) for n in snap.nodes] == [("gpu-a", "extender")]
    assert snap.other_nodes == 1  # dra-1, without its slices, is a node without GPUs
    assert bool(snap.warnings) is warned
    if warned:
        assert snap.warnings[0].startswith("DRA nodes not shown: cannot list resourceslices: ")


async def test_other_errors_still_fail_the_read() -> None:
    with pytest.raises(errors.KubeError):
        await snapshot.collect(
            _cluster(error=errors.KubeError("connection refused", status=0)),
            config=CFG,
            now=lambda: datetime.datetime.now(datetime.UTC),
        )
