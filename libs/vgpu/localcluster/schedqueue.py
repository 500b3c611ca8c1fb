"""kube-scheduler's scheduling queue: active, back-off and unschedulable pods, as its Go code keeps them.

* ``activeQ``: pods to try now, first in first out (kube-scheduler's PrioritySort orders by priority,
  then by the time the pod entered the queue; the local cluster has no priorities).
* ``backoffQ``: pods that failed and wait ``initial * 2^(attempts-1)`` seconds (capped at ``max``)
  since their last failure before they go back to ``activeQ``.
* ``unschedulablePods``: pods no node could take (a FitError). They leave only on a cluster event
  that could make them schedulable (``move_all``: a node added or changed in a way that matters, an
  assigned pod gone, a bind that failed and freed its assumed resources), on an update of the pod
  itself, or after ``unschedulable_timeout_s`` (kube-scheduler's ``podMaxInUnschedulablePodsDuration``,
  5 min). Leaving, they go to ``backoffQ`` while their back-off has not expired, else to ``activeQ``.

A pod that failed with an *error* (an extender or bind error, an API error) is not unschedulable:
it goes to ``backoffQ``; after ``error_attempts_before_unschedulable`` failures in a row it parks in
``unschedulablePods`` like an unschedulable pod. kube-scheduler's ``moveRequestCycle`` rule is kept: a
pod whose scheduling cycle started before the last ``move_all`` goes to ``backoffQ``, never to
``unschedulablePods``, so an event during its cycle is not missed. Times are the event loop's clock
(``clock`` for tests).

``queued_s(key)``: how long the pod last waited in ``activeQ`` before ``pop`` handed it out, the
wait kube-scheduler's one-pod-at-a-time cycle puts in front of every pod when pods arrive faster
than it finishes them.
"""

from __future__ import annotations

import asyncio
import collections
import enum
import heapq
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

from vgpu.waits import wait_at_most

K = TypeVar("K", bound=Hashable)


class Where(enum.Enum):
    ACTIVE = "active"
    BACKOFF = "backoff"
    UNSCHEDULABLE = "unschedulable"
    IN_FLIGHT = "in-flight"


@dataclass
class _Entry:
    attempts: int = 0
    failed_at: float = 0.0
    where: Where = Where.ACTIVE
    since: float = 0.0  # when it entered the unschedulable pods
    active_since: float = 0.0  # when it last entered activeQ
    queued_s: float = 0.0  # how long it waited there before its last pop
    updated_in_flight: bool = False  # the pod changed during its cycle: a failure retries it at once


def backoff_s(attempts: int, *, initial_s: float, max_s: float) -> float:
    """kube-scheduler's ``calculateBackoffDuration``: initial, doubled per further attempt, capped."""
    duration = initial_s
    for _ in range(1, attempts):
        duration *= 2
        if duration >= max_s:
            return max_s
    return min(duration, max_s)


