"""One phase of the throughput bench: its pods created, followed to bound and settled, measured.

A phase is a list of pod bodies (``throughput_pods``) created by ``CLIENTS`` concurrent clients,
open loop at ``create_rate`` or as fast as they can. ``Tracker``, fed by the node side's pods
watch, notes when each pod was created and first seen bound, and when the node side is done with
it. ``run_phase`` then reads the figures (``throughput_figures``): bound pods/s, the create rate,
create -> bound latency p50/p99, distinct nodes, API writes per pod by client, each process's CPU
per pod and its wait for a core, the vgpu-scheduler's answer time per verb, kube-scheduler's own
split and cycle times, the Events per pod and the vgpu-scheduler's long loop steps.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pathlib
import time
from collections.abc import Awaitable, Callable
from typing import Any

from vgpu.core import annotations as hami
from vgpu.kube import aioapi

from bench import percentile
from bench.procstat import busy_fraction, cpu_seconds, machine_jiffies, run_queue_seconds
from bench.throughput_figures import (
    cycle_means,
    dialled_share,
    events_by_reason,
    extender_figures,
    loop_step_summary,
    offered_rate,
    read_loop_steps,
    read_split,
    served_ms,
)
from bench.throughput_pods import NAMESPACE

CLIENTS = 8
SETTLE_TIMEOUT_S = 30.0  # after the last bind, for the node side to finish the phase's pods
CLIENT_NAMES = {"OpenAPI-Generator": "vgpu-scheduler"}  # the official client's User-Agent (apiClient threads)


class Tracker:
    """When each pod of the phase was created and first seen bound, and whether the node side is
    done with it (Running or Failed, and no bind phase still ``allocating``: the device plugin
    writes a GPU pod's bind phase after answering Allocate, so a pod can run before that write
    lands). Fed by the node side's pods watch: one watch fewer for the API server to serve and this
    process to decode."""

    def __init__(self) -> None:
        self.created: dict[str, float] = {}
        self.bound: dict[str, float] = {}
        self.node: dict[str, str] = {}
        self.started: set[str] = set()
        self._want: set[str] = set()
        self._unsettled: set[str] = set()
        self.done = asyncio.Event()
        self.settled = asyncio.Event()

    def expect(self, names: list[str]) -> None:
        self._want = set(names) - self.bound.keys()  # the phase's pods not seen bound yet
        self._unsettled = set(names) - self.started
        for want, event in ((self._want, self.done), (self._unsettled, self.settled)):
            if want:
                event.clear()
            else:
                event.set()

    def on_pod(self, change: Any) -> None:
        pod = change.object
        name = pod["metadata"]["name"]
        node = (pod.get("spec") or {}).get("nodeName")
        phase = ((pod.get("metadata") or {}).get("annotations") or {}).get(hami.KEYS.bind_phase)
        if (
            change.type != "DELETED"
            and name not in self.started
            and (pod.get("status") or {}).get("phase") in ("Running", "Failed")
            and phase != hami.BindPhase.ALLOCATING
        ):
            self.started.add(name)
            if self._unsettled:
                self._unsettled.discard(name)
                if not self._unsettled:
                    self.settled.set()
        if node and name not in self.bound and change.type != "DELETED":
            self.bound[name] = time.monotonic()
            self.node[name] = node
            if self._want:  # one set removal per bound pod, not a 1,000-name subset test
                self._want.discard(name)
                if not self._want:
                    self.done.set()


LOOP_STEPS_WRITE_S = 0.6  # bench/loopsteps writes its counts every 0.5 s


async def run_phase(
    label: str,
    bodies: list[dict[str, Any]],
    *,
    api: aioapi.AioKubeApi,
    tracker: Tracker,
    timeout_s: float,
    pids: dict[str, int | None],
    create_rate: float = 0.0,
    scheduler_metrics: tuple[str, pathlib.Path] | None = None,
    scheduler_log: pathlib.Path | None = None,
    server_counts: Callable[[], Awaitable[dict[str, float]]] | None = None,
    scheduler_cycle: Callable[[], Awaitable[dict[str, tuple[float, float]]]] | None = None,
    settle_s: float = SETTLE_TIMEOUT_S,
    loop_steps: pathlib.Path | None = None,
) -> dict[str, Any]:
    """One phase. Requests per pod come from a real API server's own counters (``server_counts``:
    every verb, all clients together) or, without them, from the emulation's /debug/requests
    (writes by client)."""
    names = [b["metadata"]["name"] for b in bodies]
    tracker.expect(names)
    if server_counts is None:
        await api.request("DELETE", "/debug/requests")
    # the scheduler's /metrics scrapes stay out of the CPU per pod: the one before a GPU phase
    # renders every GPU pod of the phases before it, so it would weigh on the later phases only
    served_before = await extender_figures(*scheduler_metrics) if scheduler_metrics else {}
    server_before = await server_counts() if server_counts else {}
    cycle_before = await scheduler_cycle() if scheduler_cycle else {}
    steps_before = read_loop_steps(loop_steps) if loop_steps else {}
    cpu_before = {who: cpu_seconds(pid) for who, pid in pids.items()}
    window_start = time.monotonic()
    waited_before = {who: run_queue_seconds(pid) for who, pid in pids.items()}
    cores = os.sched_getaffinity(0)  # the ones this bench and its processes may run on (taskset)
    machine_before = machine_jiffies(cores)

    start = time.monotonic()

    async def client(offset: int) -> None:
        for index in range(offset, len(bodies), CLIENTS):
            if create_rate:  # an open-loop arrival: pod ``index`` is due at start + index / rate
                await asyncio.sleep(max(0.0, start + index / create_rate - time.monotonic()))
            body = bodies[index]
            tracker.created[body["metadata"]["name"]] = time.monotonic()
            await api.create("pods", body, namespace=NAMESPACE)

    await asyncio.gather(*(client(i) for i in range(CLIENTS)))
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(tracker.done.wait(), timeout_s)
    # the figures below (CPU, requests per pod) cover each pod's whole way: the last pods' Allocate
    # and bind-phase write come just after they are bound
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(tracker.settled.wait(), settle_s)
    counts = (await api.request("GET", "/debug/requests"))["requests"] if server_counts is None else []
    used = {who: cpu_seconds(pid) - cpu_before[who] for who, pid in pids.items()}
    window = max(time.monotonic() - window_start, 1e-9)
    cpu = {who: s / len(names) for who, s in used.items()}
    waited = {who: (run_queue_seconds(pid) - waited_before[who]) / len(names) for who, pid in pids.items()}
    busy = busy_fraction(machine_before, machine_jiffies(cores))
    served_after = await extender_figures(*scheduler_metrics) if scheduler_metrics else {}
    server_after = await server_counts() if server_counts else {}
    cycle_after = await scheduler_cycle() if scheduler_cycle else {}
    if loop_steps:
        await asyncio.sleep(LOOP_STEPS_WRITE_S)  # the counts are written every 0.5 s: the phase's last
    steps_after = read_loop_steps(loop_steps) if loop_steps else {}
    split = await read_split(scheduler_log, names) if scheduler_log else {}
    events = await events_by_reason(api, names)
    served = {key: value - served_before.get(key, 0.0) for key, value in served_after.items()}
    bound = [n for n in names if n in tracker.bound]
    first = min(tracker.created[n] for n in names)
    last = max((tracker.bound[n] for n in bound), default=first)
    latencies = [tracker.bound[n] - tracker.created[n] for n in bound]
    timeline = [(tracker.created[n] - first, tracker.bound[n] - tracker.created[n]) for n in bound]
    writes: dict[str, int] = {}
    detail: dict[str, int] = {}
    for row in counts:
        if row["verb"] in ("POST", "PUT", "PATCH", "DELETE") and row["resource"] != "leases":
            who = CLIENT_NAMES.get(row["client"], row["client"])
            writes[who] = writes.get(who, 0) + row["count"]
            what = f"{who} {row['verb']} {row['resource']}"
            detail[what] = detail.get(what, 0) + row["count"]
    for what, n in server_after.items():
        if n > server_before.get(what, 0.0) and not what.endswith(" leases"):
            detail[what] = round(n - server_before.get(what, 0.0))
    return {
        "label": label,
        "pods": len(names),
        "bound": len(bound),
        # pods the node side took through Allocate to Running (or Failed) within the settle time
        "settled": sum(1 for n in names if n in tracker.started),
        "rate": len(bound) / (last - first) if last > first else 0.0,
        "offered": offered_rate(tracker.created, names),
        "p50": percentile.pct(latencies, 0.50),
        "p99": percentile.pct(latencies, 0.99),
        "nodes": len({tracker.node[n] for n in bound}),
        "writes": {c: n / len(names) for c, n in sorted(writes.items())},
        "detail": {w: n / len(names) for w, n in sorted(detail.items())},
        "cpu_ms": {who: s * 1000 for who, s in cpu.items()},
        # each process's CPU over the phase's wall time: a Python process (one core at most, the
        # GIL) near 1.0 is what caps the phase however many cores are idle
        "cores_used": {who: s / window for who, s in used.items()},
        # time each process spent runnable, waiting for a core (schedstat), and how busy the cores were
        "waited_ms": {who: s * 1000 for who, s in waited.items()},
        "busy": busy,
        "cores": len(cores),
        # kube-scheduler's part of each pod's latency: p50, p99 (ms) and how many pods it covers
        "split_ms": {
            part: (percentile.pct(ms, 0.50), percentile.pct(ms, 0.99), len(ms))
            for part, ms in split.items()
            if ms
        },
        "timeline": sorted(timeline),  # (created after the phase's first create, latency), seconds
        "events": {reason: n / len(names) for reason, n in sorted(events.items())},  # per pod
        # mean time the vgpu-scheduler spent answering each /filter and /bind (its own histograms)
        "served_ms": served_ms(served),
        # the share of each verb's calls that came on a new connection (kube-scheduler dialled)
        "dialled": dialled_share(served),
        # the real kube-scheduler's own histograms over the phase: mean ms and how many observed
        "cycle_ms": cycle_means(cycle_before, cycle_after),
        # the vgpu-scheduler's event-loop steps of 0.2 ms or more over the phase, by kind (--loop-steps)
        "loop_steps": loop_step_summary(steps_before, steps_after),
    }
