"""Preemption benchmark: ``/preempt`` latency at 1,000 nodes x 8 GPUs, and ``/filter`` beside it (issues 14, 49).

The cluster is filter_bench's (16 GiB GPUs, 2,000 MiB priority-0 pods, fed to the state as the
watches feed it). Each request offers ``--candidates`` nodes in ``NodeNameToMetaVictims`` with
kube-scheduler's empty proposal (a GPU-only shortfall), through the real service over HTTP on
127.0.0.1 (port 0), for a priority-1000 preemptor that fits nowhere (it is in the state, as the pod
watch would have it: its priority is read from the cluster, not the body):

* default: 8 pods per node (one per GPU), one container asking for one GPU with 15,000 MiB: every
  node needs exactly one victim;
* ``--worst``: 10 pods per node (two on GPUs 0 and 1), two containers each asking for a whole GPU
  (100 % of its cores): every node needs two victims, found by the search by size with the slow
  fit (55 checks per node).

Nodes past the call's budget (25 ms of CPU) are left out; every answered node must name exactly
the minimum; the fewest nodes answered by a call is reported.

Meanwhile a client sends ``/filter`` calls one after another (a 1,000 MiB pod that fits, over the
nodes not offered: its reservation must not change the answers); their
p99 is reported beside the same client's p99 with no ``/preempt`` running. Target: ``/preempt``
p99 < 50 ms, ``/filter`` p99 unchanged.

    .venv/bin/python -m bench.preempt_bench [--nodes 1000] [--candidates 500] [--requests 200] [--worst]
"""

import argparse
import asyncio
import json
import statistics
import time
from typing import Any

import aiohttp

from bench import filter_bench, fleet, percentile

PREEMPTOR_PRIORITY = 1000


def preemptor(i: int, *, worst: bool = False) -> dict[str, Any]:
    if worst:
        whole = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000", "nvidia.com/gpucores": "100"}
        containers = [{"name": f"c{k}", "resources": {"limits": whole}} for k in range(2)]
    else:
        limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "15000"}
        containers = [{"name": "c", "resources": {"limits": limits}}]
    return {
        "metadata": {
            "name": f"train-{i}",
            "namespace": "default",
            "uid": f"train-uid-{i}",
            "annotations": {},
        },
        "spec": {"priority": PREEMPTOR_PRIORITY, "containers": containers},
        "status": {"phase": "Pending"},
    }


async def run(nodes: int, candidates: int, requests: int, *, worst: bool = False) -> dict[str, float]:
    placed = fleet.Placed(per_node=10) if worst else None
    async with filter_bench.served(nodes, timed_path="/preempt", placed=placed) as srv:
        return await _run(srv, nodes, candidates, requests, worst=worst)


async def _run(
    srv: filter_bench.Served, nodes: int, candidates: int, requests: int, *, worst: bool
) -> dict[str, float]:
    service, build_s, server, server_cpu = srv.service, srv.build_s, srv.server_s, srv.server_cpu_s
    base = f"http://{service.extender_address}"
    offered = [f"node-{n:05d}" for n in range(0, nodes, max(1, nodes // candidates))][:candidates]
    # the filters' pods are reserved where they fit: on nodes not offered, so no answer changes
    names = [n for n in map(fleet.node_name, range(nodes)) if n not in set(offered)] or offered
    latencies: list[float] = []
    answered: list[int] = []
    need = 2 if worst else 1
    async with aiohttp.ClientSession() as session:

        async def one(i: int) -> None:
            pod = preemptor(i, worst=worst)
            service.state.apply("pods", "ADDED", pod)
            body = json.dumps(
                {
                    "Pod": pod,
                    "NodeNameToMetaVictims": {n: {"Pods": [], "NumPDBViolations": 0} for n in offered},
                }
            )
            start = time.perf_counter()
            async with session.post(
                f"{base}/preempt", data=body, headers={"Content-Type": "application/json"}
            ) as r:
                result = await r.json()
            latencies.append(time.perf_counter() - start)
            got = result["NodeNameToMetaVictims"]
            assert got and all(len(v["Pods"]) == need for v in got.values()), result
            answered.append(len(got))

        async def filters(until: asyncio.Event, out: list[float]) -> None:
            i = 0
            while not until.is_set():
                i += 1
                body = json.dumps({"Pod": filter_bench.new_pod(srv.api, 3_000_000 + i), "NodeNames": names})
                start = time.perf_counter()
                async with session.post(f"{base}/filter", data=body) as r:
                    result = await r.json()
                out.append(time.perf_counter() - start)
                assert not result["Error"], result

        async def filters_for(seconds: float) -> list[float]:
            out: list[float] = []
            done = asyncio.Event()
            task = asyncio.create_task(filters(done, out))
            await asyncio.sleep(seconds)
            done.set()
            await task
            return out

        for i in range(10):  # warm-up
            await one(1_000_000 + i)
        latencies.clear()
        answered.clear()
        server.clear()
        server_cpu.clear()
        alone = await filters_for(3.0)
        beside: list[float] = []
        stop = asyncio.Event()
        prober = asyncio.create_task(filters(stop, beside))
        for i in range(requests):
            await one(i)
        stop.set()
        await prober
    lat, srv_s = sorted(latencies), sorted(server)
    return {
        "nodes": nodes,
        "candidates": len(offered),
        "answered_min": min(answered),
        "build_s": build_s,
        "server_p50_ms": statistics.median(srv_s) * 1000,
        "server_p99_ms": percentile.pct(srv_s, 0.99) * 1000,
        "server_cpu_p99_ms": percentile.pct(server_cpu, 0.99) * 1000,
        "p50_ms": statistics.median(lat) * 1000,
        "p99_ms": percentile.pct(lat, 0.99) * 1000,
        "max_ms": lat[-1] * 1000,
        "filter_alone_p99_ms": percentile.pct(sorted(alone), 0.99) * 1000,
        "filter_beside_p99_ms": percentile.pct(sorted(beside), 0.99) * 1000,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--candidates", type=int, default=500)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--worst", action="store_true", help="two whole-GPU containers, 10 pods per node")
    args = parser.parse_args()
    r = asyncio.run(run(args.nodes, args.candidates, args.requests, worst=args.worst))
    print(
        f"{int(r['nodes'])} nodes x {filter_bench.GPUS_PER_NODE} GPUs, {'10' if args.worst else filter_bench.PODS_PER_NODE}"
        f" pods/node, {int(r['candidates'])} candidate nodes ({int(r['answered_min'])} or more answered): state "
        f"built in {r['build_s']:.1f} s; /preempt in the server p50 {r['server_p50_ms']:.1f} ms, p99 "
        f"{r['server_p99_ms']:.1f} ms (CPU p99 {r['server_cpu_p99_ms']:.1f} ms); round trip p50 "
        f"{r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms, max {r['max_ms']:.1f} ms (target p99 < 50 ms); "
        f"/filter p99 alone {r['filter_alone_p99_ms']:.2f} ms, beside /preempt {r['filter_beside_p99_ms']:.2f} ms"
    )


if __name__ == "__main__":
    main()
