"""Throughput through kube-scheduler: plain pods vs GPU pods, 1,000 nodes x 8 GPUs (issue 12).

Processes: the emulated API server (``vgpu.localcluster.serve apiserver``, every write delayed by
``--write-latency-ms``, etcd's commit), the kube-scheduler emulation (``serve kube-scheduler``:
profiles ``default-scheduler`` and ``vgpu-scheduler``, the extender as the chart renders it: filter
+ bind over plain HTTP to the loopback extender listener, nodeCacheCapable, our resources
ignoredByScheduler), the real ``vgpu-scheduler`` (its Service port over HTTPS, as the demo runs
it), and this one: the node side (``throughput_nodes``: per node the
device plugin's register annotation, a fresh Lease and its real Allocate after the kubelet's
admission delay, then Running; with ``--node-procs N`` from N processes of their own, each a shard
of the nodes with its own pods watch, so one Python core does not cap the nodes where cores are
spare), 8 concurrent clients creating the pods, and a watcher that checks no GPU is ever
overcommitted. Phases run in order: plain pods (default-scheduler), then GPU pods
(1 GPU + 1,000 MiB, vgpu-scheduler) with each node policy asked for.

    .venv/bin/python -m bench.throughput_bench [--nodes 1000] [--pods 1000] [--policies binpack spread]
        [--admission-delay-s 0] [--start-delay-s S] [--plugin-search {kube-vgpu,hami}]
        [--write-latency-ms 20] [--percentage-of-nodes-to-score N] [--quick]
        [--create-rate PODS_PER_S] [--api-workers N] [--label-assigned-pods] [--node-lock contended]
        [--api-client threads] [--api-writer inline|process] [--api-watches inline|process]
        [--node-procs N] [--loop-steps] [--webhooks none|chart] [--k8s-bin DIR]
        [--node-locks always contended] [--dra]

``--node-locks`` runs the GPU phases once per lock mode given, in order, in one run (the
vgpu-scheduler restarted with that ``nodeLock`` between them; labels ``gpu-binpack-contended``...).
``--dra`` (with ``--k8s-bin``) adds a last phase of DRA GPU pods (``throughput_dra``): every node
gets a ResourceSlice, a real kube-controller-manager runs the resourceclaim controller, and
kube-scheduler's own DRA plugin allocates the GPU shares; the phase also prints where a DRA pod's
time went (claim created, allocated, bound) and the overcommit check covers the claims.

Prints per phase: bound pods/s (pods / time from the first create to the last bind seen) and the
rate the clients created them at,
create -> bound latency p50/p99, distinct nodes, API writes per pod by client (leases excluded),
each process's CPU per pod, the vgpu-scheduler's answer time per verb and its share of calls on a
new connection, kube-scheduler's own cycle times (per extension point with ``--k8s-bin``), and the
overcommit check; exits 1 if any pod did not bind or any GPU was overcommitted.

``--webhooks chart`` registers the admission webhooks as the chart installs them on a cluster before
1.28 (the mutating webhook on every pod CREATE, and the update guard on every pod and node UPDATE;
``guard.mode: webhook``, no ``matchConditions``), pointed at the vgpu-scheduler's Service port,
creates the GPU pods without a ``schedulerName`` (the webhook sets it), and trusts
``system:masters`` (the chart's ``guard.extraGroups``), the bench's identity. By default there are
none, as in issue 12's setup.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import datetime
import json
import logging
import os
import pathlib
import re
import shutil
import signal
import ssl
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from typing import Any

import aiohttp
import yaml
from prometheus_client.parser import text_string_to_metric_families
from vgpu import gcfreeze
from vgpu.core import annotations as hami
from vgpu.core import config as configs
from vgpu.core import errors
from vgpu.demo import hamicore, webhookconfig
from vgpu.gcfreeze import SurvivorFreezer
from vgpu.kube import aioapi, kubeconfig
from vgpu.localcluster import certs, cluster, description
from vgpu.localcluster.serve import LocalProcess

from bench import percentile, realk8s, throughput_dra
from bench.procstat import busy_fraction, children, cpu_seconds, machine_jiffies, run_queue_seconds
from bench.throughput_nodes import NodeSide, Shards, fake_gpus, node_names, shard_args

CLIENTS = 8
SETTLE_TIMEOUT_S = 30.0  # after the last bind, for the node side to finish the phase's pods
CLIENT_NAMES = {"OpenAPI-Generator": "vgpu-scheduler"}  # the official client's User-Agent (apiClient threads)
NAMESPACE = "default"


def kube_scheduler_config(
    url: str,
    config: configs.Config,
    *,
    percentage: int,
    api_version: str = "kubescheduler.config.k8s.io/v1",
    kubeconfig_path: pathlib.Path | None = None,
) -> dict[str, Any]:
    """What deploy/helm/kube-vgpu/templates/scheduler-kubeschedulerconfig.yaml renders (the extender
    on loopback, plain HTTP), with the default profile beside ours in one process. For a real
    kube-scheduler (``kubeconfig_path``): its client unthrottled (qps = burst = 5000, as issue 12's
    measurement ran it) and no leader election."""
    out: dict[str, Any] = {
        "apiVersion": api_version,
        "kind": "KubeSchedulerConfiguration",
        "profiles": [
            {"schedulerName": "default-scheduler"},
            {"schedulerName": config.scheduler.scheduler_name},
        ],
        "extenders": [
            {
                "urlPrefix": url,
                "filterVerb": "filter",
                "bindVerb": "bind",
                "preemptVerb": "preempt",  # as the chart renders it
                "nodeCacheCapable": True,
                "enableHTTPS": False,
                "httpTimeout": "30s",
                "ignorable": False,
                "managedResources": [{"name": n, "ignoredByScheduler": True} for n in config.resources.all()],
            }
        ],
    }
    if percentage:
        out["percentageOfNodesToScore"] = percentage
    if kubeconfig_path is not None:
        out["clientConnection"] = {"kubeconfig": str(kubeconfig_path), "qps": 5000, "burst": 5000}
        out["leaderElection"] = {"leaderElect": False}
    return out


def plain_pod(name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"bench": "throughput"}},
        "spec": {
            "schedulerName": "default-scheduler",
            "containers": [
                {
                    "name": "main",
                    "image": "busybox",
                    "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
                }
            ],
        },
    }


def gpu_pod(name: str, *, config: configs.Config, policy: str, webhook: bool = False) -> dict[str, Any]:
    """A GPU pod as the webhook leaves it; with ``webhook``, as a user writes it (the webhook, then
    registered, sets its ``schedulerName``)."""
    limits = {config.resources.count: "1", config.resources.memory: "1000"}
    spec: dict[str, Any] = {
        "containers": [{"name": "main", "image": "cuda", "resources": {"limits": limits}}]
    }
    if not webhook:
        spec["schedulerName"] = config.scheduler.scheduler_name
    return {
        "metadata": {
            "name": name,
            "labels": {"bench": "throughput"},
            "annotations": {f"{config.annotation_prefix}/node-scheduler-policy": policy},
        },
        "spec": spec,
    }


# the kube-scheduler emulation's line for each bound pod (vgpu.localcluster.scheduler)
_SPLIT_LINE = re.compile(
    r"scheduled pod (?P<ns>[^/\s]+)/(?P<name>\S+) to node \S+ "
    r"\(queued (?P<queued>\d+(?:\.\d+)?) ms, cycle (?P<cycle>\d+(?:\.\d+)?) ms, "
    r"binding (?P<binding>\d+(?:\.\d+)?) ms\)"
)
SPLIT_PARTS = ("queued", "cycle", "binding")


def scheduling_split(
    log_text: str, names: Iterable[str], *, namespace: str = NAMESPACE
) -> dict[str, list[float]]:
    """Per part of kube-scheduler's path (its wait in the active queue, its scheduling cycle, its
    binding cycle), the milliseconds of each of ``names`` that the emulation's log reports as bound
    (a pod bound twice: its last line). Lines that do not match are skipped."""
    wanted = set(names)
    found: dict[str, tuple[float, float, float]] = {}
    for match in _SPLIT_LINE.finditer(log_text):
        if match["ns"] == namespace and match["name"] in wanted:
            found[match["name"]] = (float(match["queued"]), float(match["cycle"]), float(match["binding"]))
    return {part: [times[i] for times in found.values()] for i, part in enumerate(SPLIT_PARTS)}


async def read_split(
    log_path: pathlib.Path, names: list[str], *, wait_s: float = 5.0
) -> dict[str, list[float]]:
    """``scheduling_split`` of the emulation's log, read again for up to ``wait_s`` until every pod's
    line is there (the bench sees a pod bound through its watch before the emulation has logged
    it, and the emulation's log writer flushes in batches)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            text = await asyncio.to_thread(log_path.read_text, errors="replace")
        except OSError:
            text = ""
        split = scheduling_split(text, names)
        if len(split["queued"]) >= len(names) or time.monotonic() >= deadline:
            return split
        await asyncio.sleep(0.05)  # another process writes the file: nothing to wait on but time


def phase_labels(policies: Iterable[str]) -> list[tuple[str, str]]:
    """One GPU phase per policy given, in order, as (label, policy): ``gpu-binpack``, and
    ``gpu-binpack-2`` for the same policy again (its pods are new ones: each phase's pods stay bound
    to the end of the run)."""
    seen: collections.Counter[str] = collections.Counter()
    phases = []
    for policy in policies:
        seen[policy] += 1
        label = f"gpu-{policy}" if seen[policy] == 1 else f"gpu-{policy}-{seen[policy]}"
        phases.append((label, policy))
    return phases


def offered_rate(created: Mapping[str, float], names: Iterable[str]) -> float:
    """How fast the clients created the phase's pods: 1 / the mean gap between its first and last
    create (0.0 with fewer than two). A bound rate below it means a backlog grew during the phase,
    and then its p99 is mostly that backlog, not the path of one pod."""
    times = [created[n] for n in names if n in created]
    span = max(times) - min(times) if len(times) > 1 else 0.0
    return (len(times) - 1) / span if span > 0 else 0.0


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


EXTENDER_VERBS = ("filter", "bind")


def extender_samples(text: str) -> dict[str, float]:
    """What the bench reads of the vgpu-scheduler's /metrics text, in one pass: per verb its time
    histogram's sum and count over every label set (``filter sum``, ``filter count``), and its calls
    by connection (``filter new``, ``filter kept``). Lines it does not know are skipped."""
    wanted = {
        f"vgpu_scheduler_{verb}_duration_seconds_{part}": f"{verb} {part}"
        for verb in EXTENDER_VERBS
        for part in ("sum", "count")
    }
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("vgpu_scheduler_"):
            continue
        try:  # line by line: a line the parser refuses loses that line only
            samples = [x for family in text_string_to_metric_families(line) for x in family.samples]
        except ValueError:
            continue
        for x in samples:
            if x.name in wanted:
                key = wanted[x.name]
            elif x.name == "vgpu_scheduler_extender_requests_total":
                key = f"{x.labels.get('path', '').lstrip('/')} {x.labels.get('connection', '')}"
            else:
                continue
            out[key] = out.get(key, 0.0) + x.value
    return out


async def extender_figures(service: str, ca_file: pathlib.Path) -> dict[str, float]:
    """``extender_samples`` of the vgpu-scheduler's /metrics on the Service port so far; empty when
    it cannot be read."""
    try:
        trust = ssl.create_default_context(cafile=str(ca_file))
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"https://{service}/metrics", ssl=trust) as resp,
        ):
            return extender_samples(await resp.text())
    except (aiohttp.ClientError, OSError):
        return {}


