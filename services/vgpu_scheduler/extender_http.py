"""The extender listener's HTTP/1.1 server: ``/filter`` answered in the loop turn that reads it.

kube-scheduler calls ``/filter`` inside its serial, one-pod-at-a-time scheduling cycle, so the
time between its request reaching this process and the answer leaving it is paid by every pod in
the cluster. On aiohttp's server a request's handler runs two turns of the event loop after its
bytes are read (Python 3.11: the connection's task wakes, then the handler's task starts), and each
turn waits behind everything else the loop has queued by then: watch events, the binds' writes,
the webhook. With 16 cores kube-scheduler's serial cycle was the limit of GPU pods, and a GPU pod's
cycle was 1.3-2.3 ms longer than a plain pod's, of which our handler was 0.5 ms (docs/benchmarks.md,
"Twenty-second pass").

So the extender's verbs get a server of their own, with the request parsed by ``httptools``
(llhttp, the parser behind uvicorn): ``ExtenderServer`` listens, counts and stops; each connection
is an ``extender_conn.Connection`` (the reading, the order of the answers, the limits and the
linger after a refusal); a verb and its ``Reply`` are ``extender_wire.py``'s.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Mapping
from typing import cast

from vgpu_scheduler import listener
from vgpu_scheduler.extender_conn import LINGER_S, Connection
from vgpu_scheduler.extender_wire import AsyncVerb, InlineVerb, Reply, Verb

log = logging.getLogger(__name__)


class ExtenderServer:
    """The extender's verbs on one TCP listener (see the module docstring)."""

    def __init__(
        self,
        verbs: Mapping[str, Verb],
        *,
        limits: listener.Limits,
        limit_log: listener.LimitLog,
        linger_s: float = LINGER_S,
    ) -> None:
        self.verbs = dict(verbs)
        self.limits = limits
        self.limit_log = limit_log
        self.linger_s = linger_s  # how long a refused connection drops what its caller still sends
        self.active = 0  # connections holding a slot
        self.accepted = 0  # connections accepted so far (refused ones apart)
        # requests to a verb so far, by path and whether each was the first on its connection:
        # kube-scheduler's client keeps two idle connections, so many of its calls dial
        self.requests: Counter[tuple[str, bool]] = Counter()
        self.connections: set[Connection] = set()
        # refused connections dropping what their callers still send, oldest first
        self.lingering: dict[Connection, None] = {}
        self.tasks: set[asyncio.Task[Reply]] = set()
        self.stopping = False
        self._server: asyncio.Server | None = None

    async def start(self, host: str, port: int, *, backlog: int = 128) -> str:
        """Listen on ``host:port`` (0: a free port); returns ``host:port`` as bound."""
        self.stopping = False
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: Connection(self), host, port, backlog=backlog)
        bound_host, bound_port = self._server.sockets[0].getsockname()[:2]
        return f"{bound_host}:{bound_port}"

    async def stop(self, *, timeout_s: float) -> None:
        """Stop listening, let answers under way finish for ``timeout_s``, then cancel them."""
        self.stopping = True
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            conn.close_when_idle()
        for lingering in list(self.lingering):
            lingering.end_linger()
        if self.tasks:
            await asyncio.wait(list(self.tasks), timeout=timeout_s)
        for task in list(self.tasks):
            task.cancel()
        if self.tasks:
            await asyncio.gather(*self.tasks, return_exceptions=True)
        for conn in list(self.connections):
            conn.abort()  # (those answered above are closing already: their answers are sent)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    def call_inline(self, verb: Verb, body: bytes) -> Reply:
        try:
            return cast(InlineVerb, verb.call)(body)
        except Exception as exc:  # a bug: answer it as kube-scheduler's contract says, and log it
            log.exception("extender verb failed")
            return Reply(500, {"Error": f"internal error: {exc}"})

    @staticmethod
    async def call_async(call: AsyncVerb, body: bytes) -> Reply:
        try:
            return await call(body)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("extender verb failed")
            return Reply(500, {"Error": f"internal error: {exc}"})
