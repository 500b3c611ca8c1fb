"""Freed GPUs under churn: how long a parked GPU pod waits after the pod before it goes, with the
filter retries on and off, and the watches read inline or by the helper.

The demo stack (the emulated API server and kube-scheduler in this process, the real vgpu-scheduler
and one device plugin per node as processes): ``--nodes`` nodes of ``--gpus`` GPUs; one holder pod
per GPU (each takes a whole GPU), then as many waiting pods, which fail ``/filter`` and are parked
with kube-scheduler's unschedulable pods (the emulation keeps them there for 5 minutes unless an
event moves them). Then, ``--rounds`` times, a holder is deleted and the bench waits for the next
waiting pod to be bound. kube-scheduler retries its parked pods on the deletion; if its ``/filter``
call comes before the scheduler's watch has shown the deletion, the pod fails and is parked again,
and without the filter retries the freed GPU stays idle until the next event. A wait longer than
``--stall-s`` counts as a stall (the round ends there).

    .venv/bin/python -m bench.churn_bench [--nodes 4] [--gpus 2] [--rounds 8] [--stall-s 5]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import time
from typing import Any

from vgpu.demo.stack import Stack
from vgpu.kube.port import JsonObj

from bench import percentile

GPU_MIB = 15360
SETTINGS = (
    ("retries, watches inline", {"filterRetries": True, "apiWatches": "inline"}),
    ("retries, watches in helper", {"filterRetries": True, "apiWatches": "process"}),
    ("no retries, watches inline", {"filterRetries": False, "apiWatches": "inline"}),
    ("no retries, watches in helper", {"filterRetries": False, "apiWatches": "process"}),
)


def _pod(name: str, scheduler: str) -> JsonObj:
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": str(GPU_MIB)}
    return {
        "metadata": {"name": name},
        "spec": {
            "schedulerName": scheduler,
            "containers": [{"name": "c", "image": "cuda", "resources": {"limits": limits}}],
        },
    }


def _parked(pod: JsonObj) -> bool:
    return any(
        c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable"
        for c in (pod.get("status") or {}).get("conditions") or ()
    )


async def run(
    scheduler: dict[str, Any], *, nodes: int, gpus: int, rounds: int, stall_s: float
) -> dict[str, float]:
    description = {
        "nodes": [
            {"name": f"node-{n}", "gpus": [{"name": "Tesla T4", "memoryMib": GPU_MIB}] * gpus}
            for n in range(nodes)
        ]
    }
    total = nodes * gpus
    async with Stack(description, config={"scheduler": scheduler}, scheduler_backoff_s=(0.2, 1.0)) as stack:
        store, name = stack.cluster.store, stack.config.scheduler.scheduler_name

        def pods(prefix: str) -> list[JsonObj]:
            return [
                p
                for p in store.list("pods", namespace="default").items
                if p["metadata"]["name"].startswith(prefix)
            ]

        for i in range(total):
            await stack.api.create("pods", _pod(f"holder-{i}", name), namespace="default")
        await stack.until(
            lambda: sum((p.get("status") or {}).get("phase") == "Running" for p in pods("holder-")) == total,
            "the holders to run",
        )
        for i in range(total):
            await stack.api.create("pods", _pod(f"waiter-{i}", name), namespace="default")
        await stack.until(lambda: all(_parked(p) for p in pods("waiter-")), "the waiters to be parked")

        def bound() -> int:
            return sum(1 for p in pods("waiter-") if p["spec"].get("nodeName"))

        changed = asyncio.Event()

        async def follow() -> None:  # wakes the rounds at every pod event
            watch = store.watch("pods", resource_version=store.resource_version, namespace="default")
            try:
                async for _ in watch:
                    changed.set()
            finally:
                watch.close()

        follower = asyncio.create_task(follow())
        waits: list[float] = []
        stalls = 0
        try:
            for r in range(min(rounds, total)):
                before = bound()
                start = time.monotonic()
                await stack.api.delete("pods", f"holder-{r}", namespace="default")
                while bound() <= before:
                    changed.clear()
                    left = stall_s - (time.monotonic() - start)
                    if left <= 0:
                        stalls += 1
                        break
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(changed.wait(), left)
                waits.append(time.monotonic() - start)
        finally:
            follower.cancel()
            await asyncio.gather(follower, return_exceptions=True)
        nudged = sum(
            1
            for p in pods("waiter-")
            if "kube-vgpu.io/filter-retry" in (p["metadata"].get("annotations") or {})
        )
    return {
        "p50_s": percentile.pct(waits, 0.5),
        "max_s": max(waits),
        "mean_s": statistics.fmean(waits),
        "stalls": float(stalls),
        "rounds": float(len(waits)),
        "nudged": float(nudged),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--gpus", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--stall-s", type=float, default=5.0)
    parser.add_argument("--repeat", type=int, default=1, help="runs of each setting, alternating")
    args = parser.parse_args()
    print(f"{args.nodes} nodes x {args.gpus} GPUs, {args.rounds} rounds, a stall past {args.stall_s:g} s")
    for _ in range(args.repeat):
        for label, scheduler in SETTINGS:
            got = asyncio.run(
                run(scheduler, nodes=args.nodes, gpus=args.gpus, rounds=args.rounds, stall_s=args.stall_s)
            )
            print(
                f"  {label:30s} wait p50 {got['p50_s']:5.2f} s  max {got['max_s']:5.2f} s  "
                f"stalls {got['stalls']:.0f}/{got['rounds']:.0f}  waiting pods nudged {got['nudged']:.0f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
