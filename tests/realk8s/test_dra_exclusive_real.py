"""HAMi's sharing rules in the DRA mode, on the real kube-scheduler 1.36 and on the local cluster
(marked ``realk8s``): with the ResourceSlice the device plugin publishes (``slices.build``: cores
policy default and min 1, a ``slots`` capacity of ``deviceSplitCount``), both

* refuse a claim on a GPU held by a ``cores: 100`` claim, and place it once that claim is gone;
* refuse a ``cores: 100`` claim on a GPU that holds any claim;
* refuse the (splitCount+1)th claim on a GPU;

and agree on every outcome and every consumed capacity (1 % and one slot for a claim asking no
cores)."""

from __future__ import annotations

import pathlib
from typing import Any

import pytest
from vgpu.core.device import Gpu, GpuUuid, NodeInventory, NodeName
from vgpu.core.dra import slices
from vgpu.kube.port import KubeApi

from tests.localcluster import draobjects as dra
from tests.realk8s import drastack
from tests.realk8s.test_dra_differential_real import NODE, _allocation, _emulated, _real, _settle

pytestmark = [pytest.mark.realk8s, pytest.mark.dra, pytest.mark.slow, pytest.mark.timeout(300)]

SPLIT_COUNT = 3
TEMPLATES = {
    "exclusive": dra.gpu_request(memory_mib=1000, cores=100),
    "plain": dra.gpu_request(memory_mib=1000),  # no cores asked
}
REFUSED = "refused: cannot allocate all claims"


def _slice() -> dict[str, Any]:
    gpu = Gpu(GpuUuid("GPU-00000000-aaaa"), 0, SPLIT_COUNT, 16384, 100, "NVIDIA A100-SXM4-16GB", numa=0)
    return slices.build(NodeInventory(NodeName(NODE), (gpu,)), driver_version=None).body


async def _create(api: KubeApi, pod: str, template: str) -> str:
    await api.create("pods", dra.dra_pod(pod, template), namespace="default")
    return await _settle(api, pod)


async def _scenario(api: KubeApi) -> dict[str, Any]:
    await api.create("deviceclasses", dra.device_class())
    await api.create("resourceslices", _slice())
    for name, request in TEMPLATES.items():
        await api.create("resourceclaimtemplates", dra.template(name, request), namespace="default")
    out: dict[str, Any] = {}
    out["e1"] = await _create(api, "e1", "exclusive")  # an idle GPU: placed
    out["p1 beside e1"] = await _create(api, "p1", "plain")  # the GPU's cores are all taken
    allocations = {"e1": await _allocation(api, "e1")}
    await api.delete("pods", "e1", namespace="default", grace_period_s=0)

    async def p1_bound() -> bool:
        return bool((await api.get("pods", "p1", namespace="default"))["spec"].get("nodeName"))

    await drastack.until("p1 scheduled after e1 was deleted", p1_bound)
    allocations["p1"] = await _allocation(api, "p1")
    out["e2 beside p1"] = await _create(api, "e2", "exclusive")  # the GPU is not idle
    for pod in ("p2", "p3"):  # slots 2 and 3 of 3
        out[pod] = await _create(api, pod, "plain")
    out["p4 past the split count"] = await _create(api, "p4", "plain")
    stored = await api.get("resourceslices", _slice()["metadata"]["name"])
    return {"outcomes": out, "allocations": allocations, "stored slice": stored["spec"]}


async def test_exclusive_use_and_the_split_count_hold_on_the_real_1_36(tmp_path: pathlib.Path) -> None:
    async with _real(tmp_path) as api:
        real = await _scenario(api)
    async with _emulated() as api:
        emulated = await _scenario(api)
    print("real:", real)
    assert emulated == real
    assert real["outcomes"] == {
        "e1": "scheduled",
        "p1 beside e1": REFUSED,
        "e2 beside p1": REFUSED,
        "p2": "scheduled",
        "p3": "scheduled",
        "p4 past the split count": REFUSED,
    }
    assert real["allocations"] == {
        "e1": [("gpu", NODE, "gpu-0", {"memory": "1000Mi", "cores": "100", "slots": "1"})],
        "p1": [("gpu", NODE, "gpu-0", {"memory": "1000Mi", "cores": "1", "slots": "1"})],
    }
    assert real["stored slice"] == _slice()["spec"]
