"""The vgpu-scheduler's event-loop steps, by kind: loaded into it by ``bench.throughput_bench
--loop-steps`` (this directory first on its PYTHONPATH), never by the product.

A request that arrives while the loop runs a callback waits for the rest of that callback, so the
long ones are what a ``/filter`` waits for inside kube-scheduler's serial cycle. Every callback the
loop runs (``asyncio.Handle._run``: task steps, I/O readiness, timers) is timed in the loop
thread's CPU time (``time.thread_time``: time the thread was descheduled does not count); those of
at least ``VGPU_BENCH_LOOP_STEPS_MIN_MS`` (0.2) are counted in buckets per kind (the task's
coroutine, or the callback and, for a transport, its protocol). The counts are written as JSON to
``$VGPU_BENCH_LOOP_STEPS`` every ``WRITE_EVERY_S``, replaced whole, for the bench to read and
difference per phase. Only in the process whose command line runs ``vgpu_scheduler.main`` (its
writes helper inherits the environment).
"""

from __future__ import annotations

import os
import pathlib

BUCKETS_MS = (0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, float("inf"))
WRITE_EVERY_S = 0.5


def _ours() -> bool:
    try:
        return b"vgpu_scheduler.main" in pathlib.Path("/proc/self/cmdline").read_bytes()
    except OSError:
        return False


def _install(path: pathlib.Path, min_ms: float) -> None:
    import asyncio
    import bisect
    import json
    import threading
    import time
    from typing import Any

    counts: dict[str, list[int]] = {}
    totals: dict[str, float] = {}
    original = asyncio.Handle._run
    min_s = min_ms / 1000

    def kind(handle: asyncio.Handle) -> str:
        callback: Any = getattr(handle, "_callback", None)
        owner = getattr(callback, "__self__", None)
        if isinstance(owner, asyncio.Task):
            return "task " + getattr(owner.get_coro(), "__qualname__", "?")
        name = getattr(callback, "__qualname__", type(callback).__name__)
        protocol = getattr(owner, "_protocol", None)
        return name + (f" ({type(protocol).__qualname__})" if protocol is not None else "")

    def timed(handle: asyncio.Handle) -> None:
        started = time.thread_time()
        try:
            original(handle)
        finally:
            spent = time.thread_time() - started
            if spent >= min_s:
                key = kind(handle)
                row = counts.setdefault(key, [0] * len(BUCKETS_MS))
                row[bisect.bisect_left(BUCKETS_MS, spent * 1000)] += 1
                totals[key] = totals.get(key, 0.0) + spent

    def write() -> None:
        while True:
            time.sleep(WRITE_EVERY_S)
            snapshot = {
                k: {"buckets": list(v), "total_s": totals.get(k, 0.0)} for k, v in list(counts.items())
            }
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps({"buckets_ms": BUCKETS_MS[:-1], "kinds": snapshot}))
            os.replace(tmp, path)

    asyncio.Handle._run = timed  # type: ignore[method-assign,assignment]
    threading.Thread(target=write, name="loop-steps", daemon=True).start()


if os.environ.get("VGPU_BENCH_LOOP_STEPS") and _ours():
    _install(
        pathlib.Path(os.environ["VGPU_BENCH_LOOP_STEPS"]),
        float(os.environ.get("VGPU_BENCH_LOOP_STEPS_MIN_MS", "0.2")),
    )
