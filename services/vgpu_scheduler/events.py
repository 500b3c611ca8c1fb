"""Kubernetes Events, recorded without holding up a reply: a bounded queue drained by a few senders.

``emit`` returns at once. Events wait in a queue of at most ``max_queued`` distinct events; an
event identical to one still waiting (same object, type, reason and message) is coalesced into it
and sent once with its ``count`` (what client-go's EventCorrelator does with repeats); when the
queue is full the event is dropped and counted. ``senders`` tasks (2 by default) send them, so a
storm of events (3,000 failed filters) holds at most that many API calls at a time and never
starves the calls that answer kube-scheduler. A failed event is logged, never raised: events are
for people, losing one must not fail a filter or a bind. ``aclose`` cancels what is left.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Literal

from vgpu.core import errors
from vgpu.kube.port import JsonObj, KubeApi

log = logging.getLogger(__name__)

EventType = Literal["Normal", "Warning"]
MAX_QUEUED = 1000
SENDERS = 2
_Key = tuple[str, str, str, str, str, str]


@dataclass
class _Pending:
    namespace: str
    involved: JsonObj
    reason: str
    message: str
    type: EventType
    count: int = 1


class EventRecorder:
    """Fire-and-forget events about pods and nodes, as ``component``."""

    def __init__(
        self, api: KubeApi, *, component: str, max_queued: int = MAX_QUEUED, senders: int = SENDERS
    ) -> None:
        self._api = api
        self._component = component
        self._max_queued = max_queued
        self._senders = senders
        self._pending: dict[_Key, _Pending] = {}  # insertion order is sending order
        self._sending = 0
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._tasks: list[asyncio.Task[None]] = []
        self._closed = False
        self.sent = 0
        self.coalesced = 0  # events merged into one still waiting
        self.dropped = 0  # events refused because the queue was full

    @property
    def queued(self) -> int:
        """Distinct events waiting to be sent (not counting the ones being sent)."""
        return len(self._pending)

    def emit(self, involved: JsonObj, *, reason: str, message: str, type: EventType = "Normal") -> None:
        if self._closed:
            return
        meta = involved.get("metadata") or {}
        namespace = str(meta.get("namespace") or "default")
        message = message[:1024]
        key = (
            namespace,
            str(involved.get("kind", "")),
            str(meta.get("name", "")),
            str(meta.get("uid", "")),
            f"{type}/{reason}",
            message,
        )
        waiting = self._pending.get(key)
        if waiting is not None:
            waiting.count += 1
            self.coalesced += 1
            return
        if len(self._pending) >= self._max_queued:
            self.dropped += 1
            if self.dropped in (1, 10, 100) or self.dropped % 1000 == 0:
                log.warning(
                    "event queue full (%d waiting): dropped event %s on %s %s (%d dropped so far)",
                    len(self._pending),
                    reason,
                    involved.get("kind"),
                    meta.get("name"),
                    self.dropped,
                )
            return
        self._pending[key] = _Pending(namespace, involved, reason, message, type)
        self._idle.clear()
        self._wake.set()
        if not self._tasks:
            loop = asyncio.get_running_loop()
            self._tasks = [
                loop.create_task(self._sender(), name=f"event-sender-{i}") for i in range(self._senders)
            ]

    async def _sender(self) -> None:
        while True:
            if not self._pending:
                if self._sending == 0:
                    self._idle.set()
                self._wake.clear()
                await self._wake.wait()
                continue
            key = next(iter(self._pending))
            event = self._pending.pop(key)
            self._sending += 1
            try:
                await self._send(event)
            finally:
                self._sending -= 1

    async def _send(self, event: _Pending) -> None:
        try:
            await self._api.create_event(
                namespace=event.namespace,
                involved=event.involved,
                reason=event.reason,
                message=event.message,
                type=event.type,
                component=self._component,
                count=event.count,
            )
            self.sent += 1
        except errors.KubeError as exc:
            name = (event.involved.get("metadata") or {}).get("name")
            log.warning(
                "could not record event %s on %s %s: %s", event.reason, event.involved.get("kind"), name, exc
            )
        except Exception:  # a bug must not stop the sender (and with it every later event)
            name = (event.involved.get("metadata") or {}).get("name")
            log.exception(
                "could not record event %s on %s %s", event.reason, event.involved.get("kind"), name
            )

    async def drain(self) -> None:
        """Wait until every event emitted so far is sent (tests, orderly shutdown)."""
        while self._pending or self._sending:
            self._idle.clear()
            await self._idle.wait()

    async def aclose(self) -> None:
        """Cancel the events still queued or in flight and stop accepting new ones."""
        self._closed = True
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._pending.clear()
        self._idle.set()
