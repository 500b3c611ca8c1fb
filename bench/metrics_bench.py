"""Scheduler ``/metrics`` benchmark: scrape time and sample count at 1,000 and 5,000 nodes.

Each node has 8 GPUs and 12 pods placed on them (the state is fed the way the watches feed it,
``ClusterState.apply``), which makes about 360,000 samples at 5,000 nodes with per-pod series on.
A scrape is what the ``/metrics`` handler does: ``Metrics.snapshot()`` on the event loop, then
``Metrics.render()`` (a worker thread in the server; timed here in the same thread, so the figure
is the CPU cost of one scrape; "loop" is the part on the event loop). ``first`` is the first scrape
(nothing cached: at start, or after every node changed). Three cases are timed:

* ``steady``: nothing changed between scrapes (the usual case: Prometheus scrapes every 15-60 s);
* ``churn``: one pod placed and one removed between scrapes (usage changed on two nodes);
* ``no-pod-series``: ``scheduler.metricsPodSeries: false``, steady, with the cache.

    .venv/bin/python -m bench.metrics_bench [--nodes 1000 5000] [--scrapes 30]
"""

import argparse
import gc
import statistics
import time

from vgpu.core import config as core_config
from vgpu.core import errors
from vgpu.core.config import Config
from vgpu_scheduler.metrics import Metrics
from vgpu_scheduler.state import ClusterState

from bench import fleet, percentile

PODS_PER_NODE = 12
PLACED = fleet.Placed(per_node=PODS_PER_NODE, memory_mib=1000, cores=5)


def scrape(metrics: Metrics) -> tuple[float, float, bytes]:
    """(seconds on the event loop, seconds in all, body)."""
    t0 = time.perf_counter()
    snapshot = metrics.snapshot()
    t1 = time.perf_counter()
    body = metrics.render(snapshot)
    return t1 - t0, time.perf_counter() - t0, body


def run_case(nodes: int, scrapes: int, case: str) -> dict[str, float]:
    now = time.time()
    config = Config()
    if case == "no-pod-series":
        try:
            config = core_config.load({"scheduler": {"metricsPodSeries": False}})
        except errors.ConfigError:
            return {}  # a build without the key
    state = ClusterState(config, clock=lambda: now)
    fleet.feed(state, nodes, now, placed=PLACED)
    gc.collect()  # the build's garbage: not the first scrape's cost
    metrics = Metrics(state, clock=lambda: now)
    _, first_s, body = scrape(metrics)  # the first scrape fills any cache
    loop_s: list[float] = []
    total_s: list[float] = []
    for i in range(scrapes):
        if case == "churn":
            n = i % nodes
            gpu = fleet.gpus(n)[0].uuid
            state.apply("pods", "ADDED", fleet.placed_pod(n, 1000 + i, gpu, PLACED))
            state.apply("pods", "DELETED", fleet.placed_pod(n, 1000 + i - 1, gpu, PLACED))
        on_loop, total, body = scrape(metrics)
        loop_s.append(on_loop)
        total_s.append(total)
    samples = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
    return {
        "first_s": first_s,
        "p50_s": statistics.median(total_s),
        "p99_s": percentile.pct(total_s, 0.99),
        "loop_p99_s": percentile.pct(loop_s, 0.99),
        "samples": samples,
        "bytes": len(body),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000, 5000])
    parser.add_argument("--scrapes", type=int, default=30)
    parser.add_argument("--cases", nargs="+", default=["steady", "churn", "no-pod-series"])
    opts = parser.parse_args()
    print(
        f"{'nodes':>6} {'case':>14} {'samples':>8} {'MiB':>6} {'first':>8} {'p50':>8} {'p99':>8} {'loop p99':>9}"
    )
    for nodes in opts.nodes:
        for case in opts.cases:
            got = run_case(nodes, opts.scrapes, case)
            if not got:
                print(f"{nodes:>6} {case:>14} (not supported by this build)")
                continue
            print(
                f"{nodes:>6} {case:>14} {int(got['samples']):>8} {got['bytes'] / 2**20:>6.1f} "
                f"{got['first_s'] * 1000:>7.0f}ms {got['p50_s'] * 1000:>7.0f}ms {got['p99_s'] * 1000:>7.0f}ms "
                f"{got['loop_p99_s'] * 1000:>8.1f}ms",
                flush=True,
            )


if __name__ == "__main__":
    main()
