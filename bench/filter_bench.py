"""Scheduler extender benchmark: filter latency and filter+bind throughput at 1,000 and 5,000 nodes.

Each node has 8 GPUs (16 GiB, 10 slots) and 8 pods already placed (one per GPU, 2,000 MiB, 10 %).
The state is fed the way the watches feed it (``ClusterState.apply``); requests go through the real
aiohttp app over HTTP on 127.0.0.1 (port 0) with every node name in ``NodeNames``. The API server is
an in-process fake that applies merge patches (with resourceVersion checks) and echoes them back to
the state as watch events, so the numbers are the extender's own cost, not an API server's.

    .venv/bin/python -m bench.filter_bench [--nodes 1000 5000] [--filters 300] [--binds 300]
"""

import argparse
import asyncio
import contextlib
import copy
import dataclasses
import json
import statistics
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any, cast

import aiohttp
from vgpu.core import annotations, errors
from vgpu.core.config import Config
from vgpu_scheduler.app import SchedulerService
from vgpu_scheduler.extender_wire import AsyncVerb, InlineVerb, Reply

from bench import fleet, percentile
from bench.procstat import rss_mib

LOCK_KEY = annotations.KEYS.node_lock

GPUS_PER_NODE = fleet.GPUS_PER_NODE
PODS_PER_NODE = 8


class EchoApi:
    """A minimal KubeApi: objects in dicts, merge patches with resourceVersion preconditions, every
    write echoed to the scheduler state on the next loop turn (as a watch would deliver it)."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.state: Any = None
        self.rv = 0

    def put(self, kind: str, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        self.rv += 1
        meta["resourceVersion"] = str(self.rv)
        self.objects[(kind, meta.get("namespace", ""), meta["name"])] = obj

    async def get(self, kind: str, name: str, *, namespace: str | None = None) -> dict[str, Any]:
        obj = self.objects.get((kind, namespace or "", name))
        if obj is None:
            raise errors.NotFound(f"{kind} {name} not found", status=404)
        return copy.deepcopy(obj)

    async def merge_patch(
        self, kind: str, name: str, patch: Any, *, namespace: str | None = None
    ) -> dict[str, Any]:
        obj = self.objects.get((kind, namespace or "", name))
        if obj is None:
            raise errors.NotFound(f"{kind} {name} not found", status=404)
        meta_patch = dict(patch.get("metadata") or {})
        want = meta_patch.pop("resourceVersion", None)
        if want is not None and want != obj["metadata"]["resourceVersion"]:
            raise errors.Conflict("the object has been modified", status=409)
        obj = copy.deepcopy(obj)
        for field in ("annotations", "labels"):
            for k, v in (meta_patch.get(field) or {}).items():
                target = obj["metadata"].setdefault(field, {})
                if v is None:
                    target.pop(k, None)
                else:
                    target[k] = v
        self.put(kind, obj)
        self._echo(kind, obj)
        return obj

    async def bind_pod(
        self,
        namespace: str,
        name: str,
        *,
        node: str,
        uid: str | None = None,
        annotations: Mapping[str, str] | None = None,
    ) -> None:
        obj = copy.deepcopy(self.objects[("pods", namespace, name)])
        obj["spec"]["nodeName"] = node
        obj["metadata"]["annotations"] = {**(obj["metadata"].get("annotations") or {}), **(annotations or {})}
        self.put("pods", obj)
        self._echo("pods", obj)
        # the device plugin's Allocate would now set bind-phase success and delete the lock
        node_obj = copy.deepcopy(self.objects[("nodes", "", node)])
        node_obj["metadata"].get("annotations", {}).pop(LOCK_KEY, None)
        self.put("nodes", node_obj)
        self._echo("nodes", node_obj)

    async def create_event(self, **_: Any) -> None:
        return None

    def _echo(self, kind: str, obj: dict[str, Any]) -> None:
        asyncio.get_running_loop().call_soon(self.state.apply, kind, "MODIFIED", obj)


def build(
    service: SchedulerService, api: EchoApi, nodes: int, now: float, *, placed: fleet.Placed | None = None
) -> None:
    """The fleet (``bench.fleet``) fed to the service's state; the Nodes also stored in ``api``."""
    for kind, obj in fleet.objects(nodes, now, placed=placed or fleet.Placed(per_node=PODS_PER_NODE)):
        if kind == "nodes":
            api.put("nodes", obj)
        service.state.apply(kind, "ADDED", obj)


def new_pod(api: EchoApi, i: int) -> dict[str, Any]:
    pod = {
        "metadata": {
            "name": f"bench-{i}",
            "namespace": "default",
            "uid": f"bench-uid-{i}",
            "annotations": {},
        },
        "spec": {
            "containers": [
                {"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"}}}
            ]
        },
        "status": {"phase": "Pending"},
    }
    api.put("pods", pod)
    return pod


@dataclasses.dataclass
class Served:
    """A started SchedulerService over ``nodes`` built nodes, its extender address, and the server
    time (wall and CPU) of every request to the timed path."""

    service: SchedulerService
    api: EchoApi
    address: str
    build_s: float
    server_s: list[float] = dataclasses.field(default_factory=list)
    server_cpu_s: list[float] = dataclasses.field(default_factory=list)

    def clear(self) -> None:
        self.server_s.clear()
        self.server_cpu_s.clear()


