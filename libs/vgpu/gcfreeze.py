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
one full pause, so the caller runs it at a quiet moment. ``uninstall`` hands everything back to the
collector.

The emulated control plane (``vgpu.localcluster.serve``) and the benchmarks install it too: the Go
API server and kube-scheduler they stand for have no stop-the-world pauses of this size.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Compaction:
    """What one ``compact`` did: cyclic garbage found, its pause, objects frozen before and after."""

    collected: int
    seconds: float
    frozen_before: int
    frozen_after: int


class SurvivorFreezer:
    """Freezes the survivors of every young collection; see the module docstring."""

    def __init__(self) -> None:
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
        gc.unfreeze()
        started = time.perf_counter()
        collected = gc.collect()
        seconds = time.perf_counter() - started
        gc.freeze()
        self.compactions += 1
        self.frozen_after_compaction = self.frozen()
        self.compacted_at = time.monotonic()
        return Compaction(collected, seconds, before, self.frozen_after_compaction)

    def _after_collection(self, phase: str, info: dict[str, Any]) -> None:
        # generation 0's survivors move to generation 1 and are frozen only if they survive its
        # collection too: what a request allocates and drops again is still collected as usual
        if phase == "stop" and info["generation"] >= 1:
            gc.freeze()
            self.freezes += 1
