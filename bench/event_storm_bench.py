"""/filter and /bind latency while the Events of 3,000 failed filters drain (issue 17: thread starvation).

The whole production path: the real ``SchedulerService`` with the official-client adapter
(``OfficialKubeApi``, its API call pool and watch threads) against the emulated API server over HTTP
on 127.0.0.1 (port 0), which answers each Event POST after ``--event-ms`` (a busy API server; other
calls are answered at once). N nodes with 8 GPUs and fresh Leases.

Two phases of ``--filters`` pods placed (real HTTP: a filter, then a bind that takes the node lock
and writes the Binding; the device plugin's part is written to the store after each):
  * baseline: nothing else going on;
  * storm: first ``--failed`` filters of a pod that fits nowhere (each queues a Warning event),
    then the placements while those events are still being sent. The queue length is printed
    before and after the phase, to show it was still draining.

    .venv/bin/python -m bench.event_storm_bench [--nodes 100] [--filters 200] [--failed 3000] [--event-ms 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from vgpu.core import annotations as hami
from vgpu.core.config import Config
from vgpu.core.device import Gpu, GpuUuid
from vgpu.kube.client import OfficialKubeApi
from vgpu.kube.kubeconfig import write_kubeconfig
from vgpu.localcluster.apiserver import ApiServer
from vgpu.localcluster.store import Store
from vgpu_scheduler.app import SchedulerService

from bench import percentile


class SlowEventsApiServer(ApiServer):
    """The emulated API server, answering Event creations after ``event_s``."""

    def __init__(self, store: Store, *, event_s: float) -> None:
        super().__init__(store, host="127.0.0.1", port=0)
        self._event_s = event_s

    async def _resource(self, request: web.Request) -> web.StreamResponse:
        if request.method == "POST" and request.path.endswith("/events"):
            await asyncio.sleep(self._event_s)
        return await super()._resource(request)


def populate(store: Store, nodes: int) -> list[str]:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())
    names = []
    for n in range(nodes):
        name = f"node-{n:04d}"
        gpus = [Gpu(GpuUuid(f"GPU-{n:04d}-{i}"), i, 10, 16384, 100, "NVIDIA-A100") for i in range(8)]
        register = hami.encode_node_register(gpus)
        store.create(
            "nodes", {"metadata": {"name": name, "annotations": {hami.KEYS.node_register: register}}}
        )
        lease = {
            "metadata": {"name": f"vgpu-device-plugin-{name}"},
            "spec": {"holderIdentity": name, "renewTime": stamp, "leaseDurationSeconds": 3600},
        }
        store.create("leases", lease, namespace="kube-system")
        names.append(name)
    return names


def renew_leases(store: Store, names: list[str]) -> None:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())
    for name in names:
        patch = {"spec": {"renewTime": stamp}}
        store.patch(
            "leases", f"vgpu-device-plugin-{name}", patch, patch_type="merge", namespace="kube-system"
        )


def gpu_pod(name: str, memory_mib: int) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": str(memory_mib)}
    return {
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]},
    }


async def place(
    session: aiohttp.ClientSession, url: str, store: Store, names: list[str], *, tag: str, count: int
) -> tuple[list[float], list[float]]:
    """``count`` pods, each filtered then bound (real HTTP); the device plugin's part after each bind
    (bind phase success, node lock released) is written to the store. Filter and bind latencies."""
    keys = hami.KEYS
    filter_s, bind_s, bound = [], [], 0
    for i in range(count):
        pod = store.create("pods", gpu_pod(f"{tag}-{i}", 100), namespace="default")
        meta = pod["metadata"]
        body = json.dumps({"Pod": pod, "NodeNames": names})
        start = time.perf_counter()
        async with session.post(
            f"{url}/filter", data=body, headers={"Content-Type": "application/json"}
        ) as r:
            answer = await r.json()
        filter_s.append(time.perf_counter() - start)
        if not answer["NodeNames"]:
            continue
        node = answer["NodeNames"][0]
        binding = {"PodName": meta["name"], "PodNamespace": "default", "PodUID": meta["uid"], "Node": node}
        start = time.perf_counter()
        async with session.post(f"{url}/bind", json=binding) as r:
            error = (await r.json())["Error"]
        bind_s.append(time.perf_counter() - start)
        if error:
            continue
        bound += 1
        success = {"metadata": {"annotations": {keys.bind_phase: "success"}}}
        store.patch("pods", meta["name"], success, patch_type="merge", namespace="default")
        store.patch("nodes", node, {"metadata": {"annotations": {keys.node_lock: None}}}, patch_type="merge")
    print(f"  ({tag}: {bound}/{count} filtered and bound)")
    return filter_s, bind_s


async def run(nodes: int, filters: int, failed: int, event_ms: float) -> None:
    store = Store()
    names = populate(store, nodes)
    server = SlowEventsApiServer(store, event_s=event_ms / 1000)
    await server.start()
    with tempfile.TemporaryDirectory() as tmp:
        api = OfficialKubeApi.from_kubeconfig(
            str(write_kubeconfig(Path(tmp) / "kubeconfig", server=server.url))
        )
    # (getattr: the same bench runs against a checkout from before the fix, for the comparison)
    pool = getattr(api, "pool", None)
    service = SchedulerService(Config(), api, **({"api_pool": pool} if pool is not None else {}))
    address = await service.start(host="127.0.0.1", port=0)
    try:
        await service.wait_ready(60)
        del address  # the Service port; kube-scheduler's verbs are on the loopback extender listener
        url = f"http://{service.extender_address}"
        async with aiohttp.ClientSession() as session:
            baseline = await place(session, url, store, names, tag="base", count=filters)
            big = [gpu_pod(f"big-{i}", 200_000) for i in range(failed)]
            for i, pod in enumerate(big):
                pod["metadata"] |= {"namespace": "default", "uid": f"uid-big-{i}"}
            storm_start = time.perf_counter()
            for pod in big:
                async with session.post(f"{url}/filter", json={"Pod": pod, "NodeNames": names}) as r:
                    assert not (await r.json())["NodeNames"]
            failed_s = time.perf_counter() - storm_start
            queued_before = getattr(service.events, "queued", None)
            renew_leases(store, names)  # (the device plugins' part: a slow storm outlasts the lease timeout)
            storm = await place(session, url, store, names, tag="storm", count=filters)
            queued_after = getattr(service.events, "queued", None)
        print(
            f"nodes {nodes}, event POST {event_ms:g} ms, {failed} failed filters in {failed_s:.1f} s "
            f"(events queued {queued_before}, dropped {getattr(service.events, 'dropped', '?')})"
        )
        for label, (filters_s, binds_s) in (("baseline", baseline), ("while events drain", storm)):
            for verb, values in (("/filter", filters_s), ("/bind", binds_s)):
                print(
                    f"  {label:20s} {verb:8s} p50 {percentile.pct(values, 0.5) * 1000:7.2f} ms  "
                    f"p99 {percentile.pct(values, 0.99) * 1000:7.2f} ms  max {max(values) * 1000:8.2f} ms  (n={len(values)})"
                )
        print(f"  events still queued after the storm phase: {queued_after}")
    finally:
        await service.stop()
        await api.close()
        await server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--filters", type=int, default=200)
    parser.add_argument("--failed", type=int, default=3000)
    parser.add_argument("--event-ms", type=float, default=20.0)
    opts = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    asyncio.run(run(opts.nodes, opts.filters, opts.failed, opts.event_ms))


if __name__ == "__main__":
    main()
