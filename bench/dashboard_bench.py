"""Dashboard cost per push: the snapshot built on the event loop and its JSON (encoded in a thread).

Each node has 8 GPUs (16 GiB, 10 slots) and 8 bound pods (one per GPU, 2,000 MiB, 10 %), fed to
the state the way the watches feed it (``ClusterState.apply``). One push of the live dashboard is
one ``ui.Dashboard.capture()`` on the event loop (filters wait meanwhile) plus the snapshot built
from it and encoded to JSON in a worker thread (``ui.encode(dashboard.build(...))``); both are
timed here, with the size of the event sent to each client. The service freezes its synced state
out of the cyclic GC (``gc.freeze``, app.py); so does this benchmark once the state is built.

    .venv/bin/python -m bench.dashboard_bench [--nodes 100 1000 5000] [--repeat 5]
"""

import argparse
import gc
import statistics
import time

from vgpu.core.config import Config
from vgpu_scheduler import dashboard, ui
from vgpu_scheduler.pending import FilterReasons
from vgpu_scheduler.state import ClusterState

from bench import fleet

GPUS_PER_NODE = fleet.GPUS_PER_NODE


def build(nodes: int, now: float) -> ClusterState:
    """The fleet (``bench.fleet``): a pod on each GPU."""
    state = ClusterState(Config(), clock=lambda: now)
    fleet.feed(state, nodes, now, placed=fleet.Placed(namespace="bench"), gpu_type="NVIDIA-A100-SXM4-40GB")
    return state


def run(nodes: int, repeat: int) -> None:
    now = time.time()
    state = build(nodes, now)
    board = ui.Dashboard(state, FilterReasons(), clock=lambda: now)
    gc.collect()
    gc.freeze()
    loop_ms: list[float] = []
    encode_ms: list[float] = []
    size = 0
    for _ in range(repeat):
        started = time.perf_counter()
        cap = board.capture()
        captured = time.perf_counter()
        frame = ui.encode(dashboard.build(cap))
        encode_ms.append(1000 * (time.perf_counter() - captured))
        loop_ms.append(1000 * (captured - started))
        size = len(frame.data)
    gc.unfreeze()
    print(
        f"{nodes:>6} nodes, {nodes * GPUS_PER_NODE:>6} GPUs, {nodes * GPUS_PER_NODE:>6} pods: "
        f"capture on the loop median {statistics.median(loop_ms):6.1f} ms (max {max(loop_ms):6.1f}), "
        f"build + JSON in a thread median {statistics.median(encode_ms):6.1f} ms, event {size / 1e6:5.2f} MB"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[100, 1000, 5000])
    parser.add_argument("--repeat", type=int, default=5)
    opts = parser.parse_args()
    for nodes in opts.nodes:
        run(nodes, opts.repeat)


if __name__ == "__main__":
    main()
