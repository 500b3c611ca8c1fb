"""Long-lived objects kept out of CPython's cyclic garbage collector, so a full collection stays short.

CPython's cyclic collector stops the process while it scans. A young collection (generations 0
and 1) scans what was allocated since the last one; a full one (generation 2) scans every tracked
object that is not frozen. The scheduler's state holds each pod's object, so a full collection
grows with the cluster: with 40,000 pods added after start-up, 9 full collections stalled the
scheduler for up to 500 ms each (``bench/gc_bench.py``), and a stalled scheduler holds up
kube-scheduler's serial cycle, so the whole cluster waits. ``gc.freeze`` at start-up covers only
what was there at start-up.

``SurvivorFreezer.install`` freezes what exists, then freezes again after every collection of
generation 1 or 2: an object that has survived a young collection is taken for long-lived and no
collection scans it again. Reference counting still frees a frozen object when its last reference
goes (a deleted pod's objects go at once), so only a reference *cycle* that became garbage after it
was frozen is kept. ``compact`` (unfreeze, one full collection, freeze) gives those back; it costs
one full pause. ``uninstall`` hands everything back to the collector.

What may be kept back is bounded, not left to quiet moments (``Bounds``, ``SurvivorFreezer.due``):
the caller compacts at a quiet moment once the frozen objects grew by a quarter, and, quiet or not,
once the process's resident memory grew by ``memory_slack_bytes`` (or ``memory_slack_ratio`` of
it, whichever is larger) since the last compaction, or once ``overdue_s`` passed. The count of
frozen objects is no measure of what they hold (one frozen ``bytearray`` can be 256 KiB), so the
memory bound reads the resident set (``rss_bytes``: ``/proc/self/statm``, two system calls) and
is checked often; counting the frozen objects walks them all and is checked seldom. A process
whose memory grows for good (a cluster filling up) pays one full pause per growth step, as CPython
itself would (its full collections run once the long-lived objects grew by a quarter).

The emulated control plane (``vgpu.localcluster.serve``) and the benchmarks install it too: the Go
API server and kube-scheduler they stand for have no stop-the-world pauses of this size. The
control plane, which has no quiet moments to tell, holds it to the memory and time bounds alone
(``keep_within``).
"""

from __future__ import annotations

import asyncio
import gc
import os
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

T = TypeVar("T")

Reason = Literal["idle", "memory", "overdue"]  # why a compaction was due


