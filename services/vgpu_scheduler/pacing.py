"""Cooperative slicing of CPU-bound work on the event loop (issue 49).

``/preempt`` judges hundreds of candidate nodes on the loop that answers ``/filter`` inline, and
kube-scheduler's serial cycle pays for every millisecond a ``/filter`` waits. A ``Pacer`` cuts
such work into slices of ``slice_s``: the work asks ``await pacer.pace()`` between small steps (a
node, a fit check, a chunk of the body), and once the slice is used up the loop gets a turn. A
request that came meanwhile then waits for the rest of one slice at most.

The turn is two ``asyncio.sleep(0)``. One is not enough: it puts our task at the end of the ready
queue, and the loop's next iteration polls for I/O only after that, queueing what it found
*behind* our task, so a ``/filter`` that came during a slice would wait for the next slice too.
After the first ``sleep(0)`` the poll queues the I/O callbacks; the second puts our task behind
them. (Both are iterations with work ready: the poll does not block.)

The slices are wall time (a read costs 50 ns, and one is taken after every fit check). The work
done, for a budget, is the loop thread's CPU time without the turns (``worked_s``: others' work
during a turn is not ours, and a busy machine does not shrink the budget); ``loop_s`` is that time
with the turns, the loop's time the work has taken in all, for a deadline that holds whatever the
calls beside it take and whatever else the machine runs.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

SLICE_S = 0.00025  # time between turns: what a request arriving meanwhile may wait for


async def turn() -> None:
    """Let the loop handle the I/O ready by now before the caller goes on (see the module doc)."""
    await asyncio.sleep(0)
    await asyncio.sleep(0)


class Pacer:
    """Slices of ``slice_s`` on ``clock`` (wall time: a thread the machine descheduled mid-slice
    turns as soon as it runs again), a turn between them; the work done is measured on
    ``work_clock`` (the loop thread's CPU time), turns left out."""

    def __init__(
        self,
        *,
        slice_s: float = SLICE_S,
        clock: Callable[[], float] = time.perf_counter,
        work_clock: Callable[[], float] = time.thread_time,
    ) -> None:
        self._clock = clock
        self._work_clock = work_clock
        self._slice_s = slice_s
        self._slice_end = clock() + slice_s
        self._work_start = work_clock()
        self._away = 0.0  # work-clock time spent in turns (others' work), not counted as ours
        self.turns = 0  # turns taken so far

    async def pace(self) -> None:
        """Take a turn if this slice is used up (a read of ``clock`` otherwise: 50 ns)."""
        if self._clock() < self._slice_end:
            return
        before = self._work_clock()
        await turn()
        self.turns += 1
        self._away += self._work_clock() - before
        self._slice_end = self._clock() + self._slice_s

    def worked_s(self) -> float:
        """The work done so far (seconds of ``work_clock``, turns left out)."""
        return self._work_clock() - self._work_start - self._away

    def loop_s(self) -> float:
        """The loop's time since the pacer was made (seconds of ``work_clock``): the work done and
        what the others did in the turns, not the time the machine ran other processes."""
        return self._work_clock() - self._work_start
