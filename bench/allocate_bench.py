"""Device-plugin Allocate latency with 110 pods on the node (kubelet's default max pods).

The real plugin path: a ``DevicePluginService`` served by grpc.aio on a unix socket, the
``HamiAllocator`` reading the pod cache (``InformerView``: watches of the local cluster's store),
host dirs created under a temp root. Every iteration one new pod is pending (bound, bind phase
``allocating``, node lock naming it) among 109 others already running, and the client calls
``Allocate`` over gRPC as kubelet does, timing the answer. Each Allocate's writes (the pod's PATCH,
the lock release) are made after the answer (``writebehind``), so they are not in the figure;
``--api-delay-ms`` makes every API call wait that long first (an API server in a brownout: the
answer must not wait with it). The writes still due at the end are waited for and counted.

    .venv/bin/python -m bench.allocate_bench [--iterations 1000] [--pods 110] [--api-delay-ms 0] [--json]
"""

import argparse
import asyncio
import json
import pathlib
import shutil
import statistics
import tempfile
import time
from collections.abc import Mapping
from typing import Any

import grpc
from vgpu.core import annotations
from vgpu.core.config import DevicePluginConfig
from vgpu.demo import hamicore
from vgpu.gpu import fake
from vgpu.kube.port import JsonObj, Kind, ObjectList
from vgpu.kubeletapi.v1beta1 import api_pb2, api_pb2_grpc
from vgpu.localcluster.client import LocalKubeApi
from vgpu.localcluster.store import Store
from vgpu_device_plugin import inventory, writebehind
from vgpu_device_plugin.allocator import HamiAllocator
from vgpu_device_plugin.health import HealthMonitor, HealthTracker
from vgpu_device_plugin.hostfs import HostFs
from vgpu_device_plugin.podcache import InformerView
from vgpu_device_plugin.server import DevicePluginService, PluginServer

from bench.percentile import pct

NODE = "bench-node"
KEYS = annotations.Keys()


class DelayedApi(LocalKubeApi):
    """LocalKubeApi whose GETs, LISTs and PATCHes each wait ``delay_s`` first (watches do not)."""

    def __init__(self, store: Store, *, delay_s: float) -> None:
        super().__init__(store)
        self.delay_s = delay_s
        self.calls = 0

    async def _delay(self) -> None:
        self.calls += 1
        if self.delay_s > 0:
            await asyncio.sleep(self.delay_s)  # the emulated API server's answer time

    async def get(self, kind: Kind, name: str, *, namespace: str | None = None) -> JsonObj:
        await self._delay()
        return await super().get(kind, name, namespace=namespace)

    async def list(self, kind: Kind, **kwargs: Any) -> ObjectList:
        await self._delay()
        return await super().list(kind, **kwargs)

    async def merge_patch(
        self, kind: Kind, name: str, patch: Mapping[str, Any], *, namespace: str | None = None
    ) -> JsonObj:
        await self._delay()
        return await super().merge_patch(kind, name, patch, namespace=namespace)


