"""The writes that follow an Allocate, made after kubelet has its answer.

kubelet calls Allocate from its single pod loop with no deadline: every pod change on the node
waits while one Allocate waits on the API server. So Allocate answers from the watch caches and
hands its writes (the pod's to-allocate / bind-phase PATCH, the node lock's release) to a
``Writes``: ``WriteQueue`` makes them in order on a worker task of its own, each retried (1 s,
doubling to 30 s) until it lands or its object is gone, so a brownout of the API server delays the
writes and never the answer. ``Inline`` makes each write inside ``submit`` (the old shape: tests
of what is written, where the order of calls is the point).
"""

import asyncio
import collections
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

from vgpu.core import errors

log = logging.getLogger(__name__)

Write = Callable[[], Awaitable[None]]


class Writes(Protocol):
    async def submit(self, label: str, write: Write) -> None:
        """Have ``write`` made (``label`` names it in logs); a KubeError from it is retried."""
        ...


class Inline:
    """Makes each write at once, in the caller; errors are logged, not raised (as the queue does)."""

    async def submit(self, label: str, write: Write) -> None:
        try:
            await write()
        except errors.KubeError as exc:
            log.error("%s failed: %s", label, exc)


class WriteQueue:
    """Writes in submission order on one worker task, started when there is work and ended when
    there is none; ``drain`` waits until everything submitted has landed or been given up."""

    def __init__(
        self,
        *,
        retry_s: float = 1.0,
        max_retry_s: float = 30.0,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._retry_s = retry_s
        self._max_retry_s = max_retry_s
        self._sleep = sleep
        self._jobs: collections.deque[tuple[str, Write]] = collections.deque()
        self._worker: asyncio.Task[None] | None = None
        self._idle = asyncio.Event()
        self._idle.set()
        self.landed = 0
        self.given_up = 0

    @property
    def pending(self) -> int:
        return len(self._jobs)

    async def submit(self, label: str, write: Write) -> None:
        self._jobs.append((label, write))
        self._idle.clear()
        if self._worker is None or self._worker.done():
            self._worker = asyncio.create_task(self._run(), name="allocate-writes")

    async def drain(self) -> None:
        await self._idle.wait()

    async def close(self, *, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for the writes in flight, then stop (the rest are logged)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.drain(), timeout_s)
        for label, _ in self._jobs:
            log.error("%s: not made before the plugin stopped", label)
        self._jobs.clear()
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker
            self._worker = None
        self._idle.set()

    async def _run(self) -> None:
        while self._jobs:
            label, write = self._jobs[0]
            await self._make(label, write)
            self._jobs.popleft()
        self._idle.set()

    async def _make(self, label: str, write: Write) -> None:
        delay_s = self._retry_s
        while True:
            try:
                await write()
                self.landed += 1
                return
            except errors.NotFound as exc:
                log.info("%s: given up, the object is gone: %s", label, exc)
            except errors.KubeError as exc:
                log.warning("%s failed: %s; retrying in %.0f s", label, exc, delay_s)
                await self._sleep(delay_s)
                delay_s = min(delay_s * 2, self._max_retry_s)
                continue
            except Exception:  # a bug in one write must not stop the others
                log.exception("%s failed unexpectedly; given up", label)
            self.given_up += 1
            return