def served_ms(served: Mapping[str, float]) -> dict[str, float]:
    """Per verb, the vgpu-scheduler's mean answer time over a phase (``served``: ``extender_samples``
    after the phase less before it)."""
    return {
        verb: served[f"{verb} sum"] / served[f"{verb} count"] * 1000
        for verb in EXTENDER_VERBS
        if served.get(f"{verb} count")
    }


def dialled_share(served: Mapping[str, float]) -> dict[str, float]:
    """Per verb, the share of its calls over a phase that came on a new connection (``served`` as
    for ``served_ms``)."""
    out: dict[str, float] = {}
    for verb in EXTENDER_VERBS:
        new, kept = served.get(f"{verb} new", 0.0), served.get(f"{verb} kept", 0.0)
        if new + kept:
            out[verb] = new / (new + kept)
    return out


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


async def events_by_reason(api: aioapi.AioKubeApi, names: Iterable[str]) -> dict[str, int]:
    """The Events about the phase's pods, counted by ``<component> <reason>`` (empty when they
    cannot be listed): which component wrote the events the writes per pod count."""
    wanted = set(names)
    try:
        listed = await api.request("GET", f"/api/v1/namespaces/{NAMESPACE}/events")
    except errors.KubeError:
        return {}
    return event_counts(listed.get("items") or [], wanted)


