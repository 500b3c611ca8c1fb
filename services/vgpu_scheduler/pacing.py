"""Cooperative slicing of CPU-bound work on the event loop (issue 49).

``/preempt`` judges hundreds of candidate nodes on the loop that answers ``/filter`` inline, and
kube-scheduler's serial cycle pays for every millisecond a ``/filter`` waits. A ``Pacer`` cuts
such work into slices of ``slice_s`` of CPU time: the work asks ``await pacer.pace()`` between
small steps (a node, a few fit checks, a chunk of the body), and once the slice is used up the
loop gets a turn. A request that came meanwhile then waits for the rest of one slice at most.

The turn is two ``asyncio.sleep(0)``. One is not enough: it puts our task at the end of the ready
queue, and the loop's next iteration polls for I/O only after that, queueing what it found
*behind* our task, so a ``/filter`` that came during a slice would wait for the next slice too.
After the first ``sleep(0)`` the poll queues the I/O callbacks; the second puts our task behind
them. (Both are iterations with work ready: the poll does not block.)

The time away (others' work during the turn) is not counted as work: ``pace`` returns the work
done so far, for a budget, and a busy loop does not shrink it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

SLICE_S = 0.00025  # CPU time between turns: what a request arriving meanwhile may wait for


async def turn() -> None:
    """Let the loop handle the I/O ready by now before the caller goes on (see the module doc)."""
    await asyncio.sleep(0)
    await asyncio.sleep(0)


class Pacer:
    """Slices of ``slice_s`` on ``clock`` (the loop thread's CPU time by default), a turn between."""

    def __init__(self, *, slice_s: float = SLICE_S, clock: Callable[[], float] = time.thread_time) -> None:
        self._clock = clock
        self._slice_s = slice_s
        self._start = self._slice_start = clock()
        self._away = 0.0  # time spent in turns (others' work), not counted as ours
        self.turns = 0  # turns taken so far

    async def pace(self) -> float:
        """Take a turn if this slice is used up; the work done so far (seconds, turns left out)."""
        now = self._clock()
        if now - self._slice_start >= self._slice_s:
            await turn()
            self.turns += 1
            back = self._clock()
            self._away += back - now
            self._slice_start = now = back
        return now - self._start - self._away
