"""GPU health that recovers: XID events and failed probes mark a GPU unhealthy; quiet passing probes heal it.

``HealthTracker`` is the pure state machine (time is a parameter: ``clock``). ``HealthMonitor``
feeds it from the backend (events waited for in a worker thread, probes on an interval) and
tells watchers (ListAndWatch, the register annotation) when anything changed.

Rules: an XID critical error on a GPU marks it (and so all its virtual devices) unhealthy, except
the ignored application XIDs (13, 31, 43, 45, 68, 109 by default), which change nothing even when
the event's GPU cannot be read. A lost GPU (vanished, not listed at a session start, event
registration failed, an unattributable event, a failed event wait: every GPU) is unhealthy; after a
failed event wait the next one waits ``probe_interval_s`` (a broken driver fails at once, every
time). An unhealthy GPU becomes healthy again once ``recovery_s`` have passed since the last bad
signal and a probe passes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field

from vgpu.core.device import GpuUuid
from vgpu.core.errors import GpuBackendError
from vgpu.gpu.port import EventKind, GpuBackend, GpuEvent

log = logging.getLogger(__name__)


@dataclass
class _GpuState:
    healthy: bool = True
    last_bad_s: float = 0.0
    reason: str = ""
    conditions: dict[str, str] = field(default_factory=dict)  # node conditions holding it unhealthy

    @property
    def usable(self) -> bool:
        return self.healthy and not self.conditions


class HealthTracker:
    """Per-GPU health with recovery. Methods return the UUIDs whose health changed."""

    def __init__(
        self,
        uuids: Iterable[GpuUuid],
        *,
        clock: Callable[[], float],
        recovery_s: float,
        ignored_xids: Iterable[int],
        xid_checks: bool = True,
    ) -> None:
        self._gpus = {u: _GpuState() for u in uuids}
        self._clock = clock
        self._recovery_s = recovery_s
        self._ignored = frozenset(ignored_xids)
        self._xid_checks = xid_checks

    def adopt(self, previous: HealthTracker) -> None:
        """Carry GPU states over from an earlier session (a restart does not heal a GPU)."""
        for uuid, state in previous._gpus.items():
            if uuid in self._gpus:
                self._gpus[uuid] = _GpuState(state.healthy, state.last_bad_s, state.reason)

    def healthy(self, uuid: GpuUuid) -> bool:
        state = self._gpus.get(uuid)
        return state is not None and state.usable

    def snapshot(self) -> dict[GpuUuid, bool]:
        return {u: s.usable for u, s in self._gpus.items()}

    def reasons(self) -> dict[GpuUuid, str]:
        """Why each unhealthy GPU is unhealthy: its own last bad signal (``XID 79 critical error``,
        ``lost: ...``, ``probe failed``) and the node conditions holding it, joined by ``; ``."""
        out = {}
        for uuid, state in self._gpus.items():
            if state.usable:
                continue
            parts = [state.reason] if not state.healthy and state.reason else []
            parts += list(state.conditions.values())
            out[uuid] = "; ".join(parts)
        return out

    def set_condition(self, name: str, reason: str | None, *, uuids: Iterable[GpuUuid]) -> set[GpuUuid]:
        """Hold ``uuids`` unhealthy while the node condition ``name`` has a ``reason`` (e.g. HAMi-core's
        files missing); ``None`` clears it (no recovery delay: the cause is gone, not flaky). The
        GPU's own health is untouched. Returns the UUIDs whose reported health changed."""
        changed = set()
        for uuid in uuids:
            state = self._gpus.get(uuid)
            if state is None:
                continue
            before = state.usable
            if reason is None:
                state.conditions.pop(name, None)
            else:
                state.conditions[name] = reason
            if state.usable != before:
                changed.add(uuid)
        return changed

    def uuids(self) -> list[GpuUuid]:
        return list(self._gpus)

    def _mark_bad(self, uuid: GpuUuid, reason: str) -> bool:
        state = self._gpus[uuid]
        state.last_bad_s = self._clock()
        state.reason = reason
        if state.healthy:
            state.healthy = False
            log.warning("GPU %s marked Unhealthy: %s", uuid, reason)
            return True
        return False

    def on_event(self, event: GpuEvent) -> set[GpuUuid]:
        # before anything else, as NVIDIA's plugin does: an application XID whose GPU could not be
        # read (a LOST event carrying the XID) must not mark every GPU
        if event.xid and event.xid in self._ignored:
            log.info("GPU %s: XID %d ignored (application error)", event.uuid or "(unknown)", event.xid)
            return set()
        if event.kind == EventKind.XID:
            if not self._xid_checks:
                return set()
            reason = f"XID {event.xid} critical error"
        else:
            reason = f"lost: {event.detail}" if event.detail else "lost"
        if event.uuid is None:
            targets = list(self._gpus)
        elif event.uuid in self._gpus:
            targets = [event.uuid]
        else:
            log.info("health event for unknown GPU %s ignored: %s", event.uuid, reason)
            return set()
        return {u for u in targets if self._mark_bad(u, reason)}

    def on_probe(self, uuid: GpuUuid, ok: bool) -> set[GpuUuid]:
        state = self._gpus.get(uuid)
        if state is None:
            return set()
        if not ok:
            return {uuid} if self._mark_bad(uuid, "probe failed") else set()
        if state.healthy or self._clock() - state.last_bad_s < self._recovery_s:
            return set()
        state.healthy = True
        log.warning(
            "GPU %s recovered (healthy again after %.0f s without errors; was: %s)",
            uuid,
            self._recovery_s,
            state.reason,
        )
        state.reason = ""
        return {uuid}