def event_counts(items: Iterable[Mapping[str, Any]], names: set[str]) -> dict[str, int]:
    """``events_by_reason``'s count over listed Events (``count`` of a deduplicated one included);
    items without the fields are skipped."""
    out: dict[str, int] = {}
    for event in items:
        involved = event.get("involvedObject") or {}
        if not isinstance(involved, Mapping) or involved.get("name") not in names:
            continue
        source = event.get("source") or {}
        who = event.get("reportingComponent") or (
            source.get("component") if isinstance(source, Mapping) else ""
        )
        key = f"{who or '?'} {event.get('reason') or '?'}"
        count = event.get("count")
        out[key] = out.get(key, 0) + (count if isinstance(count, int) and count > 0 else 1)
    return out


LOOP_STEPS_DIR = pathlib.Path(__file__).with_name("loopsteps")  # its sitecustomize.py
LOOP_STEPS_WRITE_S = 0.6


def read_loop_steps(path: pathlib.Path) -> dict[str, Any]:
    """What ``bench/loopsteps/sitecustomize.py`` last wrote ({} before its first write)."""
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return {}


def loop_step_summary(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per kind of loop step, between two readings, the longest first by total time: how many,
    their total (ms), and the bucket bounds (ms) that hold the 99th percentile and the longest
    (``inf``: over the last bound)."""
    bounds = [*after.get("buckets_ms", ()), float("inf")]
    old = before.get("kinds", {})
    rows = []
    for kind, now in after.get("kinds", {}).items():
        was = old.get(kind, {"buckets": [0] * len(bounds), "total_s": 0.0})
        counts = [a - b for a, b in zip(now["buckets"], was["buckets"], strict=True)]
        n = sum(counts)
        if n <= 0:
            continue
        seen, p99 = 0, bounds[-1]
        for bound, c in zip(bounds, counts, strict=True):
            seen += c
            if seen >= 0.99 * n:
                p99 = bound
                break
        longest = max(bound for bound, c in zip(bounds, counts, strict=True) if c)
        total_ms = (now["total_s"] - was["total_s"]) * 1000
        rows.append({"kind": kind, "count": n, "total_ms": total_ms, "p99_ms": p99, "max_ms": longest})
    return sorted(rows, key=lambda r: -r["total_ms"])


def cycle_means(
    before: Mapping[str, tuple[float, float]], after: Mapping[str, tuple[float, float]]
) -> dict[str, tuple[float, int]]:
    """Histogram name (``scheduler_`` and ``_duration_seconds`` cut) -> (mean ms, observations)
    between two ``realk8s.histogram_sums`` readings."""
    out: dict[str, tuple[float, int]] = {}
    for name, (total, count) in after.items():
        old_total, old_count = before.get(name, (0.0, 0.0))
        n = int(count - old_count)
        if n > 0:
            short = name.removeprefix("scheduler_").removesuffix("_duration_seconds")
            out[short] = ((total - old_total) / n * 1000, n)
    return out


# the processes of the control plane itself (kube-scheduler apart): what a pod's writes cost there
CONTROL_PLANE_WRITERS: tuple[str, ...] = ("etcd", "apiserver", "kube-controller-manager")


def cpu_ceilings(cpu_ms: Mapping[str, float], cores: int) -> dict[str, float]:
    """The most pods/s a phase could bind if ``cores`` did nothing but its work, from its CPU ms per
    pod (``cpu_ms``, by process): over every process, over the control plane (etcd, kube-apiserver,
    kube-controller-manager, kube-scheduler) and over the control plane without kube-scheduler (the
    writes alone: a floor no scheduling can go under). Processes the phase did not measure count 0;
    a group with no CPU at all has no ceiling and is left out."""
    groups = {
        "every process": tuple(cpu_ms),
        "control plane": (*CONTROL_PLANE_WRITERS, "kube-scheduler"),
        "its writes alone": CONTROL_PLANE_WRITERS,
    }
    out: dict[str, float] = {}
    for name, members in groups.items():
        ms = sum(cpu_ms.get(who, 0.0) for who in members)
        if ms > 0 and cores > 0:
            out[name] = cores * 1000 / ms
    return out


def _print(result: dict[str, Any]) -> None:
    writes = ", ".join(f"{c} {n:.2f}" for c, n in result["writes"].items())
    print(
        f"{result['label']:<22} {result['bound']}/{result['pods']} bound  {result['rate']:7.1f} pods/s  "
        f"(created at {result['offered']:.1f}/s)  "
        f"p50 {result['p50']:6.2f} s  p99 {result['p99']:6.2f} s  {result['nodes']:4d} nodes"
        + (f"  writes/pod: {writes}" if writes else ""),
        flush=True,
    )
    detail = ", ".join(
        f"{w} {n:.2f}" for w, n in result["detail"].items() if not w.startswith(("bench", "kubelet"))
    )
    print(f"{'':<22} by verb and resource: {detail}", flush=True)
    cpu = ", ".join(f"{who} {ms:.1f}" for who, ms in result["cpu_ms"].items())
    print(f"{'':<22} CPU ms/pod: {cpu}", flush=True)
    if ceilings := cpu_ceilings(result["cpu_ms"], result["cores"]):
        shown = ", ".join(f"{name} {rate:.0f}" for name, rate in ceilings.items())
        print(f"{'':<22} CPU ceiling on {result['cores']} cores, pods/s: {shown}", flush=True)
    if result.get("cores_used"):
        used = ", ".join(f"{who} {n:.2f}" for who, n in result["cores_used"].items())
        print(f"{'':<22} cores in use over the phase: {used}", flush=True)
    if any(result.get("waited_ms", {}).values()):
        waited = ", ".join(f"{who} {ms:.1f}" for who, ms in result["waited_ms"].items())
        print(
            f"{'':<22} waiting for a core, ms/pod: {waited}; "
            f"{result['cores']} core{'' if result['cores'] == 1 else 's'} {result['busy'] * 100:.0f} % busy",
            flush=True,
        )
    if result.get("split_ms"):
        split = ", ".join(f"{part} {p50:.1f}/{p99:.1f}" for part, (p50, p99, _) in result["split_ms"].items())
        covered = min(n for _, _, n in result["split_ms"].values())
        print(
            f"{'':<22} in kube-scheduler, ms p50/p99: {split}"
            + (f" ({covered} of {result['pods']} pods logged)" if covered < result["pods"] else ""),
            flush=True,
        )
    if result.get("dra_split"):
        split = ", ".join(
            f"{part} {p50 * 1000:.0f}/{p99 * 1000:.0f}" for part, (p50, p99, _) in result["dra_split"].items()
        )
        print(f"{'':<22} DRA pod's way, ms p50/p99: {split}", flush=True)
    if result.get("cycle_ms"):
        cycle = ", ".join(f"{name} {ms:.2f} ({n})" for name, (ms, n) in result["cycle_ms"].items())
        print(f"{'':<22} kube-scheduler's own mean (ms, observations): {cycle}", flush=True)
    if result["served_ms"]:
        dialled = result.get("dialled", {})
        served = ", ".join(
            f"/{v} {ms:.2f}" + (f" ({dialled[v] * 100:.0f} % on a new connection)" if v in dialled else "")
            for v, ms in result["served_ms"].items()
        )
        print(f"{'':<22} vgpu-scheduler's mean answer time (ms): {served}", flush=True)
    if result.get("loop_steps"):
        steps = "; ".join(
            f"{r['kind']} {r['count']}, {r['total_ms']:.0f} ms, p99 <= {r['p99_ms']:g}, max <= {r['max_ms']:g}"
            for r in result["loop_steps"][:5]
        )
        print(
            f"{'':<22} vgpu-scheduler's loop steps >= 0.2 ms (count, total, bounds in ms): {steps}",
            flush=True,
        )
    if result.get("events"):
        events = ", ".join(f"{what} {n:.2f}" for what, n in result["events"].items())
        print(f"{'':<22} events per pod: {events}", flush=True)
    timeline = result["timeline"]  # (created at, latency), in creation order
    size = max(1, len(timeline) // 10)
    by_tenth = " ".join(
        f"{max(lat for _, lat in timeline[i : i + size]):.2f}" for i in range(0, len(timeline), size)
    )
    print(f"{'':<22} worst latency per tenth of the pods, in creation order (s): {by_tenth}", flush=True)


async def register_node(api: aioapi.AioKubeApi, node: dict[str, Any]) -> None:
    """Create ``node`` as kubelet registers it (status written after), untainted as the node
    lifecycle controller leaves a Ready node: a real API server's TaintNodesByCondition admission
    taints a new node not-ready, and no controller manager runs here to lift it."""
    name = node["metadata"]["name"]
    created = await api.create("nodes", node)
    if (created.get("spec") or {}).get("taints"):
        await api.merge_patch("nodes", name, {"spec": {"taints": None}})
    await api.merge_patch_status("nodes", name, {"status": node["status"]})


async def setup_nodes(
    api: aioapi.AioKubeApi, names: list[str], *, devices: dict[str, str], parallel: int = 64
) -> None:
    """Ready Nodes as kubelet registers them, with the device plugin's resource advertised, and
    untainted as the node lifecycle controller leaves a Ready node."""
    gate = asyncio.Semaphore(parallel)
    spec = {"allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110", **devices}}

    async def one(name: str) -> None:
        node = cluster.node_object(description.NodeSpec(name=name, allocatable=spec["allocatable"]))
        async with gate:
            await register_node(api, node)

    await asyncio.gather(*(one(n) for n in names))


def watches_read(log: pathlib.Path) -> str:
    """Where the vgpu-scheduler's start-up line says it reads its watches ("by the helper" or
    "here"; "?" when the line is not there)."""
    found = re.search(r"watches read (by the helper|here) \(", log.read_text(errors="replace"))
    return found.group(1) if found else "?"


@dataclasses.dataclass
class Outcome:
    """Every phase's figures, and what the watcher and the node side found wrong."""

    results: list[dict[str, Any]]
    violations: list[str]
    failures: list[str]
    checks: int
    # the niceness the vgpu-scheduler and its writes helper ran at, read from the processes
    niceness: dict[str, int] = dataclasses.field(default_factory=dict)
    # where the vgpu-scheduler said it reads its watch streams: "by the helper" or "here"
    watches: str = ""

    @property
    def ok(self) -> bool:
        return (
            not self.violations and not self.failures and all(r["bound"] == r["pods"] for r in self.results)
        )