@contextlib.asynccontextmanager
async def served(nodes: int, *, timed_path: str, placed: fleet.Placed | None = None) -> AsyncIterator[Served]:
    """The real service (its extender listener on 127.0.0.1:0) over a built state of ``nodes``
    nodes, fed directly (no informers); each request to ``timed_path`` is timed from its parsed
    body to its reply (the verb's own time, without the HTTP around it)."""
    api = EchoApi()
    service = SchedulerService(Config(), api)  # type: ignore[arg-type]
    api.state = service.state
    t0 = time.perf_counter()
    build(service, api, nodes, time.time(), placed=placed)
    build_s = time.perf_counter() - t0
    service.informers = []  # state is fed directly above
    service.view_informers = []
    server_s: list[float] = []
    server_cpu_s: list[float] = []

    server = service.extender_server
    verb = server.verbs[timed_path]

    def record(start: float, cpu: float) -> None:
        server_s.append(time.perf_counter() - start)
        server_cpu_s.append(time.process_time() - cpu)

    def timed_inline(body: bytes) -> Reply:
        start, cpu = time.perf_counter(), time.process_time()
        try:
            return cast(InlineVerb, verb.call)(body)
        finally:
            record(start, cpu)

    async def timed_async(body: bytes) -> Reply:
        start, cpu = time.perf_counter(), time.process_time()
        try:
            return await cast(AsyncVerb, verb.call)(body)
        finally:
            record(start, cpu)

    server.verbs[timed_path] = dataclasses.replace(verb, call=timed_inline if verb.inline else timed_async)
    await service.start(host="127.0.0.1", port=0)
    try:
        await service.wait_ready()  # (freezes the built state out of the GC's way, as after a real sync)
        yield Served(service, api, service.extender_address, build_s, server_s, server_cpu_s)
    finally:
        await service.stop()


async def run(nodes: int, filters: int, binds: int) -> dict[str, float]:
    async with served(nodes, timed_path="/filter") as srv:
        return await _run(srv, nodes, filters, binds)


async def _run(srv: Served, nodes: int, filters: int, binds: int) -> dict[str, float]:
    api, address, build_s = srv.api, srv.address, srv.build_s
    server_latencies, server_cpu = srv.server_s, srv.server_cpu_s
    names = [f"node-{n:05d}" for n in range(nodes)]
    url = f"http://{address}"
    latencies: list[float] = []
    async with aiohttp.ClientSession() as session:

        async def filter_one(i: int) -> str:
            body = json.dumps({"Pod": new_pod(api, i), "Nodes": None, "NodeNames": names})
            start = time.perf_counter()
            async with session.post(
                f"{url}/filter", data=body, headers={"Content-Type": "application/json"}
            ) as r:
                result = await r.json()
            latencies.append(time.perf_counter() - start)
            assert not result["Error"] and len(result["NodeNames"]) == 1, result
            return str(result["NodeNames"][0])

        async def bind_one(i: int, node: str) -> None:
            args = {
                "PodName": f"bench-{i}",
                "PodNamespace": "default",
                "PodUID": f"bench-uid-{i}",
                "Node": node,
            }
            async with session.post(f"{url}/bind", json=args) as r:
                result = await r.json()
            assert result["Error"] == "", result

        for i in range(20):  # warm-up
            await filter_one(1_000_000 + i)
        latencies.clear()
        server_latencies.clear()
        server_cpu.clear()
        for i in range(filters):
            await filter_one(i)
        lat = sorted(latencies)
        server = sorted(server_latencies)
        cpu_times = sorted(server_cpu)
        start = time.perf_counter()
        for i in range(binds):
            node = await filter_one(2_000_000 + i)
            await bind_one(2_000_000 + i, node)
        throughput = binds / (time.perf_counter() - start)
    return {
        "nodes": nodes,
        "build_s": build_s,
        "server_p50_ms": statistics.median(server) * 1000,
        "server_p99_ms": percentile.pct(server, 0.99) * 1000,
        "server_cpu_p99_ms": percentile.pct(cpu_times, 0.99) * 1000,
        "p50_ms": statistics.median(lat) * 1000,
        "p99_ms": percentile.pct(lat, 0.99) * 1000,
        "max_ms": lat[-1] * 1000,
        "filter_bind_per_s": throughput,
        "rss_mib": rss_mib(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000, 5000])
    parser.add_argument("--filters", type=int, default=300)
    parser.add_argument("--binds", type=int, default=300)
    args = parser.parse_args()
    for n in args.nodes:
        r = asyncio.run(run(n, args.filters, args.binds))
        print(
            f"{int(r['nodes'])} nodes x {GPUS_PER_NODE} GPUs, {PODS_PER_NODE} pods/node: "
            f"state built in {r['build_s']:.1f} s; filter in the server p50 {r['server_p50_ms']:.2f} ms, "
            f"p99 {r['server_p99_ms']:.2f} ms (CPU p99 {r['server_cpu_p99_ms']:.2f} ms); round trip p50 {r['p50_ms']:.2f} ms, p99 {r['p99_ms']:.2f} ms, "
            f"max {r['max_ms']:.2f} ms; filter+bind {r['filter_bind_per_s']:.0f} pods/s; RSS {r['rss_mib']:.0f} MiB"
        )


if __name__ == "__main__":
    main()
