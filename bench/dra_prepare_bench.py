"""The DRA kubelet plugin's NodePrepareResources / NodeUnprepareResources over its unix socket.

The real ``DraServer`` and ``Preparer`` (HAMi-core's stand-in files on a temp host, claims from an
in-memory ``ClaimReader``: no API server in the figure) called by a gRPC client as kubelet calls
them, v1, one claim per call, one after the other. Three phases over ``--claims`` claims: Prepare
of a new claim (claim read, cache directory made, CDI spec and checkpoint written with fsync),
Prepare again (kubelet's retry: answered from the checkpoint), Unprepare (spec, directory and
checkpoint entry removed). Each call's latency as kubelet sees it; the checkpoint holds every
prepared claim, so its rewrite grows with ``--claims``.

    .venv/bin/python -m bench.dra_prepare_bench [--claims 300] [--json]
"""

import argparse
import asyncio
import json
import pathlib
import shutil
import statistics
import tempfile
import time
from typing import Any

import grpc
from vgpu.core import allocation as hami
from vgpu.core import errors
from vgpu.core.config import DevicePluginConfig
from vgpu.core.device import GpuUuid
from vgpu.core.dra import cdiclaim, names
from vgpu.demo import hamicore
from vgpu.kubeletapi.dra.v1 import api_pb2, api_pb2_grpc
from vgpu_device_plugin.dra import prepare, service
from vgpu_device_plugin.hostfs import HostFs

from bench.percentile import pct

NODE = "bench-node"
GPUS = tuple(
    cdiclaim.Gpu(ref=hami.GpuRef(GpuUuid(f"GPU-bench-{i}"), i, i), memory_mib=81920) for i in range(8)
)


class Claims:
    """``port.ClaimReader`` over a dict (no API server in the figure)."""

    def __init__(self, claims: dict[str, dict[str, Any]]) -> None:
        self._claims = claims

    async def get_resource_claim(self, namespace: str, name: str) -> dict[str, Any]:
        found = self._claims.get(name)
        if found is None:
            raise errors.NotFound(name, status=404)
        return found


def _claim(i: int) -> dict[str, Any]:
    result = {
        "request": "gpu",
        "driver": names.DRIVER,
        "pool": NODE,
        "device": names.device_name(i % len(GPUS)),
        "consumedCapacity": {"memory": "4Gi", "cores": "25"},
        "shareID": f"{i:08x}-0000-4000-8000-000000000000",
    }
    return {
        "metadata": {"name": f"c{i}", "namespace": "bench", "uid": f"{i:08x}-1111-4000-8000-000000000000"},
        "status": {"allocation": {"devices": {"results": [result]}}},
    }


async def _timed(calls: list[Any]) -> list[float]:
    out = []
    for call in calls:
        start = time.perf_counter()
        answer = await call()
        out.append((time.perf_counter() - start) * 1e3)
        assert all(not r.error for r in answer.claims.values()), answer
    return out


async def run(claims: int) -> dict[str, dict[str, float]]:
    root = pathlib.Path(tempfile.mkdtemp(dir="/tmp", prefix="drab-"))
    try:
        hamicore.install_stand_in(root, hook_path="/usr/local")
        objs = [_claim(i) for i in range(claims)]
        preparer = prepare.Preparer(
            prepare.Deps(
                claims=Claims({o["metadata"]["name"]: o for o in objs}),
                node=NODE,
                config=DevicePluginConfig(),
                gpus=GPUS,
                host=HostFs(root, hook_path="/usr/local"),
                plugin_dir=root / "plugin",
            )
        )
        await preparer.start()
        server = service.DraServer(preparer, root / "dra.sock")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"unix:{server.socket_path}") as channel:
                stub = api_pb2_grpc.DRAPluginStub(channel)  # type: ignore[no-untyped-call]
                refs = [
                    api_pb2.Claim(uid=o["metadata"]["uid"], namespace="bench", name=o["metadata"]["name"])
                    for o in objs
                ]

                def prep(ref: api_pb2.Claim) -> Any:
                    return lambda: stub.NodePrepareResources(
                        api_pb2.NodePrepareResourcesRequest(claims=[ref])
                    )

                def unprep(ref: api_pb2.Claim) -> Any:
                    return lambda: stub.NodeUnprepareResources(
                        api_pb2.NodeUnprepareResourcesRequest(claims=[ref])
                    )

                phases = {
                    "prepare": await _timed([prep(r) for r in refs]),
                    "prepare-again": await _timed([prep(r) for r in refs]),
                    "unprepare": await _timed([unprep(r) for r in refs]),
                }
        finally:
            await server.stop(grace_s=0)
        return {
            name: {"median_ms": statistics.median(ms), "p99_ms": pct(ms, 99), "max_ms": max(ms)}
            for name, ms in phases.items()
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--claims", type=int, default=300, help="claims prepared, one call each")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    opts = parser.parse_args()
    figures = asyncio.run(run(opts.claims))
    if opts.json:
        print(json.dumps(figures, indent=2))
        return
    for name, f in figures.items():
        print(
            f"{name:14s} {opts.claims} calls: median {f['median_ms']:.2f} ms, "
            f"p99 {f['p99_ms']:.2f} ms, max {f['max_ms']:.2f} ms"
        )


if __name__ == "__main__":
    main()
