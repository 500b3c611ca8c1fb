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

The callers are processes of their own (``bench/preempt_clients.py``), as kube-scheduler is: a
caller on the scheduler's loop would run its own encoding and every hop of its round trips there,
each waiting behind ``/preempt``'s work as no kube-scheduler request does. One sends the
``/preempt`` calls one after another (10 warm-up calls come first, from this process); the other
sends ``/filter`` calls (a 1,000 MiB pod that fits, over the nodes not offered: its reservation
must not change the answers), one started every ``--filter-every-ms`` (2 ms; 0: each as soon as
the last is answered), for ``alone_s`` (3 s) before the first ``/preempt`` and then until the last
is answered. Its p50 and p99 are reported for both windows: alone, and beside ``/preempt``. The
server figures are the verb's time in this process (CPU: the process's, so the ``/filter`` calls
answered meanwhile count too). ``--loop-steps`` also times ``/preempt``'s loop steps in the loop
thread's CPU time (``preempt_steps``): what a request arriving meanwhile may wait for, whatever the
machine's load. Target: ``/preempt`` p99 < 50 ms, ``/filter`` p99 unchanged.

    .venv/bin/python -m bench.preempt_bench [--nodes 1000] [--candidates 500] [--requests 200] [--worst]
        [--filter-every-ms 2] [--loop-steps]
"""

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import time
from collections.abc import Iterator
from typing import Any

import aiohttp

from bench import filter_bench, fleet, percentile, preempt_clients

WARMUP = 10
FILTER_EVERY_MS = 2.0  # the /filter caller starts a call this often (0: back to back)
FIRST_REQUEST = 1_000_000  # the measured requests' preemptors are numbered from here (warm-up: 0..)


@contextlib.contextmanager
def preempt_steps() -> Iterator[list[float]]:
    """The loop steps of the ``/preempt`` calls (its task's steps, and the callback writing its
    answer) in the loop thread's CPU time, whatever the machine's load: a request arriving during
    one waits for the rest of it. Wraps asyncio's ``Handle._run`` while open (a bench's probe,
    as ``bench/loopsteps``; never the product's)."""
    steps: list[float] = []
    original = asyncio.Handle._run

    def timed(handle: asyncio.Handle) -> None:
        started = time.thread_time()
        try:
            original(handle)
        finally:
            callback: Any = getattr(handle, "_callback", None)
            owner = getattr(callback, "__self__", None)
            name = getattr(owner.get_coro(), "__qualname__", "") if isinstance(owner, asyncio.Task) else ""
            if name == "ExtenderServer.call_async" or getattr(callback, "__qualname__", "") == _ANSWER:
                steps.append(time.thread_time() - started)

    asyncio.Handle._run = timed  # type: ignore[method-assign,assignment]
    try:
        yield steps
    finally:
        asyncio.Handle._run = original  # type: ignore[method-assign]


_ANSWER = "Connection._next.<locals>.<lambda>"  # extender_conn: an async verb's answer written


async def run(
    nodes: int,
    candidates: int,
    requests: int,
    *,
    worst: bool = False,
    alone_s: float = 3.0,
    filter_every_ms: float = FILTER_EVERY_MS,
    loop_steps: bool = False,
) -> dict[str, float]:
    placed = fleet.Placed(per_node=10) if worst else None
    async with filter_bench.served(nodes, timed_path="/preempt", placed=placed) as srv:
        return await _run(
            srv,
            nodes,
            candidates,
            requests,
            worst=worst,
            alone_s=alone_s,
            every_ms=filter_every_ms,
            loop_steps=loop_steps,
        )


async def _client(*args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bench.preempt_clients",
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )


async def _last_line(proc: asyncio.subprocess.Process) -> Any:
    out, _ = await proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"a bench client failed ({proc.returncode})")
    return json.loads(out.splitlines()[-1])


