"""The callers of ``bench.preempt_bench``, each a process of its own, as kube-scheduler is.

A caller in the scheduler's own process would run its encoding, its parsing and every hop of its
round trips on the loop it measures, and each hop would wait behind ``/preempt``'s work as no
kube-scheduler request does. So ``preempt_bench`` serves from its process and runs these:

* ``filters URL NODES CANDIDATES [--every-ms MS]``: ``/filter`` calls one after another (a 1,000
  MiB pod that fits, over the nodes not offered to ``/preempt``), one started every ``MS`` at
  most (0: each as soon as the last is answered), until its stdin closes; prints ``ready`` after a
  warm-up, then at the end one JSON line: ``[[start, seconds], ...]`` (``time.monotonic``, the
  same clock in every process of the machine);
* ``preempts URL NODES CANDIDATES REQUESTS [--worst] [--first N]``: the ``/preempt`` calls one
  after another, their bodies built before the first; checks every answer (each answered node
  names the minimum) and prints one JSON line: latencies, nodes answered, first start, last end.

    .venv/bin/python -m bench.preempt_clients filters http://127.0.0.1:PORT 1000 500
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

import aiohttp

from bench import fleet

FILTER_WARMUP = 50
FIRST_FILTER_POD = 3_000_000


def offered(nodes: int, candidates: int) -> list[str]:
    """The candidate nodes each ``/preempt`` offers: spread over the cluster."""
    return [fleet.node_name(n) for n in range(0, nodes, max(1, nodes // candidates))][:candidates]


def filter_names(nodes: int, candidates: int) -> list[str]:
    """The nodes each ``/filter`` offers: those not offered to ``/preempt`` (its reservations
    there must not change the preemption answers)."""
    skip = set(offered(nodes, candidates))
    return [n for n in map(fleet.node_name, range(nodes)) if n not in skip] or sorted(skip)


def filter_pod(i: int) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"}
    return {
        "metadata": {
            "name": f"bench-{i}",
            "namespace": "default",
            "uid": f"bench-uid-{i}",
            "annotations": {},
        },
        "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]},
        "status": {"phase": "Pending"},
    }


def preemptor(i: int, *, worst: bool = False) -> dict[str, Any]:
    """The preemptor of request ``i`` (priority 1000): one container asking 15,000 MiB of one GPU,
    or (``worst``) two containers asking a whole GPU each."""
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
        "spec": {"priority": 1000, "containers": containers},
        "status": {"phase": "Pending"},
    }


def preempt_body(i: int, names: list[str], *, worst: bool) -> bytes:
    """ExtenderPreemptionArgs for request ``i``: every name with kube-scheduler's empty proposal."""
    victims = {n: {"Pods": [], "NumPDBViolations": 0} for n in names}
    return json.dumps({"Pod": preemptor(i, worst=worst), "NodeNameToMetaVictims": victims}).encode()


async def filters(url: str, names: list[str], *, every_s: float) -> None:
    samples: list[tuple[float, float]] = []
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)

    async def until_eof() -> None:
        await reader.read()
        stop.set()

    watcher = asyncio.create_task(until_eof())
    headers = {"Content-Type": "application/json"}
    async with aiohttp.ClientSession() as session:
        i = 0
        while not stop.is_set():
            i += 1
            body = json.dumps({"Pod": filter_pod(FIRST_FILTER_POD + i), "NodeNames": names}).encode()
            start = time.monotonic()
            async with session.post(f"{url}/filter", data=body, headers=headers) as r:
                raw = await r.read()
            samples.append((start, time.monotonic() - start))
            result = json.loads(raw)
            assert not result["Error"] and result["NodeNames"], result
            if i == FILTER_WARMUP:
                print("ready", flush=True)
            if every_s > 0:
                await asyncio.sleep(max(0.0, start + every_s - time.monotonic()))
    await watcher
    print(json.dumps(samples[FILTER_WARMUP:]), flush=True)


async def preempts(url: str, names: list[str], requests: int, *, worst: bool, first: int) -> None:
    bodies = [preempt_body(first + i, names, worst=worst) for i in range(requests)]
    need = 2 if worst else 1
    latencies: list[float] = []
    answered: list[int] = []
    headers = {"Content-Type": "application/json"}
    started = time.monotonic()
    async with aiohttp.ClientSession() as session:
        for body in bodies:
            start = time.monotonic()
            async with session.post(f"{url}/preempt", data=body, headers=headers) as r:
                raw = await r.read()
            latencies.append(time.monotonic() - start)
            got = json.loads(raw)["NodeNameToMetaVictims"]
            assert got and all(len(v["Pods"]) == need for v in got.values()), got
            answered.append(len(got))
    done = {"latencies": latencies, "answered": answered, "first": started, "last": time.monotonic()}
    print(json.dumps(done), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("role", choices=("filters", "preempts"))
    parser.add_argument("url")
    parser.add_argument("nodes", type=int)
    parser.add_argument("candidates", type=int)
    parser.add_argument("requests", type=int, nargs="?", default=0)
    parser.add_argument("--worst", action="store_true")
    parser.add_argument("--first", type=int, default=0, help="the first preemptor's number")
    parser.add_argument("--every-ms", type=float, default=0.0, help="filters: one call started this often")
    args = parser.parse_args()
    if args.role == "filters":
        names = filter_names(args.nodes, args.candidates)
        asyncio.run(filters(args.url, names, every_s=args.every_ms / 1000))
    else:
        names = offered(args.nodes, args.candidates)
        asyncio.run(preempts(args.url, names, args.requests, worst=args.worst, first=args.first))


if __name__ == "__main__":
    main()