class SchedulingQueue(Generic[K]):
    """See the module docstring. ``pop()`` waits for the next pod; the rest never blocks."""

    def __init__(
        self,
        *,
        initial_backoff_s: float = 1.0,
        max_backoff_s: float = 10.0,
        unschedulable_timeout_s: float = 300.0,
        error_attempts_before_unschedulable: int = 5,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self._clock = clock
        self._initial_s = initial_backoff_s
        self._max_s = max_backoff_s
        self._unschedulable_timeout_s = unschedulable_timeout_s
        self._error_limit = error_attempts_before_unschedulable
        self._entries: dict[K, _Entry] = {}
        self._active: collections.OrderedDict[K, None] = collections.OrderedDict()
        self._backoff: list[tuple[float, int, K]] = []  # heap of (ready at, seq, key); stale entries skipped
        self._unschedulable: collections.OrderedDict[K, None] = collections.OrderedDict()
        self._seq = 0
        self.scheduling_cycle = 0
        self._move_request_cycle = -1
        self._wake = asyncio.Event()

    # ----- what callers see -----

    def where(self, key: K) -> Where | None:
        entry = self._entries.get(key)
        return None if entry is None else entry.where

    def attempts(self, key: K) -> int:
        entry = self._entries.get(key)
        return 0 if entry is None else entry.attempts

    def queued_s(self, key: K) -> float:
        """Seconds the pod waited in ``activeQ`` before its last ``pop`` (0.0 for an unknown pod)."""
        entry = self._entries.get(key)
        return 0.0 if entry is None else entry.queued_s

    def __len__(self) -> int:
        return len(self._entries)

    # ----- changes -----

    def add(self, key: K) -> None:
        """A pending pod appeared (or is seen again): queue it unless it is already known."""
        if key not in self._entries:
            self._entries[key] = _Entry()
            self._to_active(key)

    def updated(self, key: K) -> None:
        """The pod itself changed (spec, labels, annotations): an unschedulable pod is retried, and
        one in its scheduling cycle is retried at once if the cycle fails (v1.20's
        ``PriorityQueue.Update`` adds a pod that is in no queue to activeQ)."""
        entry = self._entries.get(key)
        if entry is None:
            self.add(key)
        elif entry.where is Where.UNSCHEDULABLE:
            self._leave_unschedulable(key, entry, self._now())
        elif entry.where is Where.IN_FLIGHT:
            entry.updated_in_flight = True

    def forget(self, key: K) -> None:
        """The pod is bound, deleted or no longer ours."""
        entry = self._entries.pop(key, None)
        if entry is None:
            return
        self._active.pop(key, None)
        self._unschedulable.pop(key, None)

    def done(self, key: K) -> None:
        """The pod's scheduling cycle succeeded (it is assumed and binding): drop it from the queue."""
        self.forget(key)

    def failed(self, key: K, cycle: int, *, unschedulable: bool) -> float:
        """The pod's attempt in ``cycle`` failed; park it and return its back-off in seconds."""
        now = self._now()
        entry = self._entries.get(key)
        if entry is None:  # forgotten during its cycle (deleted, bound by someone else)
            return 0.0
        entry.attempts += 1
        entry.failed_at = now
        delay = backoff_s(entry.attempts, initial_s=self._initial_s, max_s=self._max_s)
        if entry.updated_in_flight:
            entry.updated_in_flight = False
            self._to_active(key)
            return delay
        to_unschedulable = unschedulable or entry.attempts >= self._error_limit
        if to_unschedulable and self._move_request_cycle < cycle:
            entry.where, entry.since = Where.UNSCHEDULABLE, now
            self._unschedulable[key] = None
            self._wake.set()  # pop() recomputes when to flush it
        else:
            self._to_backoff(key, entry)
        return delay

    def move_all(self) -> None:
        """A cluster event that may make unschedulable pods fit (MoveAllToActiveOrBackoffQueue)."""
        self._move_request_cycle = self.scheduling_cycle
        now = self._now()
        for key in list(self._unschedulable):
            self._leave_unschedulable(key, self._entries[key], now)

    async def pop(self) -> tuple[K, int]:
        """The next pod to schedule and its scheduling cycle number."""
        while True:
            now = self._now()
            self._flush(now)
            if self._active:
                key, _ = self._active.popitem(last=False)
                entry = self._entries[key]
                entry.where = Where.IN_FLIGHT
                entry.queued_s = now - entry.active_since
                self.scheduling_cycle += 1
                return key, self.scheduling_cycle
            self._wake.clear()
            due = self._next_due()
            timeout = None if due is None else max(0.0, due - now)
            await wait_at_most(self._wake.wait(), timeout)

    # ----- internals -----

    def _now(self) -> float:
        return self._clock() if self._clock is not None else asyncio.get_running_loop().time()

    def _ready_at(self, entry: _Entry) -> float:
        return entry.failed_at + backoff_s(entry.attempts, initial_s=self._initial_s, max_s=self._max_s)

    def _to_active(self, key: K) -> None:
        entry = self._entries[key]
        entry.where = Where.ACTIVE
        entry.active_since = self._now()
        self._active[key] = None
        self._wake.set()

    def _to_backoff(self, key: K, entry: _Entry) -> None:
        entry.where = Where.BACKOFF
        self._seq += 1
        heapq.heappush(self._backoff, (self._ready_at(entry), self._seq, key))
        self._wake.set()

    def _leave_unschedulable(self, key: K, entry: _Entry, now: float) -> None:
        self._unschedulable.pop(key, None)
        if self._ready_at(entry) > now:
            self._to_backoff(key, entry)
        else:
            self._to_active(key)

    def _flush(self, now: float) -> None:
        while self._backoff and self._backoff[0][0] <= now:
            ready_at, _, key = heapq.heappop(self._backoff)
            entry = self._entries.get(key)
            if entry is not None and entry.where is Where.BACKOFF and self._ready_at(entry) == ready_at:
                self._to_active(key)
        limit = now - self._unschedulable_timeout_s
        while self._unschedulable:
            key = next(iter(self._unschedulable))
            entry = self._entries[key]
            if entry.since > limit:
                break
            self._leave_unschedulable(key, entry, now)

    def _next_due(self) -> float | None:
        while self._backoff:
            ready_at, _, key = self._backoff[0]
            entry = self._entries.get(key)
            if entry is not None and entry.where is Where.BACKOFF and self._ready_at(entry) == ready_at:
                break
            heapq.heappop(self._backoff)  # stale: the pod moved on
        dues = []
        if self._backoff:
            dues.append(self._backoff[0][0])
        if self._unschedulable:
            dues.append(self._entries[next(iter(self._unschedulable))].since + self._unschedulable_timeout_s)
        return min(dues) if dues else None