async def main_async(opts: argparse.Namespace) -> int:
    task = asyncio.current_task()
    assert task is not None
    for sig in (signal.SIGTERM, signal.SIGINT):  # unwind (stop the child processes), never die midway
        asyncio.get_running_loop().add_signal_handler(sig, task.cancel)
    outcomes: list[Outcome] = []
    try:
        for n in range(opts.repeat):
            if opts.repeat > 1:
                print(f"--- run {n + 1} of {opts.repeat}")
            outcomes.append(await run(opts))
    except asyncio.CancelledError:
        print("interrupted; the child processes were stopped", file=sys.stderr)
        return 130
    if len(outcomes) > 1:
        for line in summary(outcomes):
            print(line)
    return 0 if all(o.ok for o in outcomes) else 1


def vs_plain(plain: Mapping[str, Any], phase: Mapping[str, Any]) -> tuple[float, float]:
    """A phase's rate as % of the plain phase's, and its p99 as a multiple of plain's (0 without plain)."""
    percent = phase["rate"] / plain["rate"] * 100 if plain["rate"] else 0.0
    return percent, phase["p99"] / plain["p99"] if plain["p99"] else 0.0


def summary(outcomes: list[Outcome]) -> list[str]:
    """Median and range over the runs of each GPU phase's rate (% of plain) and p99 (÷ plain's),
    with how busy the cores were (where they are full, the p99 is the queue in front of
    kube-scheduler's serial cycle): one run's ratio moves by about ±1x with the machine's noise
    (docs/benchmarks.md). First, the
    plain phase's CPU per pod over all processes: how fast the machine was (on a shared VM it moves
    by half within an hour, and the GPU phases, which fill the cores, move more)."""
    lines = [f"over {len(outcomes)} runs (median, range):"]
    cpu = [sum(o.results[0].get("cpu_ms", {}).values()) for o in outcomes]
    if all(cpu):
        lines.append(
            f"plain phase's CPU per pod, all processes (the machine's speed): {statistics.median(cpu):.1f} ms"
            f" ({min(cpu):.1f}-{max(cpu):.1f}); compare summaries only at similar figures"
        )
    labels = [r["label"] for r in outcomes[0].results[1:]]
    for index, label in enumerate(labels, start=1):
        percent, p99 = [], []
        for o in outcomes:
            got_percent, got_p99 = vs_plain(o.results[0], o.results[index])
            percent.append(got_percent)
            p99.append(got_p99)
        busy = [o.results[index].get("busy", 0.0) * 100 for o in outcomes]
        lines.append(
            f"{label}: {statistics.median(percent):.0f} % of the plain rate ({min(percent):.0f}-{max(percent):.0f}),"
            f" p99 {statistics.median(p99):.1f}x plain ({min(p99):.1f}-{max(p99):.1f})"
            + (
                f", cores {statistics.median(busy):.0f} % busy ({min(busy):.0f}-{max(busy):.0f})"
                if all(busy)
                else ""
            )
        )
    return lines