class HealthMonitor:
    """Runs a tracker against a backend and publishes a change counter watchers can wait on."""

    def __init__(
        self,
        backend: GpuBackend,
        tracker: HealthTracker,
        *,
        probe_interval_s: float,
        event_wait_s: float = 1.0,
        events_enabled: bool = True,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        """``sleep`` paces the probes and the back-off after a failed event wait."""
        self._backend = backend
        self.tracker = tracker
        self._probe_interval_s = probe_interval_s
        self._event_wait_s = event_wait_s
        self._events_enabled = events_enabled
        self._sleep = sleep
        self._changed = asyncio.Condition()
        self.version = 0

    async def _bump(self, changed: set[GpuUuid]) -> None:
        if changed:
            async with self._changed:
                self.version += 1
                self._changed.notify_all()

    async def wait_changed(self, version: int) -> int:
        """Wait until the version differs from ``version``; return the new version."""
        async with self._changed:
            await self._changed.wait_for(lambda: self.version != version)
            return self.version

    async def set_condition(self, name: str, reason: str | None, *, uuids: Iterable[GpuUuid]) -> None:
        """``HealthTracker.set_condition``, telling watchers when a GPU's health changed."""
        await self._bump(self.tracker.set_condition(name, reason, uuids=uuids))

    async def handle_event(self, event: GpuEvent) -> None:
        await self._bump(self.tracker.on_event(event))

    async def probe_all(self) -> None:
        for uuid in self.tracker.uuids():
            ok = await asyncio.to_thread(self._backend.probe, uuid)
            await self._bump(self.tracker.on_probe(uuid, ok))

    async def _event_loop(self) -> None:
        while True:
            try:
                event = await asyncio.to_thread(self._backend.wait_event, self._event_wait_s)
            except GpuBackendError as exc:  # e.g. "NVML event wait failed: GPU is lost"
                event = GpuEvent(EventKind.LOST, None, detail=str(exc))
                await self.handle_event(event)
                await self._sleep(self._probe_interval_s)  # do not spin on a broken driver
                continue
            if event is not None:
                await self.handle_event(event)

    async def _probe_loop(self) -> None:
        while True:
            await self.probe_all()
            await self._sleep(self._probe_interval_s)

    async def run(self) -> None:
        """Run until cancelled; wakes the backend's blocked event wait on the way out."""
        try:
            async with asyncio.TaskGroup() as tg:
                if self._events_enabled:
                    tg.create_task(self._event_loop())
                tg.create_task(self._probe_loop())
        finally:
            self._backend.interrupt()
