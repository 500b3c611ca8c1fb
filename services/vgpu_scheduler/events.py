"""Kubernetes Events, recorded without holding up a reply: each is a tracked background task.

``emit`` returns at once; the tasks are kept in a set so that ``aclose`` can cancel what is still
in flight at shutdown (nothing outlives the app). A failed event is logged, never raised: events
are for people, losing one must not fail a filter or a bind.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Literal

from vgpu.core import errors
from vgpu.kube.port import JsonObj, KubeApi

log = logging.getLogger(__name__)

EventType = Literal["Normal", "Warning"]


class EventRecorder:
    """Fire-and-forget events about pods and nodes, as ``component``."""

    def __init__(self, api: KubeApi, *, component: str) -> None:
        self._api = api
        self._component = component
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    def emit(self, involved: JsonObj, *, reason: str, message: str, type: EventType = "Normal") -> None:
        if self._closed:
            return
        meta = involved.get("metadata") or {}
        namespace = meta.get("namespace") or "default"
        task = asyncio.get_running_loop().create_task(
            self._send(namespace, involved, reason, message[:1024], type), name=f"event-{reason}"
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send(
        self, namespace: str, involved: JsonObj, reason: str, message: str, type: EventType
    ) -> None:
        try:
            await self._api.create_event(
                namespace=namespace,
                involved=involved,
                reason=reason,
                message=message,
                type=type,
                component=self._component,
            )
        except errors.KubeError as exc:
            name = (involved.get("metadata") or {}).get("name")
            log.warning("could not record event %s on %s %s: %s", reason, involved.get("kind"), name, exc)

    async def drain(self) -> None:
        """Wait until every event emitted so far is sent (tests, orderly shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def aclose(self) -> None:
        """Cancel the events still in flight and stop accepting new ones."""
        self._closed = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
