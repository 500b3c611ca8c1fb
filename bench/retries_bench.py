"""Filter retries benchmark: what one release costs the scheduler's event loop with pods pending.

A fleet of nodes (``bench.fleet``: 8 GPUs of 16 GiB each, 8 pods placed per node) and ``--pending``
pods whose last ``/filter`` failed, recorded as the extender records them. Each release is
``FilterRetries.freed(node)`` of the dearer kind, GPUs that came back on the node (every pending
failure is looked at; after a pod went, only those of the last 2 s); its time is measured on its own (the nudges' writes go to an API that answers at once, off the measurement).
Three kinds of backlog:

- ``alike-fit``: replicas asking alike (1 GPU, 4,000 MiB) that fit the node: 20 nudged per release
  until the per-second budget is spent, then none;
- ``alike-miss``: replicas asking alike for more than any GPU has: fitted once per release;
- ``distinct-miss``: every pod asking a different amount, none fitting: one fit per pod looked at.

    .venv/bin/python -m bench.retries_bench [--nodes 1000] [--pending 10000] [--releases 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import statistics
import time
from typing import Any

from vgpu.core import request
from vgpu.core.config import Config
from vgpu.kube.port import JsonObj
from vgpu_scheduler import retries
from vgpu_scheduler.pending import Ask, FilterReasons
from vgpu_scheduler.state import ClusterState

from bench import fleet, percentile
from bench.procstat import rss_mib

KINDS = ("alike-fit", "alike-miss", "distinct-miss")


class _Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


class _NoApi:
    """Takes each nudge at once (``merge_patch`` is the only call FilterRetries makes)."""

    async def merge_patch(self, *args: Any, **kwargs: Any) -> JsonObj:
        return {}


def _pending(i: int, memory_mib: int) -> JsonObj:
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": str(memory_mib)}
    return {
        "metadata": {"name": f"pending-{i}", "namespace": "jobs", "uid": f"pending-{i}"},
        "spec": {
            "schedulerName": "vgpu-scheduler",
            "containers": [{"name": "c", "resources": {"limits": limits}}],
        },
        "status": {"phase": "Pending"},
    }


def _memory(kind: str, i: int) -> int:
    if kind == "alike-fit":
        return 4000
    if kind == "alike-miss":
        return 20000
    return 17000 + i  # distinct, and more than a 16 GiB GPU has


async def run(kind: str, *, nodes: int, pending: int, releases: int) -> dict[str, float]:
    config = Config()
    clock = _Clock()
    state = ClusterState(config, clock=clock)
    # 8 pods of 2,000 MiB per node, as the filter bench places them: 14,384 MiB free on each GPU
    fleet.feed(state, nodes, clock())
    reasons = FilterReasons()
    for i in range(pending):
        pod = _pending(i, _memory(kind, i))
        state.apply("pods", "ADDED", pod)
        ask = Ask(request.parse_pod(pod, config), config.scheduler.gpu_policy)
        reasons.failed(f"pending-{i}", "no GPU fits", now=clock() - 1.0, ask=ask)
    nudger = retries.FilterRetries(
        api=_NoApi(),  # type: ignore[arg-type]
        reasons=reasons,
        state=state,
        clock=clock,
        wall_clock=lambda: datetime.datetime.now(datetime.UTC),
    )
    took: list[float] = []
    for r in range(releases):
        clock.now += 0.01  # 100 releases a second
        node = fleet.node_name(r % nodes)
        start = time.perf_counter()
        nudger.freed(node)
        took.append(time.perf_counter() - start)
        await nudger.flush()
    return {
        "p50_us": percentile.pct(took, 0.5) * 1e6,
        "p99_us": percentile.pct(took, 0.99) * 1e6,
        "mean_us": statistics.fmean(took) * 1e6,
        "nudges": float(nudger.sent),
        "rss_mib": rss_mib(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pending", type=int, default=10_000)
    parser.add_argument("--releases", type=int, default=2000)
    parser.add_argument("--kinds", nargs="*", default=list(KINDS), choices=KINDS)
    args = parser.parse_args()
    print(f"{args.nodes} nodes, {args.pending} pending pods, {args.releases} releases (100 a second)")
    for kind in args.kinds:
        got = asyncio.run(run(kind, nodes=args.nodes, pending=args.pending, releases=args.releases))
        print(
            f"  {kind:13s} release p50 {got['p50_us']:7.1f} µs  p99 {got['p99_us']:7.1f} µs  "
            f"mean {got['mean_us']:7.1f} µs  nudges {got['nudges']:.0f}  RSS {got['rss_mib']:.0f} MiB"
        )


if __name__ == "__main__":
    main()
