"""Bounded HTTP(S) listeners: a cap on connections, timeouts on handshakes, heads and bodies.

Every open connection costs memory (about 0.27 MB with TLS), so a client that opens thousands and
sends nothing, or sends half a request, could push the scheduler past its memory limit and take
the webhook and the extender down together. Each listener therefore:

* counts its TCP connections as they are accepted and closes those beyond ``max_connections`` at
  once, before any TLS state exists (``_Gate``: TLS is started by ``loop.start_tls`` only for a
  connection that got a slot);
* gives up on a TLS handshake after ``handshake_timeout_s``;
* closes a connection that has not sent a complete request head ``idle_timeout_s`` after it
  opened or after its last response (aiohttp's keep-alive timer, which also covers idle ones);
* reads each request body within ``body_timeout_s`` and at most ``max_body_bytes`` (413 beyond,
  408 when too slow), before any handler runs (``body_limits`` middleware).

Each limit hit is one log line (no traceback), at most ``LOG_BURST`` a second per listener and
limit, the rest counted and reported with the next line.

A connection leaves no reference cycle behind (``release``): the scheduler freezes what survives a
young collection (``vgpu.gcfreeze``), so a cycle that becomes garbage later waits for a compaction,
and connections come and go at the rate their clients choose. Two such cycles are broken here:

* a failed or timed-out TLS handshake: the exception ``start_tls`` raises refers, through its
  traceback, to the frames that hold the handshake's waiter, which holds the exception; those
  frames also hold asyncio's ``SSLProtocol`` with its 256 KiB read buffer: 256 silent connections
  every handshake timeout would keep 64 MiB each time, until the next compaction. The traceback
  is cleared where the failure is caught.
* a closed socket transport: on Python 3.11 asyncio's selector transport keeps a bound method of
  itself (``_read_ready_cb``; released on close from 3.12, CPython gh-100348), about 0.6 KB a
  connection. It is replaced by a function that refers to nothing once the connection is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import traceback
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import typedefs, web

log = logging.getLogger(__name__)

LOG_BURST = 5  # log lines a second per listener and limit


@dataclass(frozen=True)
class Limits:
    """What one listener tolerates from its clients."""

    max_connections: int = 256
    handshake_timeout_s: float = 5.0
    idle_timeout_s: float = 5.0
    body_timeout_s: float = 5.0
    max_body_bytes: int = 1 << 20


class LimitLog:
    """One line per limit hit, at most ``LOG_BURST`` a second per limit; the rest are counted."""

    def __init__(self, listener: str, *, clock: Callable[[], float]) -> None:
        self._listener = listener
        self._clock = clock
        self._window: dict[str, tuple[int, int]] = {}  # limit -> (second, lines logged in it)
        self._suppressed: dict[str, int] = {}
        self.hits: dict[str, int] = {}  # limit -> total hits, for tests and metrics

    def hit(self, limit: str, message: str) -> None:
        self.hits[limit] = self.hits.get(limit, 0) + 1
        second = int(self._clock())
        window, logged = self._window.get(limit, (second, 0))
        if window != second:
            window, logged = second, 0
        if logged >= LOG_BURST:
            self._suppressed[limit] = self._suppressed.get(limit, 0) + 1
            self._window[limit] = (window, logged)
            return
        self._window[limit] = (window, logged + 1)
        more = self._suppressed.pop(limit, 0)
        suffix = f" ({more} more like it not logged)" if more else ""
        log.warning("%s listener: %s%s", self._listener, message, suffix)


def peer(transport: asyncio.BaseTransport) -> str:
    peer = transport.get_extra_info("peername")
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"{peer[0]}:{peer[1]}"
    return "?"


def forget_traceback(exc: BaseException) -> None:
    """Drop what ``exc`` holds through its traceback: the locals of every frame it passed (those
    still running keep theirs) and the traceback itself, so that an exception kept by a future
    (``start_tls``'s waiter) no longer keeps that future, and what its frames held, in a cycle."""
    traceback.clear_frames(exc.__traceback__)
    exc.__traceback__ = None


def _read_nothing() -> None:
    """What a released transport calls if a read was already queued when it closed."""


def release(transport: asyncio.BaseTransport) -> None:
    """Break the reference cycle a closed asyncio socket transport keeps on Python 3.11 (see the
    module docstring): its ``_read_ready_cb``, a bound method of itself, becomes ``_read_nothing``.
    Only once the transport is closing; a no-op where the attribute is absent or already None."""
    if transport.is_closing() and getattr(transport, "_read_ready_cb", None) is not None:
        setattr(transport, "_read_ready_cb", _read_nothing)  # noqa: B010 (asyncio's private name)


class _Gate(asyncio.Protocol):
    """One accepted TCP connection: counted, refused over the cap, upgraded to TLS, then handed to
    aiohttp's request handler, to which it forwards everything."""

    def __init__(self, site: BoundedSite) -> None:
        self._site = site
        self._handler: asyncio.Protocol | None = None
        self._counted = False
        self._peer = "?"
        self._opened_s = 0.0
        self._raw: asyncio.Transport | None = None  # the socket's transport (under TLS's, if any)
        # what TLS decrypted between the end of the handshake and the handler taking over
        self._early: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        site = self._site
        self._peer = peer(transport)
        assert isinstance(transport, asyncio.Transport)
        self._raw = transport
        if site.active >= site.limits.max_connections:
            site.limit_log.hit(
                "connections",
                f"refused a connection from {self._peer}: {site.active} open, "
                f"the limit is {site.limits.max_connections}",
            )
            transport.abort()
            return
        site.active += 1
        self._counted = True
        self._opened_s = asyncio.get_running_loop().time()
        if site.ssl_context is None:
            self._serve(transport)
            return
        transport.pause_reading()  # nothing may reach us before the TLS layer is in place
        site.track(asyncio.get_running_loop().create_task(self._start_tls(transport)))

    async def _start_tls(self, raw: asyncio.Transport) -> None:
        site = self._site
        assert site.ssl_context is not None
        try:
            transport = await asyncio.get_running_loop().start_tls(
                raw,
                self,
                site.ssl_context,
                server_side=True,
                ssl_handshake_timeout=site.limits.handshake_timeout_s,
            )
        except (OSError, ConnectionError, TimeoutError) as exc:  # ssl.SSLError is an OSError
            reason = str(exc) or type(exc).__name__
            forget_traceback(exc)
            del exc
            site.limit_log.hit("handshake", f"TLS handshake with {self._peer} failed: {reason}")
            raw.abort()
            release(raw)
            self._release()
            return
        if transport is None:  # closed while handshaking
            self._release()
            return
        self._serve(transport)

    def _serve(self, transport: asyncio.Transport) -> None:
        handler = self._site.new_handler()
        self._handler = handler
        handler.connection_made(transport)
        early, self._early = self._early, []
        for data in early:
            handler.data_received(data)

    def _release(self) -> None:
        if self._counted:
            self._counted = False
            self._site.active -= 1

    # --- forwarded to aiohttp's handler ----------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self._handler is not None:
            self._handler.data_received(data)
        else:
            self._early.append(data)

    def eof_received(self) -> bool | None:
        return self._handler.eof_received() if self._handler is not None else None

    def pause_writing(self) -> None:
        if self._handler is not None:
            self._handler.pause_writing()

    def resume_writing(self) -> None:
        if self._handler is not None:
            self._handler.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        handler, self._handler = self._handler, None
        if handler is not None:
            if getattr(handler, "_request_count", 1) == 0:  # aiohttp's count of request heads
                lived_s = asyncio.get_running_loop().time() - self._opened_s
                if lived_s >= self._site.limits.idle_timeout_s:
                    self._site.limit_log.hit(
                        "request-head",
                        f"closed the connection from {self._peer}: no complete request within "
                        f"{self._site.limits.idle_timeout_s:g} s",
                    )
            handler.connection_lost(exc)
        self._release()
        raw, self._raw = self._raw, None
        if raw is not None:
            release(raw)


class BoundedSite(web.BaseSite):
    """A TCP site whose connections pass through ``_Gate`` (see the module docstring)."""

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        *,
        limits: Limits,
        limit_log: LimitLog,
        ssl_context: ssl.SSLContext | None = None,
        backlog: int = 128,
    ) -> None:
        super().__init__(runner, ssl_context=None, backlog=backlog)  # TLS is the gate's to start
        self._host = host
        self._port = port
        self.ssl_context = ssl_context
        self.limits = limits
        self.limit_log = limit_log
        self.active = 0  # connections holding a slot (handshaking or served)
        self._handshakes: set[asyncio.Task[None]] = set()

    @property
    def name(self) -> str:
        return f"{'https' if self.ssl_context else 'http'}://{self._host}:{self._port}"

    @property
    def address(self) -> tuple[str, int]:
        """(host, port) actually bound (port 0 picks one)."""
        assert self._server is not None
        sockets: list[socket.socket] = list(getattr(self._server, "sockets", ()) or ())
        host, port = sockets[0].getsockname()[:2]
        return str(host), int(port)

    def new_handler(self) -> asyncio.Protocol:
        server = self._runner.server
        assert server is not None
        return server()

    def track(self, task: asyncio.Task[None]) -> None:
        self._handshakes.add(task)
        task.add_done_callback(self._handshakes.discard)

    async def start(self) -> None:
        await super().start()
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _Gate(self), self._host, self._port, backlog=self._backlog
        )

    async def stop(self) -> None:
        for task in list(self._handshakes):
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*self._handshakes, return_exceptions=True)
        await super().stop()


