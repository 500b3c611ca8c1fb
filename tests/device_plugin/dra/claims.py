"""Claims, a fake of the ``port.ClaimReader`` and a Preparer on a temp host, for the DRA plugin's tests."""

from __future__ import annotations

import pathlib
from typing import Any

from vgpu.core import allocation as hami
from vgpu.core import errors
from vgpu.core.config import DevicePluginConfig
from vgpu.core.device import GpuUuid
from vgpu.core.dra import cdiclaim, names
from vgpu.kube.port import ClaimReader, JsonObj
from vgpu_device_plugin.dra import prepare
from vgpu_device_plugin.hostfs import HostFs

from tests.device_plugin.builders import installed_host

NODE = "gpu-node-1"
SHARE_0 = "5ea7e000-0000-4000-8000-000000000000"  # a share ID is a UID (kube-apiserver checks)
UUID_0 = GpuUuid("GPU-aaaaaaaa-0000-0000-0000-000000000001")
UUID_1 = GpuUuid("GPU-bbbbbbbb-0000-0000-0000-000000000002")
GPUS = (
    cdiclaim.Gpu(ref=hami.GpuRef(UUID_0, 0, 0), memory_mib=40960),
    cdiclaim.Gpu(ref=hami.GpuRef(UUID_1, 1, 1), memory_mib=40960),
)


def result(**extra: Any) -> dict[str, Any]:
    return {
        "request": "gpu",
        "driver": names.DRIVER,
        "pool": NODE,
        "device": "gpu-0",
        "consumedCapacity": {"memory": "1Gi", "cores": "25"},
        "shareID": SHARE_0,
        **extra,
    }


def claim(name: str, uid: str, *results: dict[str, Any], namespace: str = "ns") -> JsonObj:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "uid": uid},
        "status": {"allocation": {"devices": {"results": list(results or [result()])}}},
    }


class FakeClaims:
    """``port.ClaimReader`` over a dict; ``reads`` counts the calls; ``fail`` raises that error."""

    def __init__(self, *claims: JsonObj) -> None:
        self.claims = {(c["metadata"]["namespace"], c["metadata"]["name"]): c for c in claims}
        self.reads = 0
        self.fail: errors.KubeError | None = None

    async def get_resource_claim(self, namespace: str, name: str) -> JsonObj:
        self.reads += 1
        if self.fail is not None:
            raise self.fail
        found = self.claims.get((namespace, name))
        if found is None:
            raise errors.NotFound(f'resourceclaims "{name}" not found', status=404)
        return found


def preparer(
    root: pathlib.Path, claims: ClaimReader, *, trusted_uids: frozenset[int] | None = None, **config: Any
) -> prepare.Preparer:
    """A Preparer on ``root`` (HAMi-core installed there), checkpoint in ``root/plugin``."""
    installed_host(root)
    host = HostFs(root, hook_path="/usr/local", trusted_uids=trusted_uids)
    return prepare.Preparer(
        prepare.Deps(
            claims=claims,
            node=NODE,
            config=DevicePluginConfig(**config),
            gpus=GPUS,
            host=host,
            plugin_dir=root / "plugin",
        )
    )


def spec_path(root: pathlib.Path, uid: str) -> pathlib.Path:
    return root / "var/run/cdi" / cdiclaim.spec_file_name(uid)


def cache_dir(root: pathlib.Path, uid: str, request: str = "gpu") -> pathlib.Path:
    return root / f"usr/local/vgpu/claims/{uid}-{request}"
