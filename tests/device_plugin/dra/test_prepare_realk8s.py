"""Prepare against a real kube-apiserver 1.36 (marked ``realk8s``): a ResourceClaim created and
allocated there as kube-scheduler writes it (two GPUs of our driver with consumed capacity and share
IDs), read back through the official client's ``get_resource_claim``, prepared over real gRPC: the
answer and the CDI spec say what the real object says, in the real server's own formats."""

from __future__ import annotations

import datetime
import json
import pathlib
import shutil
import ssl
import uuid
from typing import Any

import aiohttp
import pytest
from vgpu.core.dra import names
from vgpu.kube import client, kubeconfig
from vgpu_device_plugin.dra import service

from bench import realk8s
from tests.device_plugin.builders import short_tmp
from tests.device_plugin.dra import claims as c
from tests.device_plugin.dra.fakedrakubelet import FakeDraKubelet
from tests.realk8s import binaries

pytestmark = [pytest.mark.realk8s, pytest.mark.dra, pytest.mark.slow, pytest.mark.timeout(300)]

CLAIMS = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"


async def _call(
    session: aiohttp.ClientSession, plane: realk8s.ControlPlane, method: str, path: str, body: Any
) -> Any:
    trust = ssl.create_default_context(cafile=str(plane.ca_file))
    headers = {"Authorization": f"Bearer {plane.token}"}
    async with session.request(method, plane.url + path, json=body, headers=headers, ssl=trust) as resp:
        answer = await resp.json()
        assert resp.status < 300, answer
        return answer


async def test_a_claim_allocated_on_a_real_api_server_is_prepared(tmp_path: pathlib.Path) -> None:
    k8s_bin = binaries.k8s_bin("kube-apiserver", "etcd")
    binaries.needs_dra(k8s_bin)
    root = short_tmp()
    share = [str(uuid.uuid4()), str(uuid.uuid4())]
    request = {
        "name": "gpu",
        "exactly": {
            "deviceClassName": names.DEVICE_CLASS,
            "allocationMode": "ExactCount",
            "count": 2,
            "capacity": {"requests": {"memory": "3000Mi", "cores": "30"}},
        },
    }
    results = [
        {
            "request": "gpu",
            "driver": names.DRIVER,
            "pool": c.NODE,
            "device": f"gpu-{i}",
            "consumedCapacity": {"memory": "3000Mi", "cores": "30"},
            "shareID": share[i],
        }
        for i in (0, 1)
    ]
    now = datetime.datetime.now(datetime.UTC)
    async with realk8s.control_plane(k8s_bin, tmp_path, now=now) as plane, aiohttp.ClientSession() as session:
        made = await _call(session, plane, "POST", CLAIMS, {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "vgpu-0"},
            "spec": {"devices": {"requests": [request]}},
        })  # fmt: skip
        made["status"] = {"allocation": {"devices": {"results": results}}}
        await _call(session, plane, "PUT", f"{CLAIMS}/vgpu-0/status", made)
        kube = kubeconfig.write_kubeconfig(
            tmp_path / "kubeconfig", server=plane.url, token=plane.token, ca_pem=plane.ca_file.read_bytes()
        )
        api = client.OfficialKubeApi.from_kubeconfig(str(kube))
        real = c.preparer(root, api)
        server = service.DraServer(real, root / "dra.sock")
        kubelet = FakeDraKubelet()
        try:
            stored = await api.get_resource_claim("default", "vgpu-0")
            assert stored["metadata"]["uid"] == made["metadata"]["uid"]
            await server.start()
            await kubelet.connect(server.socket_path)
            uid = made["metadata"]["uid"]
            answer = (await kubelet.prepare((uid, "default", "vgpu-0"))).claims[uid]
            assert answer.error == ""
            assert [(d.device_name, d.share_id, list(d.cdi_device_ids)) for d in answer.devices] == [
                ("gpu-0", share[0], [f"kube-vgpu.io/claim={uid}-gpu"]),
                ("gpu-1", share[1], []),
            ]
            spec = json.loads(c.spec_path(root, uid).read_text())
            env = dict(e.split("=", 1) for e in spec["devices"][0]["containerEdits"]["env"])
            assert env["NVIDIA_VISIBLE_DEVICES"] == f"{c.UUID_0},{c.UUID_1}"
            assert (env["CUDA_DEVICE_MEMORY_LIMIT_0"], env["CUDA_DEVICE_MEMORY_LIMIT_1"]) == (
                "3000m",
                "3000m",
            )
            assert env["CUDA_DEVICE_SM_LIMIT"] == "30"
            wrong = (await kubelet.prepare((str(uuid.uuid4()), "default", "vgpu-0"))).claims
            assert "the API server has UID" in next(iter(wrong.values())).error
            missing = (await kubelet.prepare((str(uuid.uuid4()), "default", "gone"))).claims
            assert "not on the API server" in next(iter(missing.values())).error
        finally:
            await kubelet.close()
            await server.stop(grace_s=0)
            await api.close()
            shutil.rmtree(root, ignore_errors=True)
