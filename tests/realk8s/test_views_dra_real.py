"""The vgpu-scheduler binary's views of the DRA mode against a real kube-apiserver 1.36 (marked
``realk8s``): its watches of ``resource.k8s.io/v1`` ResourceSlices and ResourceClaims, through the
API client the binary really uses, feed ``/ui/events`` (live) and ``/metrics``."""

from __future__ import annotations

import asyncio
import pathlib
import ssl
from typing import Any

import aiohttp
import pytest
from vgpu.demo.stack import until_dashboard

from tests.core.dra.dra_objects import claim, gpu_device, resource_slice, result
from tests.realk8s.stack import real_stack
from tests.realk8s.test_status_dra_real import allocated

pytestmark = [pytest.mark.realk8s, pytest.mark.dra, pytest.mark.slow, pytest.mark.timeout(300)]


def _dra_gpu0(frame: dict[str, Any]) -> dict[str, Any] | None:
    for node in frame.get("nodes", []):
        if node["name"] == "dra-1" and node["mode"] == "dra" and node["gpus"]:
            return node["gpus"][0]  # type: ignore[no-any-return]
    return None


async def test_the_scheduler_shows_dra_slices_and_claims_live(
    k8s_bin: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    async with real_stack(k8s_bin, tmp_path) as stack:
        api = stack.api
        await api.create("namespaces", {"metadata": {"name": "team"}})
        await api.create("resourceslices", resource_slice("dra-1", gpu_device(0, "GPU-d0", memory_mib=15360)))
        first = await asyncio.wait_for(
            until_dashboard(stack.scheduler_url, stack.ca_file, lambda f: _dra_gpu0(f) is not None), 60
        )
        assert _dra_gpu0(first)["usedMib"] == 0  # type: ignore[index]
        await allocated(
            api,
            claim("team", "train-vgpu-0", result("dra-1", 0, memory="4Gi", cores="30"), reserved=("train",)),
        )
        frame = await asyncio.wait_for(
            until_dashboard(
                stack.scheduler_url, stack.ca_file, lambda f: (_dra_gpu0(f) or {}).get("usedMib") == 4096
            ),
            60,
        )
        gpu = _dra_gpu0(frame)
        assert gpu is not None and gpu["usedCores"] == 30 and [p["name"] for p in gpu["pods"]] == ["train"]
        ctx = ssl.create_default_context(cafile=str(stack.ca_file))
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"{stack.scheduler_url}/metrics", ssl=ctx) as resp,
        ):
            text = await resp.text()
    assert 'vgpu_scheduler_dra_gpu_info{device_uuid="GPU-d0",node="dra-1"} 1.0' in text
    assert (
        'hami_vgpu_memory_allocated_bytes{container_index="0",device_uuid="GPU-d0",namespace="team",'
        'node="dra-1",pod="train",zone="vGPU"} 4.294967296e+09'
    ) in text
