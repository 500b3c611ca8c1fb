"""A DRA GPU pod no GPU can take, on the real Kubernetes 1.36 and on the local cluster (marked
``realk8s``): the real kube-scheduler's ``PodScheduled=False`` message is what the local cluster's
emulation writes, word for word, and what the dashboard lists as why the pod waits, read from
the objects as the scheduler's watches keep them (``slim``) with the ask from the claim
kube-controller-manager made, and what ``vgpu status`` lists through each API."""

from __future__ import annotations

import pathlib
from typing import Any

import pytest
from vgpu.core import config
from vgpu.core.config import Config
from vgpu.core.device import Gpu, GpuUuid, NodeInventory, NodeName
from vgpu.core.dra import slices, waiting
from vgpu.kube import slim
from vgpu.kube.port import KubeApi
from vgpu.status import pendingpods, snapshot
from vgpu_scheduler import dashboard
from vgpu_scheduler.draviews import DraCapture
from vgpu_scheduler.pending import FilterReasons
from vgpu_scheduler.state import ClusterState

from tests.localcluster import draobjects as dra
from tests.realk8s import drastack
from tests.realk8s.test_dra_differential_real import NODE, _emulated, _real, _settle

pytestmark = [pytest.mark.realk8s, pytest.mark.dra, pytest.mark.slow, pytest.mark.timeout(300)]


async def _scenario(api: KubeApi) -> dict[str, Any]:
    gpu = Gpu(GpuUuid("GPU-00000000-aaaa"), 0, 4, 16384, 100, "NVIDIA A100-SXM4-16GB", numa=0)
    await api.create("deviceclasses", dra.device_class())
    await api.create(
        "resourceslices", slices.build(NodeInventory(NodeName(NODE), (gpu,)), driver_version=None).body
    )
    await api.create(
        "resourceclaimtemplates",
        dra.template("vgpu-huge", dra.gpu_request(memory_mib=40000, cores=30)),
        namespace="default",
    )
    await api.create("pods", dra.dra_pod("huge", "vgpu-huge"), namespace="default")
    assert await _settle(api, "huge") == "refused: cannot allocate all claims"

    async def claimed() -> list[dict[str, Any]]:
        return (await api.list("resourceclaims", namespace="default")).items

    claims = await drastack.until("the pod's claim made", claimed)
    pod = await api.get("pods", "huge", namespace="default")
    (cond,) = [c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled"]
    status = await snapshot.collect(api, config=config.load(None))  # what `vgpu status` lists
    return {"pod": pod, "message": cond["message"], "claims": claims, "status": status.pending}


def _pending_row(pod: dict[str, Any], claims: list[dict[str, Any]]) -> dashboard.PendingPod:
    """The dashboard's row for ``pod``, from the objects as the scheduler's watches slim them."""
    state = ClusterState(Config(), clock=lambda: 0.0)
    state.apply("pods", "ADDED", slim.pod_for_scheduling(pod))
    cap = dashboard.capture(
        state, FilterReasons(), now=0.0, dra=DraCapture(1, (), [slim.claim_for_views(c) for c in claims])
    )
    (row,) = dashboard.build(cap)["pending"]
    return row


async def test_the_real_kube_schedulers_dra_refusal_is_emulated_and_shown_as_why_the_pod_waits(
    tmp_path: pathlib.Path,
) -> None:
    async with _real(tmp_path) as api:
        real = await _scenario(api)
    async with _emulated() as api:
        emulated = await _scenario(api)
    print("real:", real["message"])
    assert real["message"].startswith("0/1 nodes are available: 1 cannot allocate all claims.")
    assert emulated["message"] == real["message"]
    row = _pending_row(real["pod"], real["claims"])
    assert (row["namespace"], row["name"], row["mode"]) == ("default", "huge", "dra")
    assert row["reason"] == real["message"]
    assert row["asks"] == [{"gpus": 1, "memoryMib": 40000, "memoryPercent": None, "cores": 30}]
    ask = waiting.Ask(gpus=1, memory_mib=40000, memory_percent=None, cores=30)
    for listed in (real["status"], emulated["status"]):  # `vgpu status`, through each API
        assert listed == (pendingpods.PendingPod("default", "huge", "dra", (ask,), real["message"]),)