def pod_body(name: str, uuid: str, *, pending: bool) -> JsonObj:
    devices = f"{uuid},NVIDIA,2000,25:;"
    notes = {
        KEYS.assigned_node: NODE,
        KEYS.assigned_time: "1763859723",
        KEYS.devices_allocated: devices,
        KEYS.devices_to_allocate: devices if pending else ";",
        KEYS.bind_phase: "allocating" if pending else "success",
        KEYS.bind_time: "1763859723",
    }
    return {
        "metadata": {"name": name, "annotations": notes},
        "spec": {
            "nodeName": NODE,
            "containers": [{"name": "main", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
        },
    }


async def bench(iterations: int, pods: int, warmup: int, *, api_delay_ms: float = 0.0) -> dict[str, Any]:
    store = Store(history_size=100_000)
    api = DelayedApi(store, delay_s=api_delay_ms / 1000)
    writes = writebehind.WriteQueue()
    store.create("nodes", {"metadata": {"name": NODE}})
    gpus = {
        "gpus": [
            {"uuid": f"GPU-bench-{i}", "name": "NVIDIA A100-SXM4-80GB", "memoryMib": 81920} for i in range(8)
        ]
    }
    backend = fake.FakeGpuBackend.from_yaml(gpus)
    cfg = DevicePluginConfig()
    inv = inventory.build(backend.devices(), cfg)
    uuids = [g.uuid for g in inv.gpus]
    for i in range(pods - 1):
        store.create(
            "pods", pod_body(f"running-{i}", uuids[i % len(uuids)], pending=False), namespace="default"
        )
    view = InformerView(api, node=NODE)
    view_task = asyncio.create_task(view.run())
    await view.wait_synced()
    root = pathlib.Path(tempfile.mkdtemp(prefix="vgpu-bench-"))
    hamicore.install_stand_in(root, hook_path=cfg.hook_path)  # as the chart's installer leaves a node
    sock_dir = pathlib.Path(tempfile.mkdtemp(dir="/tmp", prefix="vab-"))
    monitor = HealthMonitor(
        backend,
        HealthTracker(uuids, clock=time.monotonic, recovery_s=60, ignored_xids=()),
        probe_interval_s=60,
    )
    handler = HamiAllocator(
        api=api,
        view=view,
        node=NODE,
        config=cfg,
        keys=KEYS,
        refs=inv.refs,
        host=HostFs(root, hook_path=cfg.hook_path),
        writes=writes,
    )
    service = DevicePluginService(
        resource=inv.resources[0], health=monitor, handler=handler, get_preferred_allocation=True
    )
    server = PluginServer(service, sock_dir / "nvidia-gpu.sock")
    await server.start()
    total_ms: list[float] = []
    try:
        async with grpc.aio.insecure_channel(f"unix://{server.socket_path}") as channel:
            stub = api_pb2_grpc.DevicePluginStub(channel)  # type: ignore[no-untyped-call]
            for i in range(warmup + iterations):
                name = f"pending-{i}"
                uuid = uuids[i % len(uuids)]
                store.create("pods", pod_body(name, uuid, pending=True), namespace="default")
                lock = f"2026-11-23T01:00:00Z,default,{name}"
                store.patch("nodes", NODE, {"metadata": {"annotations": {KEYS.node_lock: lock}}})
                while view.pod("default", name) is None or KEYS.node_lock not in (  # noqa: ASYNC110 (bench setup; the view has no change hook)
                    (view.node() or {}).get("metadata", {}).get("annotations") or {}
                ):
                    await asyncio.sleep(0)  # let the watches deliver the new pod and the lock
                request = api_pb2.AllocateRequest(
                    container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=[f"{uuid}-{i % 10}"])]
                )
                start = time.perf_counter()
                resp = await stub.Allocate(request)
                elapsed = time.perf_counter() - start
                assert resp.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == uuid
                if i >= warmup:
                    total_ms.append(elapsed * 1000)
                await writes.drain()  # this pod's writes land before it goes (the node keeps `pods` pods)
                store.delete("pods", name, namespace="default")
        drain_start = time.perf_counter()
        await writes.close(timeout_s=60)
        drain_s = time.perf_counter() - drain_start
    finally:
        await server.stop()
        view_task.cancel()
        await asyncio.gather(view_task, return_exceptions=True)
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(sock_dir, ignore_errors=True)
    return {
        "pods_on_node": pods,
        "iterations": iterations,
        "api_delay_ms": api_delay_ms,
        "allocate_ms": {
            "p50": pct(total_ms, 0.5),
            "p99": pct(total_ms, 0.99),
            "max": max(total_ms),
            "mean": statistics.fmean(total_ms),
        },
        "writes_landed": writes.landed,
        "writes_given_up": writes.given_up,
        "api_calls": api.calls,
        "final_drain_s": drain_s,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--iterations", type=int, default=1000)
    p.add_argument("--pods", type=int, default=110)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--api-delay-ms", type=float, default=0.0, help="every GET/LIST/PATCH waits this long")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    result = asyncio.run(bench(args.iterations, args.pods, args.warmup, api_delay_ms=args.api_delay_ms))
    if args.json:
        print(json.dumps(result))
        return
    a = result["allocate_ms"]
    print(
        f"Allocate over gRPC, {result['pods_on_node']} pods on the node, {result['iterations']} calls, "
        f"API calls delayed {result['api_delay_ms']:g} ms"
    )
    print(
        f"  answer: p50 {a['p50']:.3f} ms  p99 {a['p99']:.3f} ms  max {a['max']:.3f} ms  (target p99 < 20 ms)"
    )
    print(
        f"  writes after the answers: {result['writes_landed']} landed, {result['writes_given_up']} given up "
        f"({result['api_calls']} API calls)"
    )


if __name__ == "__main__":
    main()