def body_limits(limits: Limits, limit_log: LimitLog) -> typedefs.Middleware:
    """Middleware: read the whole body within ``body_timeout_s`` and ``max_body_bytes`` before the
    handler runs (which then reads it from memory); 408 or 413 with the reason otherwise. The app's
    ``client_max_size`` must be at least that cap. (The extender listener's per-path caps are
    ``extender_wire.Verb.max_body_bytes``.)"""

    @web.middleware
    async def middleware(request: web.Request, handler: typedefs.Handler) -> web.StreamResponse:
        if request.can_read_body:
            peer = request.remote or "?"
            cap = limits.max_body_bytes
            declared = request.content_length
            reason = ""
            status = 0
            if declared is not None and declared > cap:
                status, reason = 413, f"body of {declared} bytes is over the {cap} byte limit"
            else:
                try:
                    async with asyncio.timeout(limits.body_timeout_s):
                        await request.read()
                except TimeoutError:
                    status = 408
                    reason = f"body not received within {limits.body_timeout_s:g} s"
                except web.HTTPRequestEntityTooLarge:
                    status, reason = 413, f"body is over the {cap} byte limit"
                else:
                    if len(await request.read()) > cap:
                        status, reason = 413, f"body is over the {cap} byte limit"
            if status:
                limit_log.hit("body", f"{request.method} {request.path} from {peer}: {reason}")
                response = web.json_response({"Error": reason}, status=status)
                response.force_close()  # the rest of the body is not worth reading
                return response
        return await handler(request)

    return middleware
