"""``vgpu status`` through the official ``kubernetes`` client against a real kube-apiserver (1.36:
``resource.k8s.io/v1``, consumable capacity on by default), with our ResourceSlice and claims whose
allocation is written as kube-scheduler writes it (marked ``realk8s``). The API server validates
the objects, so the views read what a cluster really serves; the numbers equal those read from the
recorded objects (``tests/cli/test_status_dra.py``)."""

from __future__ import annotations

import asyncio
import datetime
import pathlib
from typing import Any

import pytest
import yaml
from vgpu.core import config
from vgpu.core.device import GpuUsage
from vgpu.core.dra import names
from vgpu.kube import aioapi, kubeconfig
from vgpu.localcluster import cluster, description
from vgpu.status import command, snapshot, table

from bench import realk8s
from bench.throughput_procs import register_node
from tests.core.dra.dra_objects import claim, gpu_device, resource_slice, result

pytestmark = [pytest.mark.realk8s, pytest.mark.dra, pytest.mark.slow, pytest.mark.timeout(300)]

CFG = config.load(None)


async def allocated(api: aioapi.AioKubeApi, obj: dict[str, Any]) -> None:
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
            await allocated(
                api,
                claim(
                    "team", "train-vgpu-0", result("dra-1", 0, memory="4Gi", cores="30"), reserved=("train",)
                ),
            )
            await allocated(
                api, claim("team", "infer-vgpu-0", result("dra-1", 0, memory="2Gi"), reserved=("infer",))
            )
            await allocated(api, claim("team", "pending-vgpu-0"))
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
    assert "DRA (ResourceSlice)" in row and "6144/15360" in row and " 2/10" in row  # shares/slots


def _pod(name: str, claim_name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "team"},
        "spec": {
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim_name}],
            "containers": [{"name": "main", "image": "cuda", "resources": {"claims": [{"name": "gpu"}]}}],
        },
    }


def _claim(name: str, capacity: dict[str, str] | None) -> dict[str, Any]:
    exactly: dict[str, Any] = {
        "deviceClassName": names.DEVICE_CLASS,
        "allocationMode": "ExactCount",
        "count": 1,
    }
    if capacity is not None:
        exactly["capacity"] = {"requests": capacity}
    return {
        "metadata": {"name": name, "namespace": "team"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
    }


async def test_status_reads_what_the_real_kube_scheduler_allocated(
    k8s_bin: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    """kube-scheduler 1.36's DRA plugin allocates three claims on our slice (three 15 GiB GPUs,
    the published request policies): memory and cores asked; memory only (kube-scheduler consumes
    the cores' 1 % floor, status shows the 0 asked); nothing asked (memory at the default: the whole
    card). ``vgpu status`` reads the memory kube-scheduler recorded, the defaults as it applied
    them, the cores each claim asked, and the pods it reserved each for."""
    now = datetime.datetime.now(datetime.UTC)
    async with realk8s.control_plane(k8s_bin, tmp_path, now=now) as plane:
        kube = kubeconfig.write_kubeconfig(
            tmp_path / "kubeconfig", server=plane.url, token=plane.token, ca_pem=plane.ca_file.read_bytes()
        )
        sched_config = tmp_path / "kube-scheduler.yaml"
        sched_config.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "kubescheduler.config.k8s.io/v1",
                    "kind": "KubeSchedulerConfiguration",
                    "clientConnection": {"kubeconfig": str(kube)},
                    "leaderElection": {"leaderElect": False},
                }
            )
        )
        async with (
            aioapi.AioKubeApi(plane.url, token=plane.token, ca_file=str(plane.ca_file)) as api,
            realk8s.kube_scheduler(
                k8s_bin, config=sched_config, kubeconfig_path=kube, log_path=tmp_path / "kube-scheduler.log"
            ),
        ):
            await api.create("namespaces", {"metadata": {"name": "team"}})
            allocatable = {"cpu": "8", "memory": "32Gi", "pods": "110"}
            await register_node(
                api, cluster.node_object(description.NodeSpec(name="dra-1", allocatable=allocatable))
            )
            await api.request(
                "POST",
                "/apis/resource.k8s.io/v1/deviceclasses",
                body={
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "DeviceClass",
                    "metadata": {"name": names.DEVICE_CLASS},
                    "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{names.DRIVER}"'}}]},
                },
            )
            gpus = [gpu_device(i, f"GPU-d{i}", memory_mib=15360, model="Tesla T4") for i in range(3)]
            await api.create("resourceslices", resource_slice("dra-1", *gpus))
            for pod, claim_name, capacity in (
                ("train", "train-gpu", {"memory": "4Gi", "cores": "30"}),
                ("infer", "infer-gpu", {"memory": "2Gi"}),
                ("whole", "whole-gpu", None),
            ):
                await api.create("resourceclaims", _claim(claim_name, capacity), namespace="team")
                await api.create("pods", _pod(pod, claim_name), namespace="team")
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 60
            while True:
                pods = (await api.list("pods", namespace="team")).items
                if all((p.get("spec") or {}).get("nodeName") == "dra-1" for p in pods):
                    break
                assert loop.time() < deadline, f"not all bound: {[p['metadata']['name'] for p in pods]}"
                await asyncio.sleep(0.2)
            claims = (await api.list("resourceclaims", namespace="team")).items
        official = command._official_api(str(kube))
        try:
            snap = await snapshot.collect(official, config=CFG, now=lambda: now)
        finally:
            await official.close()
    recorded = {c["metadata"]["name"]: c["status"]["allocation"]["devices"]["results"][0] for c in claims}
    # kube-scheduler consumed the floor and a slot for the claims that asked no cores ...
    for name in ("infer-gpu", "whole-gpu"):
        assert recorded[name]["consumedCapacity"]["cores"] == "1", recorded[name]
        assert recorded[name]["consumedCapacity"]["slots"] == "1", recorded[name]
    [node] = snap.nodes
    assert (node.name, node.mode, node.warnings, snap.warnings) == ("dra-1", "dra", (), ())
    by_pod = {pod: row for row in node.gpus for pod in row.pods}
    assert set(by_pod) == {"team/train", "team/infer", "team/whole"}
    on_whole = by_pod["team/whole"]
    assert on_whole.pods == ("team/whole",)  # the whole card: nobody else fits beside it
    # ... and status shows the cores they asked: none
    assert (on_whole.used.memory_mib, on_whole.used.cores) == (15360, 0), recorded["whole-gpu"]
    shared = {by_pod["team/train"].gpu.uuid, by_pod["team/infer"].gpu.uuid}
    totals = [(r.used.memory_mib, r.used.cores, r.used.slots) for r in node.gpus if r.gpu.uuid in shared]
    assert sorted(totals) in (
        [(2048, 0, 1), (4096, 30, 1)],  # kube-scheduler spread them over two GPUs
        [(6144, 30, 2)],  # or put them on one
    ), recorded