async def run(opts: argparse.Namespace) -> Outcome:
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="vgpu-tput-", dir="/tmp"))
    host_root = nodes_host_root(workdir)
    # HAMi-core's files, as the chart's installer puts them on a node (Allocate refuses without them)
    hamicore.install_stand_in(host_root, hook_path=configs.DevicePluginConfig().hook_path)
    logs = workdir / "logs"
    logs.mkdir()
    # the bench reads the scheduler's /metrics without a token, as the demo does (scheduler.viewsAuth)
    config_raw: dict[str, Any] = {"scheduler": {"viewsAuth": "none"}}
    if opts.api_workers:
        config_raw["scheduler"]["apiWorkers"] = opts.api_workers
    if opts.label_assigned_pods:
        config_raw["scheduler"]["labelAssignedPods"] = True
    locks = opts.node_locks or [opts.node_lock]
    if locks[0]:
        config_raw["scheduler"]["nodeLock"] = locks[0]
    if opts.api_client:
        config_raw["scheduler"]["apiClient"] = opts.api_client
    if opts.api_writer:
        config_raw["scheduler"]["apiWriter"] = opts.api_writer
    if opts.api_watches:
        config_raw["scheduler"]["apiWatches"] = opts.api_watches
    if opts.webhooks == "chart":
        config_raw["webhook"] = {"trustedGroups": ["system:masters"]}  # the chart's guard.extraGroups
    config = configs.load(config_raw)
    (workdir / "vgpu.yaml").write_text(yaml.safe_dump(config_raw))
    names = node_names(opts.nodes)
    gpus = {  # the nodes this process stands in for: all of them, or none with --node-procs
        n: fake_gpus(n, count=opts.gpus_per_node, memory_mib=opts.gpu_memory_mib, slots=opts.slots)
        for n in (names if opts.node_procs == 0 else ())
    }
    results: list[dict[str, Any]] = []
    niceness: dict[str, int] = {}
    watches = ""
    started = time.monotonic()
    print(
        f"throughput: {opts.nodes} nodes x {opts.gpus_per_node} GPUs ({opts.gpu_memory_mib} MiB, {opts.slots} slots), "
        f"{opts.pods} pods per phase, {CLIENTS} clients, "
        + (
            f"real etcd, kube-apiserver and kube-scheduler from {opts.k8s_bin}, "
            if opts.k8s_bin
            else f"write latency {opts.write_latency_ms:g} ms, "
        )
        + f"admission delay {opts.admission_delay_s:g} s, start delay {opts.start_delay_s:g} s, "
        f"{opts.plugin_search} device plugin's pod search, "
        f"create rate {f'{opts.create_rate:g} pods/s' if opts.create_rate else 'unpaced'}; logs in {logs}"
        + (f", nodes' host files in {host_root}" if opts.keep else ""),
        flush=True,
    )
    try:
        async with contextlib.AsyncExitStack() as stack:
            plane = await stack.enter_async_context(control_plane(opts, workdir))
            kubeconfig_path = kubeconfig.write_kubeconfig(
                workdir / "kubeconfig",
                server=plane.url,
                token=plane.token,
                ca_pem=plane.ca_file.read_bytes() if plane.ca_file else None,
            )
            ca_file = str(plane.ca_file) if plane.ca_file else None
            api = await stack.enter_async_context(
                aioapi.AioKubeApi(plane.url, user_agent="bench/1", token=plane.token, ca_file=ca_file)
            )
            await setup_nodes(
                api, names, devices={config.resources.count: str(opts.gpus_per_node * opts.slots)}
            )
            tracker = Tracker()
            claims = throughput_dra.ClaimTracker(capacity_mib=opts.gpu_memory_mib)
            dra_bodies: list[dict[str, Any]] = []
            if opts.dra:
                # the extender phases' GPU pod (as a user writes it), converted by the webhook's code
                user_pod = gpu_pod("dra", config=config, policy="binpack", webhook=True)
                templates: dict[str, dict[str, Any]] = {}
                for i in range(opts.pods):
                    body, made = throughput_dra.dra_pod(f"dra-{i}", gpu_pod=user_pod, config=config)
                    dra_bodies.append(body)
                    templates.update((t["metadata"]["name"], t) for t in made)
                await throughput_dra.publish(
                    api,
                    names,
                    gpus=opts.gpus_per_node,
                    memory_mib=opts.gpu_memory_mib,
                    templates=templates.values(),
                )
                watching = asyncio.create_task(
                    throughput_dra.watch_claims(
                        plane.url, token=plane.token or "", ca_file=plane.ca_file, on_event=claims.on_event
                    )
                    if plane.ca_file
                    else asyncio.sleep(0)
                )
                stack.push_async_callback(_cancel, watching)
                dra_pid = await stack.enter_async_context(
                    throughput_dra.kube_controller_manager(
                        opts.k8s_bin,
                        kubeconfig_path=kubeconfig_path,
                        log_path=logs / "kube-controller-manager.log",
                    )
                )
            side = NodeSide(
                plane.url,
                on_pod=tracker.on_pod,
                config=config,
                gpus=gpus,
                admission_delay_s=opts.admission_delay_s,
                host_root=host_root,
                start_delay_s=opts.start_delay_s,
                plugin_search=opts.plugin_search,
                token=plane.token,
                ca_file=ca_file,
            )
            stack.push_async_callback(side.stop)
            await side.register()
            await side.start()
            shards = None
            if opts.node_procs:
                args = shard_args(
                    opts,
                    url=plane.url,
                    ca_file=ca_file,
                    config_file=workdir / "vgpu.yaml",
                    host_root=host_root,
                )
                shards = Shards(opts.node_procs, args, token=plane.token, log_dir=logs)
                # LIFO: this runs once the shards have exited and reported
                stack.callback(side.failures.extend, shards.failures)
                await stack.enter_async_context(shards)
            tls = certs.make_serving_certs(workdir / "certs", now=datetime.datetime.now(datetime.UTC))
            steps_file = workdir / "loop-steps.json" if opts.loop_steps else None
            vgpu_scheduler = VgpuSchedulerProcess(
                workdir, kubeconfig_path, tls, nice=opts.scheduler_nice, loop_steps=steps_file
            )
            address = await stack.enter_async_context(vgpu_scheduler)
            if opts.webhooks == "chart":
                ca_pem = tls.ca_file.read_bytes()
                await register_webhooks(api, f"https://{vgpu_scheduler.service}/webhook", ca_pem, config)
            scheduling = await stack.enter_async_context(
                kube_scheduler(
                    opts,
                    workdir,
                    extender_url=f"http://{address}",
                    config=config,
                    plane=plane,
                    kubeconfig_path=kubeconfig_path,
                )
            )
            pids: dict[str, int | None] = {
                **plane.pids,
                "kube-scheduler": scheduling.pid,
                "vgpu-scheduler": vgpu_scheduler.pid,
            }
            if opts.dra:
                pids["kube-controller-manager"] = dra_pid
            # its writes helper (apiWriter auto, the default, or process; started before it listens)
            for writer in children(vgpu_scheduler.pid)[:1]:
                pids["api-writer"] = writer
            for who in ("vgpu-scheduler", "api-writer"):
                if pids.get(who):
                    niceness[who] = os.getpriority(os.PRIO_PROCESS, pids[who] or 0)
            if any(niceness.values()):
                print(f"niceness: {', '.join(f'{who} {n}' for who, n in niceness.items())}", flush=True)
            watches = watches_read(logs / "vgpu-scheduler.log")
            if shards is None:
                pids["bench+nodes"] = None
            else:
                pids["bench"] = None
                pids.update({f"nodes-{i}": proc.pid for i, proc in enumerate(shards.procs)})
            phases: list[tuple[str, list[dict[str, Any]], str | None]] = [
                ("plain", [plain_pod(f"plain-{i}") for i in range(opts.pods)], None)
            ]
            for lock in locks:
                for base, policy in phase_labels(opts.policies):
                    label = f"{base}-{lock}" if len(locks) > 1 else base
                    bodies = [
                        gpu_pod(
                            f"{label}-{i}", config=config, policy=policy, webhook=opts.webhooks == "chart"
                        )
                        for i in range(opts.pods)
                    ]
                    phases.append((label, bodies, lock))
            if opts.dra:
                phases.append(("dra", dra_bodies, None))
            lock_now = locks[0]
            for label, bodies, lock in phases:
                if lock and lock != lock_now:  # the vgpu-scheduler again, with this node lock mode
                    config_raw["scheduler"]["nodeLock"] = lock_now = lock
                    (workdir / "vgpu.yaml").write_text(yaml.safe_dump(config_raw))
                    await vgpu_scheduler.kill()
                    await vgpu_scheduler.restart()
                    pids["vgpu-scheduler"] = vgpu_scheduler.pid
                    pids.pop("api-writer", None)
                    for writer in children(vgpu_scheduler.pid)[:1]:
                        pids["api-writer"] = writer
                    print(f"vgpu-scheduler restarted with nodeLock: {lock}", flush=True)
                result = await run_phase(
                    label,
                    bodies,
                    api=api,
                    tracker=tracker,
                    timeout_s=opts.timeout_s,
                    pids=pids,
                    create_rate=opts.create_rate,
                    scheduler_metrics=(vgpu_scheduler.service, tls.ca_file),
                    scheduler_log=None if opts.k8s_bin else logs / "kube-scheduler.log",
                    server_counts=plane.server_counts,
                    scheduler_cycle=scheduling.cycle,
                    settle_s=SETTLE_TIMEOUT_S + opts.admission_delay_s + opts.start_delay_s,
                    loop_steps=steps_file,
                )
                if label == "dra":
                    result["dra_split"] = throughput_dra.dra_split(
                        [b["metadata"]["name"] for b in bodies],
                        created=tracker.created,
                        bound=tracker.bound,
                        claims=claims,
                    )
                results.append(result)
                _print(result)
    finally:
        if not opts.keep:
            shutil.rmtree(workdir, ignore_errors=True)
            shutil.rmtree(host_root, ignore_errors=True)  # on tmpfs: not under workdir
    for r in results[1:]:
        percent, p99 = vs_plain(results[0], r)
        print(f"{r['label']}: {percent:.0f} % of the plain rate, p99 {p99:.1f}x plain")
    violations = side.watcher.violations + claims.violations
    print(
        f"overcommit={len(violations)} ({side.watcher.checks} GPU checks"
        + (f", {claims.checks} DRA claim shares" if opts.dra else "")
        + f"); allocate failures={len(side.failures)}; run {time.monotonic() - started:.0f} s"
    )
    for line in (violations + side.failures)[:10]:
        print("  " + line)
    return Outcome(results, list(violations), list(side.failures), side.watcher.checks, niceness, watches)


