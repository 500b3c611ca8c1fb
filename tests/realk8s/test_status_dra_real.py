"""``vgpu status`` through the official ``kubernetes`` client against a real kube-apiserver (1.36:
``resource.k8s.io/v1``, consumable capacity on by default), with our ResourceSlice and claims whose
allocation is written as kube-scheduler writes it (marked ``realk8s``). The API server validates
the objects, so the views read what a cluster really serves; the numbers equal those read from the
recorded objects (``tests/cli/test_status_dra.py``)."""

from __future__ import annotations

import datetime
import pathlib
from typing import Any

import pytest
from vgpu.core import config
from vgpu.core.device import GpuUsage
from vgpu.kube import aioapi, kubeconfig
from vgpu.status import command, snapshot, table

from bench import realk8s
from tests.core.dra.dra_objects import claim, gpu_device, resource_slice, result

pytestmark = [pytest.mark.realk8s, pytest.mark.slow, pytest.mark.timeout(300)]

CFG = config.load(None)


async def _allocated(api: aioapi.AioKubeApi, obj: dict[str, Any]) -> None:
    """Create the claim, then write its status (allocation, reservedFor) as kube-scheduler does."""
    meta = obj["metadata"]
    body = {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "metadata": meta, "spec": obj["spec"]}
    body["metadata"] = {k: v for k, v in meta.items() if k not in {"uid", "ownerReferences"}}
    await api.create("resourceclaims", body, namespace=meta["namespace"])
    status = dict(obj["status"])
    if "allocation" in status:  # an allocation names the nodes it is usable on
        status["allocation"] = {
            **status["allocation"],
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["dra-1"]}]}
                ]
            },
        }
    await api.merge_patch_status(
        "resourceclaims", meta["name"], {"status": status}, namespace=meta["namespace"]
    )


async def test_status_reads_dra_slices_and_claims_from_a_real_api_server(
    k8s_bin: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    now = datetime.datetime.now(datetime.UTC)
    async with realk8s.control_plane(k8s_bin, tmp_path, now=now) as plane:
        async with aioapi.AioKubeApi(plane.url, token=plane.token, ca_file=str(plane.ca_file)) as api:
            await api.create("namespaces", {"metadata": {"name": "team"}})
            await api.create("nodes", {"metadata": {"name": "dra-1"}})
            await api.create(
                "resourceslices",
                resource_slice(
                    "dra-1",
                    gpu_device(0, "GPU-d0", memory_mib=15360, model="Tesla T4"),
                    gpu_device(1, "GPU-d1", memory_mib=15360, model="Tesla T4"),
                ),
            )
            # reservedFor names a pod by uid: the API server does not check that it exists
            await _allocated(
                api,
                claim(
                    "team", "train-vgpu-0", result("dra-1", 0, memory="4Gi", cores="30"), reserved=("train",)
                ),
            )
            await _allocated(
                api, claim("team", "infer-vgpu-0", result("dra-1", 0, memory="2Gi"), reserved=("infer",))
            )
            await _allocated(api, claim("team", "pending-vgpu-0"))
        kube = kubeconfig.write_kubeconfig(
            tmp_path / "kubeconfig", server=plane.url, token=plane.token, ca_pem=plane.ca_file.read_bytes()
        )
        official = command._official_api(str(kube))
        try:
            snap = await snapshot.collect(official, config=CFG, now=lambda: now)
        finally:
            await official.close()
    [node] = snap.nodes
    assert (node.name, node.mode, node.warnings, snap.warnings, snap.other_nodes) == (
        "dra-1",
        "dra",
        (),
        (),
        0,
    )
    assert [(r.used, r.pods) for r in node.gpus] == [
        (GpuUsage(slots=2, memory_mib=6144, cores=30), ("team/infer", "team/train")),
        (GpuUsage(), ()),
    ]
    row = next(line for line in table.render(snap).splitlines() if line.startswith("dra-1"))
    assert "DRA (ResourceSlice)" in row and "6144/15360" in row and " 2/-" in row
