"""Can the process serve requests now? Event-loop lag and the API call pool's backlog, for ``/readyz``.

``LoopLagProbe`` wakes every ``interval_s`` and records how late it woke: a loop busy with one
long step (or starved of CPU) wakes late. ``Load.problem()`` says why requests cannot be served
in time, or None: the loop lagged more than ``max_loop_lag_s`` on its last wake-up, or an API call
has waited more than ``max_api_wait_s`` for a pool worker (every worker blocked, e.g. on a slow API
server). ``/readyz`` answers 503 with that reason, so a Service stops sending traffic to a replica
that would answer kube-scheduler after its 30 s extender timeout, and recovers by itself.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Protocol

MAX_LOOP_LAG_S = 2.0
MAX_API_WAIT_S = 5.0
PROBE_INTERVAL_S = 0.5


class PoolBacklog(Protocol):
    """What readiness reads from the API call pool (``vgpu.kube.threads.CallPool``)."""

    @property
    def busy(self) -> int: ...

    @property
    def queued(self) -> int: ...

    def oldest_wait_s(self) -> float: ...


class LoopLagProbe:
    """Measures how late the event loop runs a timer; ``run()`` until cancelled."""

    def __init__(self, *, interval_s: float = PROBE_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self.lag_s = 0.0  # on the last wake-up
        self.max_lag_s = 0.0  # since start (metrics)
        self.observed = asyncio.Event()  # set at every observation (tests wait on it)
        self._excused = False

    def excuse(self) -> None:
        """The loop was just held on purpose, once (the collection at readiness, ``gcfreeze``): the
        next wake-up's lateness is that pause, over by then, and is not kept as ``lag_s`` (so
        ``/readyz`` does not turn 503 right after it turned 200); ``max_lag_s`` still counts it."""
        self._excused = True

    def observe(self, *, expected_at: float, woke_at: float) -> None:
        lag_s = max(0.0, woke_at - expected_at)
        self.max_lag_s = max(self.max_lag_s, lag_s)
        if self._excused:
            self._excused = False
        else:
            self.lag_s = lag_s
        self.observed.set()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            expected_at = loop.time() + self.interval_s
            await asyncio.sleep(self.interval_s)
            self.observe(expected_at=expected_at, woke_at=loop.time())


@dataclass
class Load:
    """The readiness verdict from the probe and the pool (either may be absent)."""

    probe: LoopLagProbe | None = None
    pool: PoolBacklog | None = None
    max_loop_lag_s: float = MAX_LOOP_LAG_S
    max_api_wait_s: float = MAX_API_WAIT_S

    def problem(self) -> str | None:
        if self.probe is not None and self.probe.lag_s > self.max_loop_lag_s:
            return (
                f"event loop lagging: a {self.probe.interval_s:g} s timer ran {self.probe.lag_s:.1f} s late "
                f"(limit {self.max_loop_lag_s:g} s)"
            )
        if self.pool is not None:
            waited_s = self.pool.oldest_wait_s()
            if waited_s > self.max_api_wait_s:
                return (
                    f"Kubernetes API calls waiting for a worker: {self.pool.queued} queued, "
                    f"{self.pool.busy} in flight, the oldest for {waited_s:.1f} s (limit {self.max_api_wait_s:g} s)"
                )
        return None