async def _cancel(task: asyncio.Task[Any]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


@dataclasses.dataclass(frozen=True)
class Plane:
    """The API server the phases run against: the emulation's, or a real one (``--k8s-bin``)."""

    url: str
    token: str | None
    ca_file: pathlib.Path | None
    pids: dict[str, int | None]  # its processes, for the CPU per pod
    # a real one's request counters; None: the emulation's /debug/requests (writes by client)
    server_counts: Callable[[], Awaitable[dict[str, float]]] | None = None


@contextlib.asynccontextmanager
async def control_plane(opts: argparse.Namespace, workdir: pathlib.Path) -> AsyncIterator[Plane]:
    if opts.k8s_bin:
        async with realk8s.control_plane(
            opts.k8s_bin, workdir, now=datetime.datetime.now(datetime.UTC)
        ) as real:

            async def counts() -> dict[str, float]:
                return realk8s.request_counts(await realk8s.scrape(real))

            yield Plane(real.url, real.token, real.ca_file, dict(real.pids), server_counts=counts)
        return
    async with LocalProcess.apiserver(
        write_latency_ms=opts.write_latency_ms, log_path=workdir / "logs" / "apiserver.log"
    ) as server:
        pid = server.proc.pid if server.proc else 0
        yield Plane(server.ready, None, None, {"apiserver": pid})


@dataclasses.dataclass(frozen=True)
class Scheduling:
    """The kube-scheduler a run uses: its pid, and for the real one its own cycle histograms
    (``realk8s.histogram_sums``); the emulation's cycle is read from its log instead."""

    pid: int
    cycle: Callable[[], Awaitable[dict[str, tuple[float, float]]]] | None


@contextlib.asynccontextmanager
async def kube_scheduler(
    opts: argparse.Namespace,
    workdir: pathlib.Path,
    *,
    extender_url: str,
    config: configs.Config,
    plane: Plane,
    kubeconfig_path: pathlib.Path,
) -> AsyncIterator[Scheduling]:
    """kube-scheduler (the emulation, or the real one of ``--k8s-bin``) with our extender."""
    sched_config = workdir / "kube-scheduler.yaml"
    log_path = workdir / "logs" / "kube-scheduler.log"
    percentage = opts.percentage_of_nodes_to_score
    if opts.k8s_bin:
        minor = await realk8s.kube_scheduler_minor(opts.k8s_bin)
        api_version = realk8s.scheduler_config_api(minor)
        rendered = kube_scheduler_config(
            extender_url,
            config,
            percentage=percentage,
            api_version=api_version,
            kubeconfig_path=kubeconfig_path,
        )
        rendered.update(realk8s.no_insecure_serving(api_version))
        sched_config.write_text(yaml.safe_dump(rendered))
        async with realk8s.kube_scheduler(
            opts.k8s_bin,
            config=sched_config,
            kubeconfig_path=kubeconfig_path,
            log_path=log_path,
            feature_gates=opts.scheduler_feature_gates,
        ) as real:
            token = plane.token or ""

            async def cycle() -> dict[str, tuple[float, float]]:
                return realk8s.histogram_sums(await real.metrics(token))

            yield Scheduling(real.proc.pid, cycle)
        return
    sched_config.write_text(
        yaml.safe_dump(kube_scheduler_config(extender_url, config, percentage=percentage))
    )
    extra = ["-v"] + (["--cprofile", opts.cprofile] if opts.cprofile else [])
    async with LocalProcess.kube_scheduler(
        server=plane.url, config=sched_config, extra=extra, log_path=log_path
    ) as emulated:
        yield Scheduling(emulated.proc.pid if emulated.proc else 0, None)


WEBHOOK_READY_S = 60.0  # kube-apiserver's informer picks up a new webhook configuration


async def register_webhooks(
    api: aioapi.AioKubeApi, url: str, ca_pem: bytes, config: configs.Config, *, guard: bool = True
) -> None:
    """The chart's mutating webhook at ``url``, and with ``guard`` its update guard (before 1.28);
    returns once the API server calls the mutating one (a dry-run create of a GPU pod comes back
    with our schedulerName: kube-apiserver's informer picks a new configuration up in a moment)."""
    base = "/apis/admissionregistration.k8s.io/v1"
    keys = hami.Keys(config.annotation_prefix)
    await api.request(
        "POST",
        f"{base}/mutatingwebhookconfigurations",
        body=webhookconfig.webhook_configuration(url, ca_pem, keys),
    )
    if guard:
        body = webhookconfig.guard_configuration(url, ca_pem, release_namespace="kube-vgpu")
        await api.request("POST", f"{base}/validatingwebhookconfigurations", body=body)
    probe = gpu_pod("webhook-probe", config=config, policy="binpack", webhook=True)
    deadline = time.monotonic() + WEBHOOK_READY_S
    while True:
        got = await api.request(
            "POST", f"/api/v1/namespaces/{NAMESPACE}/pods", body=probe, query={"dryRun": "All"}
        )
        if got["spec"].get("schedulerName") == config.scheduler.scheduler_name:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the API server never called the webhook at {url}")
        await asyncio.sleep(0.2)  # its informer's resync: nothing to wait on from here


class VgpuSchedulerProcess:
    """The real ``vgpu-scheduler`` as a subprocess over HTTPS; yields its address."""

    def __init__(
        self,
        workdir: pathlib.Path,
        kubeconfig_path: pathlib.Path,
        tls: certs.ServingCerts,
        *,
        nice: int = 0,
        loop_steps: pathlib.Path | None = None,
    ) -> None:
        """``nice``: run it (and so its writes helper, which inherits it) at that niceness, the
        bench's stand-in for the CPU share a pod's CPU request gives its container. ``loop_steps``:
        load ``bench/loopsteps/sitecustomize.py`` into it, writing its loop's steps there."""
        self._workdir, self._kubeconfig, self._tls = workdir, kubeconfig_path, tls
        self._nice = nice
        self._env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        if loop_steps is not None:
            path = os.pathsep.join(p for p in (str(LOOP_STEPS_DIR), os.environ.get("PYTHONPATH")) if p)
            self._env |= {"PYTHONPATH": path, "VGPU_BENCH_LOOP_STEPS": str(loop_steps)}
        self._proc: asyncio.subprocess.Process | None = None

    service = ""  # host:port of the Service port, once started
    extender = ""  # host:port of the loopback extender listener

    @property
    def pid(self) -> int:
        return self._proc.pid if self._proc else 0

    async def __aenter__(self) -> str:
        await self._start(port=0, extender_port=0)
        return self.extender

    async def _start(self, *, port: int, extender_port: int, append: bool = False) -> None:
        ready = self._workdir / "scheduler.addr"
        ready.unlink(missing_ok=True)
        with (self._workdir / "logs" / "vgpu-scheduler.log").open("ab" if append else "wb") as out:
            niced = ["nice", "-n", str(self._nice)] if self._nice else []  # nice execs: the same pid
            self._proc = await asyncio.create_subprocess_exec(
                *niced, sys.executable, "-m", "vgpu_scheduler.main",
                "--kubeconfig", str(self._kubeconfig), "--config", str(self._workdir / "vgpu.yaml"),
                "--host", "127.0.0.1", "--port", str(port), "--extender-port", str(extender_port),
                "--tls-cert-file", str(self._tls.cert_file), "--tls-key-file", str(self._tls.key_file),
                "--ready-file", str(ready),
                stdout=out, stderr=asyncio.subprocess.STDOUT, stdin=asyncio.subprocess.DEVNULL,
                env=self._env,
            )  # fmt: skip
        deadline = time.monotonic() + 60
        while not (ready.exists() and len(ready.read_text().split()) >= 2):
            if self._proc.returncode is not None or time.monotonic() > deadline:
                await self.__aexit__()
                raise RuntimeError(f"vgpu-scheduler did not start; see {self._workdir / 'logs'}")
            await asyncio.sleep(0.05)
        # the Service port (HTTPS: webhook, /metrics), then the loopback extender listener
        self.service, self.extender = ready.read_text().split()[:2]

    async def kill(self) -> None:
        """SIGKILL it: no clean-up of any kind (a crash, an OOM kill)."""
        if self._proc is not None and self._proc.returncode is None:
            self._proc.kill()
            await self._proc.wait()

    async def restart(self) -> None:
        """Start it again on the same two ports (kube-scheduler and the webhook point at them)."""
        port, extender_port = (int(a.rpartition(":")[2]) for a in (self.service, self.extender))
        await self._start(port=port, extender_port=extender_port, append=True)

    async def __aexit__(self, *exc: object) -> None:
        if self._proc is not None:
            await realk8s.stop_process(self._proc)


SHM = pathlib.Path("/dev/shm")


def nodes_host_root(workdir: pathlib.Path) -> pathlib.Path:
    """Where the emulated nodes' host directories go (the device plugin's per-container HAMi-core
    cache dir, made in every Allocate): on tmpfs where there is one. A new directory on this VM's
    ext4 costs 0.4 ms of CPU (7 us on tmpfs), which 1,000 real nodes would spend on their own
    machines, not on the control plane's two cores (docs/benchmarks.md)."""
    if SHM.is_dir() and os.access(SHM, os.W_OK):
        return pathlib.Path(tempfile.mkdtemp(prefix="vgpu-tput-host-", dir=SHM))
    return workdir / "host"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=1000, help="pods per phase")
    parser.add_argument(
        "--policies",
        nargs="*",
        default=["binpack", "spread"],
        choices=["binpack", "spread"],
        help="a GPU phase per policy, in order; one given again is another phase (gpu-binpack-2), "
        "its pods added to those still bound: whether the rate holds as the cluster fills",
    )
    parser.add_argument(
        "--admission-delay-s", type=float, default=0.0, help="kubelet's delay before Allocate"
    )
    parser.add_argument(
        "--start-delay-s",
        type=float,
        default=0.0,
        help="from Allocate to Running (the containers starting: an image pull)",
    )
    parser.add_argument(
        "--plugin-search",
        choices=["kube-vgpu", "hami"],
        default="kube-vgpu",
        help="how each node's Allocate finds its pod: our device plugin's way or HAMi's",
    )
    parser.add_argument("--write-latency-ms", type=float, default=20.0, help="API server delay per write")
    parser.add_argument(
        "--percentage-of-nodes-to-score", type=int, default=0, help="0: kube-scheduler's adaptive"
    )
    parser.add_argument(
        "--scheduler-feature-gates",
        default="",
        help="the real kube-scheduler's --feature-gates (e.g. NominatedNodeNameForExpectation=false: "
        "no nominatedNodeName write before a DRA pod's PreBind)",
    )
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--gpu-memory-mib", type=int, default=40960)
    parser.add_argument("--slots", type=int, default=10)
    parser.add_argument("--timeout-s", type=float, default=600.0, help="per phase")
    parser.add_argument(
        "--create-rate",
        type=float,
        default=0.0,
        help="pods created per second (paced, open loop); 0: as fast as the 8 clients can",
    )
    parser.add_argument(
        "--api-workers", type=int, default=0, help="the scheduler's scheduler.apiWorkers (0: its default)"
    )
    parser.add_argument(
        "--node-lock", choices=["always", "contended"], help="the scheduler's scheduler.nodeLock"
    )
    parser.add_argument(
        "--node-locks",
        nargs="+",
        choices=["always", "contended"],
        help="the GPU phases once per lock mode, in this order, in one run (overrides --node-lock)",
    )
    parser.add_argument(
        "--dra",
        action="store_true",
        help="a last phase of DRA GPU pods: ResourceSlices, kube-controller-manager's resourceclaim "
        "controller, kube-scheduler's DRA plugin (needs --k8s-bin with v1.34+ binaries)",
    )
    parser.add_argument(
        "--webhooks",
        choices=["none", "chart"],
        default="none",
        help="chart: the mutating webhook and the update guard as the chart installs them before 1.28",
    )
    parser.add_argument(
        "--api-client", choices=["asyncio", "threads"], help="the scheduler's scheduler.apiClient"
    )
    parser.add_argument(
        "--api-writer", choices=["inline", "process"], help="the scheduler's scheduler.apiWriter"
    )
    parser.add_argument(
        "--api-watches", choices=["inline", "process"], help="the scheduler's scheduler.apiWatches"
    )
    parser.add_argument(
        "--loop-steps",
        action="store_true",
        help="count the vgpu-scheduler's event-loop steps of 0.2 ms or more (its loop thread's CPU "
        "per callback, by kind: what a /filter arriving meanwhile waits for) and print the longest "
        "kinds per phase (bench/loopsteps/sitecustomize.py, loaded into it)",
    )
    parser.add_argument(
        "--label-assigned-pods",
        action="store_true",
        help="scheduler.labelAssignedPods: true (one more write)",
    )
    parser.add_argument(
        "--node-procs",
        type=int,
        default=0,
        help="stand in for the nodes from N processes of their own (a shard each, its own pods watch); "
        "0: from this one",
    )
    parser.add_argument(
        "--scheduler-nice",
        type=int,
        default=0,
        help="run the vgpu-scheduler and its writes helper at this niceness (below 0 needs root): "
        "the CPU share a CPU request gives its container where the cores are contended",
    )
    parser.add_argument("--cprofile", help="profile the kube-scheduler emulation into this file")
    parser.add_argument(
        "--k8s-bin",
        type=pathlib.Path,
        help="run against a real etcd, kube-apiserver and kube-scheduler from this directory "
        "(scripts/build-kubernetes.sh) instead of the emulation; --write-latency-ms does not apply",
    )
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    parser.add_argument(
        "--repeat", type=int, default=1, help="whole runs (fresh processes each); >1 adds a median summary"
    )
    parser.add_argument("--quick", action="store_true", help="100 nodes, 100 pods per phase")
    opts = parser.parse_args(argv)
    if opts.repeat < 1:
        parser.error("--repeat must be at least 1")
    if opts.node_procs < 0:
        parser.error("--node-procs must not be negative")
    if opts.dra and not opts.k8s_bin:
        parser.error("--dra needs --k8s-bin (the emulation has no kube-controller-manager)")
    if opts.quick:
        opts.nodes, opts.pods = min(opts.nodes, 100), min(opts.pods, 100)
    return opts


def main() -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    freezer = SurvivorFreezer()  # this process is the 1,000 nodes' kubelets: no 100 ms GC stalls
    freezer.install()
    return asyncio.run(gcfreeze.run_within(main_async(parse_args()), freezer))


if __name__ == "__main__":
    sys.exit(main())