async def _run(
    srv: filter_bench.Served,
    nodes: int,
    candidates: int,
    requests: int,
    *,
    worst: bool,
    alone_s: float,
    every_ms: float,
    loop_steps: bool,
) -> dict[str, float]:
    service, build_s, server, server_cpu = srv.service, srv.build_s, srv.server_s, srv.server_cpu_s
    base = f"http://{service.extender_address}"
    names = preempt_clients.offered(nodes, candidates)
    for i in [*range(WARMUP), *range(FIRST_REQUEST, FIRST_REQUEST + requests)]:
        service.state.apply("pods", "ADDED", preempt_clients.preemptor(i, worst=worst))  # as the watch has it
    need = 2 if worst else 1
    async with aiohttp.ClientSession() as session:  # the warm-up, from this process
        for i in range(WARMUP):
            body = preempt_clients.preempt_body(i, names, worst=worst)
            async with session.post(f"{base}/preempt", data=body) as r:
                got = (await r.json())["NodeNameToMetaVictims"]
            assert got and all(len(v["Pods"]) == need for v in got.values()), got
    server.clear()
    server_cpu.clear()
    fleet.renew(service.state, nodes, time.time())  # the measured part has the 40 s of a fresh Lease
    args = [base, str(nodes), str(candidates)]
    prober = await _client("filters", *args, "--every-ms", str(every_ms))
    assert prober.stdout is not None and prober.stdin is not None
    try:
        assert (await prober.stdout.readline()).strip() == b"ready", "the /filter caller did not start"
        alone_from = time.monotonic()
        await asyncio.sleep(alone_s)
        alone_to = time.monotonic()
        extra = ["--worst"] if worst else []
        timing: contextlib.AbstractContextManager[list[float]] = (
            preempt_steps() if loop_steps else contextlib.nullcontext([])
        )
        with timing as steps:
            preempts = await _client("preempts", *args, str(requests), "--first", str(FIRST_REQUEST), *extra)
            done = await _last_line(preempts)
    finally:
        prober.stdin.close()
    samples = await _last_line(prober)
    alone = [s for t, s in samples if alone_from <= t and t + s <= alone_to]
    beside = [s for t, s in samples if done["first"] <= t and t + s <= done["last"]]
    lat, srv_s = sorted(done["latencies"]), sorted(server)
    return {
        "nodes": nodes,
        "candidates": len(names),
        "answered_min": min(done["answered"]),
        "build_s": build_s,
        "server_p50_ms": statistics.median(srv_s) * 1000,
        "server_p99_ms": percentile.pct(srv_s, 0.99) * 1000,
        "server_cpu_p99_ms": percentile.pct(server_cpu, 0.99) * 1000,
        "p50_ms": statistics.median(lat) * 1000,
        "p99_ms": percentile.pct(lat, 0.99) * 1000,
        "max_ms": lat[-1] * 1000,
        "filter_alone_p99_ms": percentile.pct(alone, 0.99) * 1000,
        "filter_beside_p99_ms": percentile.pct(beside, 0.99) * 1000,
        "filter_alone_p50_ms": percentile.pct(alone, 0.5) * 1000,
        "filter_beside_p50_ms": percentile.pct(beside, 0.5) * 1000,
        "filters_beside": len(beside),
        "step_p99_ms": percentile.pct(steps, 0.99) * 1000,
        "step_max_ms": max(steps, default=float("nan")) * 1000,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--candidates", type=int, default=500)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--worst", action="store_true", help="two whole-GPU containers, 10 pods per node")
    parser.add_argument(
        "--filter-every-ms",
        type=float,
        default=FILTER_EVERY_MS,
        help="a /filter call this often (0: back to back)",
    )
    parser.add_argument(
        "--loop-steps", action="store_true", help="also time /preempt's loop steps (CPU; adds a little work)"
    )
    args = parser.parse_args()
    r = asyncio.run(
        run(
            args.nodes,
            args.candidates,
            args.requests,
            worst=args.worst,
            filter_every_ms=args.filter_every_ms,
            loop_steps=args.loop_steps,
        )
    )
    print(
        f"{int(r['nodes'])} nodes x {filter_bench.GPUS_PER_NODE} GPUs, {'10' if args.worst else filter_bench.PODS_PER_NODE}"
        f" pods/node, {int(r['candidates'])} candidate nodes ({int(r['answered_min'])} or more answered): state "
        f"built in {r['build_s']:.1f} s; /preempt in the server p50 {r['server_p50_ms']:.1f} ms, p99 "
        f"{r['server_p99_ms']:.1f} ms (CPU p99 {r['server_cpu_p99_ms']:.1f} ms); round trip p50 "
        f"{r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms, max {r['max_ms']:.1f} ms (target p99 < 50 ms); "
        f"/filter p50 / p99 alone {r['filter_alone_p50_ms']:.2f} / {r['filter_alone_p99_ms']:.2f} ms, beside "
        f"/preempt {r['filter_beside_p50_ms']:.2f} / {r['filter_beside_p99_ms']:.2f} ms "
        f"({int(r['filters_beside'])} calls)"
        + (
            f"; /preempt's loop steps p99 {r['step_p99_ms']:.2f} ms, max {r['step_max_ms']:.2f} ms (CPU)"
            if args.loop_steps
            else ""
        )
    )


if __name__ == "__main__":
    main()
