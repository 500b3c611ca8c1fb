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
(llhttp, the parser behind uvicorn): a complete ``POST /filter`` is decided and answered inside
``data_received``, with no task and no further turn; ``/bind`` and ``/preempt``, which wait for
the API server, run as a task each and answer when done. One request at a time per connection,
in order (kube-scheduler's client does not pipeline; a client that does is read no further until
the answer is written). Garbage is answered 400 and the connection closed.

The limits are those of the other listener (``listener.Limits``): a cap on connections (refused at
once beyond it); a request head within ``idle_timeout_s`` of the connection opening or of the last
answer, and of at most ``MAX_HEAD_BYTES`` (431); a body within ``body_timeout_s`` (408) and of at
most the path's byte cap (413, before any of it is buffered past the cap). Each refusal closes the
connection. A caller that hangs up cancels its ``/bind``
(``binder.py``: a bind kube-scheduler no longer waits for must not bind the pod later).
"""

from __future__ import annotations

import asyncio
import http
import json
import logging
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import cast

import httptools

from vgpu_scheduler import listener

log = logging.getLogger(__name__)

# a request head (request line and headers) larger than this is refused (431): llhttp buffers a
# header line whole, however long; kube-scheduler's heads are a few hundred bytes
MAX_HEAD_BYTES = 64 << 10


@dataclass(frozen=True)
class Reply:
    """An answer: HTTP status and the JSON body."""

    status: int
    body: object


InlineVerb = Callable[[bytes], Reply]  # answered in the turn that read the request
AsyncVerb = Callable[[bytes], Awaitable[Reply]]  # a task of its own


@dataclass(frozen=True)
class Verb:
    """What ``POST <path>`` does, and the largest body it takes (``None``: the listener's cap)."""

    call: InlineVerb | AsyncVerb
    inline: bool
    max_body_bytes: int | None = None


@dataclass
class _Request:
    method: str
    path: str
    body: bytes
    keep_alive: bool


def encode(reply: Reply, *, close: bool) -> bytes:
    """The whole HTTP/1.1 response for ``reply``."""
    body = json.dumps(reply.body, separators=(",", ":")).encode()
    try:
        phrase = http.HTTPStatus(reply.status).phrase
    except ValueError:
        phrase = ""
    connection = "Connection: close\r\n" if close else ""
    head = (
        f"HTTP/1.1 {reply.status} {phrase}\r\n"
        "Content-Type: application/json; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\n{connection}\r\n"
    )
    return head.encode("latin-1") + body


class _Connection(asyncio.Protocol):
    """One TCP connection: parse, answer in order, keep alive, hold to the limits."""

    def __init__(self, server: ExtenderServer) -> None:
        self._server = server
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpRequestParser(self)
        self._peer = "?"
        self._counted = False
        self._closing = False
        self._queue: deque[_Request] = deque()
        self._task: asyncio.Task[Reply] | None = None  # the async verb being answered
        self._paused_reading = False
        self._paused_writing = False
        self._timer: asyncio.TimerHandle | None = None
        self._answered = 0  # requests answered on this connection
        # the request being read
        self._url = b""
        self._method = ""
        self._path = ""  # the URL's path, once the head is complete
        self._in_head = False
        self._reading_body = False
        self._head_bytes = 0  # bytes received since the last head was complete
        self._body: list[bytes] = []
        self._body_bytes = 0
        self._cap = 0
        self._length: int | None = None  # its Content-Length
        self._refused: str | None = None  # why it was refused (413) while being read

    # --- asyncio.Protocol ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        server = self._server
        self._transport = transport
        self._peer = listener.peer(transport)
        if server.active >= server.limits.max_connections:
            server.limit_log.hit(
                "connections",
                f"refused a connection from {self._peer}: {server.active} open, "
                f"the limit is {server.limits.max_connections}",
            )
            self._closing = True
            transport.abort()
            return
        server.active += 1
        server.accepted += 1
        server.connections.add(self)
        self._counted = True  # (asyncio sets TCP_NODELAY: each answer is one write, sent at once)
        self._arm(self._server.limits.idle_timeout_s, self._head_late)

    def data_received(self, data: bytes) -> None:
        if self._closing:
            return
        if not self._reading_body:
            self._head_bytes += len(data)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserCallbackError:  # raised by our callbacks: a bug, not the request
            log.exception("extender listener: reading a request from %s failed", self._peer)
            self._fail(500, "internal error reading the request")
            return
        except httptools.HttpParserUpgrade:
            self._fail(400, "protocol upgrades are not served here")
            return
        except httptools.HttpParserError as exc:
            self._fail(400, f"malformed HTTP request: {exc}")
            return
        if self._refused is not None:
            self._fail(413, self._refused)
            return
        if not self._reading_body and self._head_bytes > MAX_HEAD_BYTES:
            self._server.limit_log.hit(
                "request-head", f"request head from {self._peer} over {MAX_HEAD_BYTES} bytes; closed"
            )
            self._fail(431, f"request head over {MAX_HEAD_BYTES} bytes")
            return
        self._next()

    def eof_received(self) -> bool | None:
        # kube-scheduler's client never half-closes: its end of the stream is the caller leaving
        # (connection_lost follows, and cancels what it was waiting for)
        return None

    def pause_writing(self) -> None:
        self._paused_writing = True
        self._pause_reading()

    def resume_writing(self) -> None:
        self._paused_writing = False
        if self._task is None and not self._queue:
            self._resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        self._disarm()
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()  # the caller left: a bind it no longer waits for must not bind later
        self._queue.clear()
        if self._counted:
            self._counted = False
            self._server.active -= 1
            self._server.connections.discard(self)

    # --- httptools callbacks ---------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._url = b""
        self._in_head = True
        self._body = []
        self._body_bytes = 0
        self._length = None

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"content-length":  # llhttp refused it already unless it is digits
            self._length = int(value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._reading_body = True
        self._head_bytes = 0
        self._method = self._parser.get_method().decode("latin-1")
        self._path = self._url_path()
        verb = self._server.verbs.get(self._path)
        limits = self._server.limits
        self._cap = (
            limits.max_body_bytes if verb is None or verb.max_body_bytes is None else verb.max_body_bytes
        )
        declared = self._length
        if declared is not None and declared > self._cap:
            self._refuse(f"body of {declared} bytes is over the {self._cap} byte limit")
            return
        self._arm(limits.body_timeout_s, self._body_late)

    def on_body(self, body: bytes) -> None:
        if self._refused is not None:
            return
        self._body_bytes += len(body)
        if self._body_bytes > self._cap:
            self._refuse(f"body is over the {self._cap} byte limit")
            return
        self._body.append(body)

    def on_message_complete(self) -> None:
        self._reading_body = False
        if self._refused is not None or self._closing:
            return
        self._disarm()
        keep_alive = self._parser.should_keep_alive()
        self._queue.append(_Request(self._method, self._path, b"".join(self._body), keep_alive))
        self._body = []
        if self._task is not None or len(self._queue) > 1:
            self._pause_reading()  # one request at a time: the next waits in the kernel

    # --- answering -------------------------------------------------------------------------

    def _next(self) -> None:
        """Answer the queued requests in order: inline verbs now, an async one as a task."""
        while self._queue and self._task is None and not self._closing:
            request = self._queue.popleft()
            verb = self._server.verbs.get(request.path)
            if verb is None:  # (not counted: an unknown path's name is the caller's)
                self._answer(Reply(404, {"Error": f"no such path: {request.path}"}), request)
                continue
            self._server.requests[(request.path, self._answered == 0)] += 1
            if request.method != "POST":
                self._answer(
                    Reply(405, {"Error": f"{request.method} not allowed on {request.path}"}), request
                )
                continue
            if verb.inline:
                self._answer(self._server.call_inline(verb, request.body), request)
                continue
            task = self._loop.create_task(self._server.call_async(cast(AsyncVerb, verb.call), request.body))
            self._task = task
            self._server.tasks.add(task)
            task.add_done_callback(lambda t, r=request: self._finished(t, r))  # type: ignore[misc]
        if not self._queue and self._task is None and not self._closing and not self._paused_writing:
            self._resume_reading()

    def _finished(self, task: asyncio.Task[Reply], request: _Request) -> None:
        self._server.tasks.discard(task)
        if task is not self._task:  # the connection went meanwhile
            return
        self._task = None
        if task.cancelled():
            return
        self._answer(task.result(), request)
        self._next()

    def _answer(self, reply: Reply, request: _Request) -> None:
        if self._transport is None or self._closing:
            return
        close = not request.keep_alive or self._server.stopping
        try:
            data = encode(reply, close=close)
        except (TypeError, ValueError) as exc:  # a bug in a verb: say so rather than leave the caller waiting
            log.exception("extender: the answer to %s %s could not be encoded", request.method, request.path)
            data = encode(Reply(500, {"Error": f"internal error: {exc}"}), close=close)
        self._transport.write(data)
        self._answered += 1
        if close:
            self._close()
        elif not self._queue:
            self._arm(self._server.limits.idle_timeout_s, self._head_late)

    # --- limits and closing ------------------------------------------------------------------

    def _refuse(self, reason: str) -> None:
        self._server.limit_log.hit("body", f"{self._method} {self._path} from {self._peer}: {reason}")
        self._refused = reason

    def _fail(self, status: int, reason: str) -> None:
        """Answer ``status`` with ``reason`` and close: what follows on this connection is not read."""
        if self._transport is not None and not self._closing:
            self._transport.write(encode(Reply(status, {"Error": reason}), close=True))
        self._close()

    def _head_late(self) -> None:
        self._timer = None
        if self._in_head or self._answered == 0:
            self._server.limit_log.hit(
                "request-head",
                f"closed the connection from {self._peer}: no complete request within "
                f"{self._server.limits.idle_timeout_s:g} s",
            )
        self._close()

    def _body_late(self) -> None:
        self._timer = None
        reason = f"body not received within {self._server.limits.body_timeout_s:g} s"
        self._server.limit_log.hit("body", f"{self._method} {self._path} from {self._peer}: {reason}")
        self._fail(408, reason)

    def _arm(self, delay_s: float, callback: Callable[[], None]) -> None:
        self._disarm()
        self._timer = self._loop.call_later(delay_s, callback)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _pause_reading(self) -> None:
        if not self._paused_reading and self._transport is not None and not self._closing:
            self._paused_reading = True
            self._transport.pause_reading()

    def _resume_reading(self) -> None:
        if self._paused_reading and self._transport is not None and not self._closing:
            self._paused_reading = False
            self._transport.resume_reading()

    def _close(self) -> None:
        self._closing = True
        self._disarm()
        if self._transport is not None:
            self._transport.close()

    def close_when_idle(self) -> None:
        """At shutdown: close now unless a request is being answered (it closes after)."""
        if self._task is None and not self._queue:
            self._close()

    def abort(self) -> None:
        """At shutdown, after the answers under way: drop the connection unless it is closing."""
        if self._closing:
            return
        self._closing = True
        if self._transport is not None:
            self._transport.abort()

    def _url_path(self) -> str:
        try:
            return httptools.parse_url(self._url).path.decode("latin-1") if self._url else ""
        except httptools.HttpParserInvalidURLError:
            return "?"


class ExtenderServer:
    """The extender's verbs on one TCP listener (see the module docstring)."""

    def __init__(
        self,
        verbs: Mapping[str, Verb],
        *,
        limits: listener.Limits,
        limit_log: listener.LimitLog,
    ) -> None:
        self.verbs = dict(verbs)
        self.limits = limits
        self.limit_log = limit_log
        self.active = 0  # connections holding a slot
        self.accepted = 0  # connections accepted so far (refused ones apart)
        # requests to a verb so far, by path and whether each was the first on its connection:
        # kube-scheduler's client keeps two idle connections, so many of its calls dial
        self.requests: Counter[tuple[str, bool]] = Counter()
        self.connections: set[_Connection] = set()
        self.tasks: set[asyncio.Task[Reply]] = set()
        self.stopping = False
        self._server: asyncio.Server | None = None

    async def start(self, host: str, port: int, *, backlog: int = 128) -> str:
        """Listen on ``host:port`` (0: a free port); returns ``host:port`` as bound."""
        self.stopping = False
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Connection(self), host, port, backlog=backlog)
        bound_host, bound_port = self._server.sockets[0].getsockname()[:2]
        return f"{bound_host}:{bound_port}"

    async def stop(self, *, timeout_s: float) -> None:
        """Stop listening, let answers under way finish for ``timeout_s``, then cancel them."""
        self.stopping = True
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            conn.close_when_idle()
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