def rss_bytes() -> int | None:
    """This process's resident set in bytes (Linux: ``/proc/self/statm``); None where unreadable."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            resident_pages = int(statm.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return resident_pages * os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class Bounds:
    """When frozen garbage must be given back (see the module docstring)."""

    idle_growth: float = 1.25  # quiet, and the frozen objects grew by this factor since the last compaction
    # quiet or not, once the resident set grew by this much (above the 77 MiB that 256 TLS handshakes
    # in flight take, so a burst of connections alone is no reason for a pause)
    memory_slack_bytes: int = 128 << 20
    memory_slack_ratio: float = 0.25  # ... or by this share of what it was, whichever is larger
    overdue_s: float = 6 * 3600.0  # quiet or not, once this long has passed


def due(
    bounds: Bounds,
    *,
    idle: bool | None,
    frozen: int | None,
    frozen_after: int,
    rss: int | None,
    rss_after: int | None,
    since_s: float,
) -> Reason | None:
    """Why a compaction is due, or None. ``idle``/``frozen`` None: not known at this check (the
    cheap one: memory and time only); ``rss``/``rss_after`` None: the resident set is unknown;
    ``*_after``: as it was after the last compaction; ``since_s``: time since it."""
    slack = (
        None if rss_after is None else max(bounds.memory_slack_bytes, bounds.memory_slack_ratio * rss_after)
    )
    if rss is not None and rss_after is not None and slack is not None and rss - rss_after > slack:
        return "memory"
    if since_s >= bounds.overdue_s:
        return "overdue"
    if idle and frozen is not None and frozen >= frozen_after * bounds.idle_growth:
        return "idle"
    return None


@dataclass(frozen=True)
class Compaction:
    """What one ``compact`` did: cyclic garbage found, its pause, objects frozen before and after."""

    collected: int
    seconds: float
    frozen_before: int
    frozen_after: int
    rss_before: int | None = None  # the resident set in bytes (None: unknown)
    rss_after: int | None = None


class SurvivorFreezer:
    """Freezes the survivors of every young collection; see the module docstring."""

    def __init__(self, *, rss: Callable[[], int | None] = rss_bytes) -> None:
        self._rss = rss
        self.rss_after_compaction: int | None = None  # the resident set after install or the last compact
        self.freezes = 0  # collections after which the survivors were frozen
        self.compactions = 0
        self.frozen_after_compaction = 0  # gc.get_freeze_count() after install or the last compact
        self.counted = 0  # frozen objects at the last count (``frozen``, ``install``, ``compact``)
        self.compacted_at = 0.0  # time.monotonic() at install or the last compact
        self._installed = False

    @property
    def installed(self) -> bool:
        return self._installed

    def frozen(self) -> int:
        """Count the objects frozen now (the process's; frozen objects freed since are not in it)
        into ``counted``. CPython walks the whole list for it, holding the GIL: 6.6 ms for a
        million objects, so call it seldom and read ``counted`` in between."""
        self.counted = gc.get_freeze_count()
        return self.counted

    def install(self) -> None:
        """Collect, freeze what is left, and freeze the survivors of every later young collection."""
        if self._installed:
            return
        gc.collect()
        gc.freeze()
        self.frozen_after_compaction = self.frozen()
        self.compacted_at = time.monotonic()
        self.rss_after_compaction = self._rss()
        gc.callbacks.append(self._after_collection)
        self._installed = True

    def uninstall(self) -> None:
        """Stop freezing and hand every frozen object back to the collector."""
        if not self._installed:
            return
        self._installed = False
        gc.callbacks.remove(self._after_collection)
        gc.unfreeze()

    def compact(self) -> Compaction:
        """Unfreeze, run one full collection (the cycles that became garbage while frozen go), then
        freeze what is left. A full pause over every tracked object: call it when little waits."""
        before = self.frozen()
        rss_before = self._rss()
        gc.unfreeze()
        started = time.perf_counter()
        collected = gc.collect()
        seconds = time.perf_counter() - started
        gc.freeze()
        self.compactions += 1
        self.frozen_after_compaction = self.frozen()
        self.compacted_at = time.monotonic()
        self.rss_after_compaction = self._rss()
        return Compaction(
            collected, seconds, before, self.frozen_after_compaction, rss_before, self.rss_after_compaction
        )

    def due(self, bounds: Bounds, *, idle: bool | None = None) -> Reason | None:
        """Why a compaction is due now (``due``). ``idle`` None: the cheap check (the resident set
        and the time: microseconds); otherwise the frozen objects are counted too (``frozen``)."""
        return due(
            bounds,
            idle=idle,
            frozen=None if idle is None else self.frozen(),
            frozen_after=self.frozen_after_compaction,
            rss=self._rss(),
            rss_after=self.rss_after_compaction,
            since_s=time.monotonic() - self.compacted_at,
        )

    def _after_collection(self, phase: str, info: dict[str, Any]) -> None:
        # generation 0's survivors move to generation 1 and are frozen only if they survive its
        # collection too: what a request allocates and drops again is still collected as usual
        if phase == "stop" and info["generation"] >= 1:
            gc.freeze()
            self.freezes += 1


async def keep_within(freezer: SurvivorFreezer, bounds: Bounds, *, every_s: float = 1.0) -> None:
    """Until cancelled, every ``every_s``: compact when the memory or time bound says so (``due``
    without ``idle``), for a process that cannot tell its quiet moments."""
    while True:
        await asyncio.sleep(every_s)
        if freezer.installed and freezer.due(bounds) is not None:
            freezer.compact()


async def run_within(run: Coroutine[Any, Any, T], freezer: SurvivorFreezer, bounds: Bounds = Bounds()) -> T:
    """``run``, with what the installed ``freezer`` keeps back held to ``bounds`` (``keep_within``)."""
    bound = asyncio.create_task(keep_within(freezer, bounds), name="gc-bounds")
    try:
        return await run
    finally:
        bound.cancel()
        await asyncio.gather(bound, return_exceptions=True)
