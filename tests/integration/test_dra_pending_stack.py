"""A DRA GPU pod no GPU can take, through the whole demo stack in DRA mode (the real
vgpu-scheduler and device plugin processes, the local cluster's kube-controller-manager and
kube-scheduler emulations): the webhook converts the HAMi ask into a claim, kube-scheduler's DRA
plugin refuses it, and the scheduler's live dashboard (``/ui/events`` over HTTPS) and ``vgpu
status`` list the pod as pending with what it asked and kube-scheduler's own message."""

from __future__ import annotations

from typing import Any

import pytest
from vgpu.core.dra import waiting
from vgpu.demo import drastack
from vgpu.demo.stack import Stack
from vgpu.kube.client import OfficialKubeApi
from vgpu.status import pendingpods, snapshot

from tests.integration.test_demo_dra import _missing

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

DESCRIPTION = {"nodes": [{"name": "node-a", "gpus": [{"name": "Tesla T4", "memoryMib": 15360}]}]}


def _huge() -> dict[str, Any]:
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "100000", "nvidia.com/gpucores": "30"}
    return drastack.with_mode_annotation(
        {
            "metadata": {"name": "huge"},
            "spec": {"containers": [{"name": "c", "image": "cuda", "resources": {"limits": limits}}]},
        }
    )


def _row(frame: dict[str, Any]) -> dict[str, Any] | None:
    return next(
        (p for p in frame["pending"] if p["name"] == "huge" and "cannot allocate" in p["reason"]), None
    )


async def test_a_dra_pod_no_gpu_can_take_is_pending_with_kube_schedulers_message() -> None:
    if missing := _missing():
        pytest.skip("not merged yet: " + "; ".join(missing))
    async with Stack(DESCRIPTION, mode="dra", scheduler_backoff_s=(0.2, 1.0)) as stack:
        api = OfficialKubeApi.from_kubeconfig(str(stack.kubeconfig_path))  # through admission
        try:
            await api.create("pods", _huge(), namespace="default")
        finally:
            await api.close()
        frame = await stack.until_dashboard(lambda f: _row(f) is not None, "the DRA pod pending")
        pod = stack.cluster.store.get("pods", "huge", namespace="default")
        (condition,) = [c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled"]
        assert condition["message"].startswith("0/1 nodes are available: 1 cannot allocate all claims.")
        assert _row(frame) == {
            "namespace": "default",
            "name": "huge",
            "mode": "dra",
            "reason": condition["message"],
            "reasonAt": None,
            "asks": [{"gpus": 1, "memoryMib": 100_000, "memoryPercent": None, "cores": 30}],
        }
        status = await snapshot.collect(stack.api, config=stack.config)
    ask = waiting.Ask(gpus=1, memory_mib=100_000, memory_percent=None, cores=30)
    assert status.pending == (pendingpods.PendingPod("default", "huge", "dra", (ask,), condition["message"]),)
