"""The throughput bench's figures, read from what its processes write (``throughput_phase.run_phase``).

Each reader is a pure function of the text or the readings it is given (skipping what it does not
know), with a thin async reader beside it where the figures come from a process: kube-scheduler
emulation's log line per bound pod (``scheduling_split``), the vgpu-scheduler's /metrics
(``extender_samples``: its answer time per verb and its calls by connection), the Events about a
phase's pods (``event_counts``), the counts ``bench/loopsteps/sitecustomize.py`` writes
(``loop_step_summary``), a real kube-scheduler's own histograms (``cycle_means``), and the rate the
clients created the pods at (``offered_rate``).
"""

from __future__ import annotations

import asyncio
import json
import pathlib
import re
import ssl
import time
from collections.abc import Iterable, Mapping
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families
from vgpu.core import errors
from vgpu.kube import aioapi

from bench.throughput_pods import NAMESPACE

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


def offered_rate(created: Mapping[str, float], names: Iterable[str]) -> float:
    """How fast the clients created the phase's pods: 1 / the mean gap between its first and last
    create (0.0 with fewer than two). A bound rate below it means a backlog grew during the phase,
    and then its p99 is mostly that backlog, not the path of one pod."""
    times = [created[n] for n in names if n in created]
    span = max(times) - min(times) if len(times) > 1 else 0.0
    return (len(times) - 1) / span if span > 0 else 0.0


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
