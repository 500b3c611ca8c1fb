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
the answer is written). Garbage is answered 400 and the connection closed. ``Expect: 100-continue``
is answered ``100 Continue`` once the body is wanted (after the answers to earlier requests), any
other expectation 417. ``HEAD`` (like any method but ``POST``) is 405 with ``Allow: POST``, and its
answers carry no body.

The limits are those of the other listener (``listener.Limits``): a cap on connections (refused at
once beyond it); a request head within ``idle_timeout_s`` of the connection opening or of the last
answer, and of at most ``MAX_HEAD_BYTES`` (431); a body within ``body_timeout_s`` (408) and of at
most the path's byte cap (413, before any of it is buffered past the cap). Each refusal closes the
connection, after the answers to the requests before it (a refusal waits for a ``/bind`` under
way, and never cancels it): the refusal is written, our side of the stream ended (FIN), and what
the caller still sends is read and dropped for up to ``LINGER_S`` and ``LINGER_BYTES`` before the
socket is closed, as Go's server does; closing with its request bytes unread would make the
kernel reset the connection, and a caller still writing its body would get "connection reset by
peer" instead of the answer. A caller that hangs up cancels its ``/bind``
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
# after a refusal, what the caller still sends is read and dropped for this long (the server's
# ``linger_s``) and up to this many bytes (then no longer read), before the close (Go's net/http:
# 500 ms, 256 KiB)
LINGER_S = 0.5
LINGER_BYTES = 256 << 10

CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
# one encoder for every answer (json.dumps with options builds one per call); no NaN or Infinity,
# which are not JSON: a verb that returns one answers 500 rather than a body Go cannot decode
_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)


@dataclass(frozen=True)
class RawJson:
    """A body encoded already: a verb with a large answer builds its text in slices of its own
    (``/preempt``), where encoding it whole would hold the loop for one long step."""

    data: bytes


@dataclass(frozen=True)
class Reply:
    """An answer: HTTP status and the JSON body (a value to encode, or ``RawJson``)."""

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
    given = reply.body
    body = given.data if type(given) is RawJson else _ENCODER.encode(given).encode()
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


def encode_unserved(reply: Reply, *, close: bool, head: bool, allow: str = "") -> bytes:
    """A 404 or 405 (off the hot path): with ``Allow`` when given, and without the body for a
    ``HEAD`` request (RFC 9110 9.3.2: the ``Content-Length`` says what a GET would have had)."""
    data = encode(reply, close=close)
    if allow:
        data = data.replace(b"\r\n", f"\r\nAllow: {allow}\r\n".encode("latin-1"), 1)
    return data[: data.index(b"\r\n\r\n") + 4] if head else data


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
        self._parked: Reply | None = None  # a refusal waiting for the answers before it
        self._continue_due = False  # a 100 Continue waiting for the answers before it
        self._linger_bytes = 0  # after a refusal: bytes still read (and dropped) before reading stops
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
        self._expect: bytes | None = None  # its Expect header
        self._refused: tuple[int, str] | None = None  # refused (413, 417) while being read, and why

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
        if self._closing:  # lingering after a refusal: dropped, and no longer read past the bound
            self._linger_bytes -= len(data)
            if self._linger_bytes <= 0 and self._transport is not None:
                self._transport.pause_reading()
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
            if self._refused is None and self._queue:
                self._queue.pop()  # the upgrade request itself (llhttp completes it, then stops)
            self._fail(400, "protocol upgrades are not served here")
            return
        except httptools.HttpParserError as exc:
            self._fail(400, f"malformed HTTP request: {exc}")
            return
        if self._refused is not None:
            self._fail(*self._refused)
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
        # (connection_lost follows, and cancels what it was waiting for); after a refusal, the
        # caller has sent all it had: the linger is over
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
        else:
            self._server.lingering.pop(self, None)
        # no reference cycle outlives the connection (listener.py: the collector may not look for
        # one until a compaction): the parser holds our callbacks, the transport a method of itself
        del self._parser  # nothing is parsed after this: data_received drops what comes when closing
        if self._transport is not None:
            listener.release(self._transport)

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
        lowered = name.lower()
        if lowered == b"content-length":  # llhttp refused it already unless it is digits
            self._length = int(value)
        elif lowered == b"expect":
            self._expect = value

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
        if self._expect is not None and not self._expectation_met():
            return  # refused (417), or its 100 Continue (and the body timer) waits its turn
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
            self._continue_due = False  # its body came without it: no 100 Continue to send
            self._pause_reading()  # one request at a time: the next waits in the kernel

    # --- answering -------------------------------------------------------------------------

    def _next(self) -> None:
        """Answer the queued requests in order: inline verbs now, an async one as a task."""
        while self._queue and self._task is None and not self._closing:
            request = self._queue.popleft()
            verb = self._server.verbs.get(request.path)
            if verb is None:  # (not counted: an unknown path's name is the caller's)
                self._unserved(Reply(404, {"Error": f"no such path: {request.path}"}), request)
                continue
            self._server.requests[(request.path, self._answered == 0)] += 1
            if request.method != "POST":
                reply = Reply(405, {"Error": f"{request.method} not allowed on {request.path}"})
                self._unserved(reply, request, allow="POST")
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

    def _unserved(self, reply: Reply, request: _Request, *, allow: str = "") -> None:
        """``_answer`` for a 404 or 405 (its own copy, to keep ``_answer`` as it is for /filter)."""
        if self._transport is None or self._closing:
            return
        close = not request.keep_alive or self._server.stopping
        self._transport.write(encode_unserved(reply, close=close, head=request.method == "HEAD", allow=allow))
        self._answered += 1
        if close:
            self._close()
        elif not self._queue:
            self._arm(self._server.limits.idle_timeout_s, self._head_late)

    def _expectation_met(self) -> bool:
        """The request's ``Expect`` (RFC 9110 10.1.1): ``100 Continue`` now, when nothing is before
        it; later, from ``_resume_reading``, when answers are; 417 for other expectations. Whether
        the body timer starts now."""
        expect, self._expect = self._expect, None
        assert expect is not None
        if expect.strip().lower() != b"100-continue":
            text = expect.decode("latin-1")[:64]
            self._refused = (417, f"Expect: {text!r} is not supported (only 100-continue)")
            return False
        if self._length == 0 or self._parser.get_http_version() == "1.0":  # (1.0: to be ignored)
            return True
        if self._task is not None or self._queue:
            self._continue_due = True
            self._pause_reading()
            return False
        assert self._transport is not None
        self._transport.write(CONTINUE)
        return True

    # --- limits and closing ------------------------------------------------------------------

    def _refuse(self, reason: str) -> None:
        self._server.limit_log.hit("body", f"{self._method} {self._path} from {self._peer}: {reason}")
        self._refused = (413, reason)

    def _fail(self, status: int, reason: str) -> None:
        """Refuse with ``status`` and ``reason``, then close: nothing more on this connection is
        parsed. The answers to the requests before it (queued, or a verb under way) go first: the
        refusal is parked, reading stops, and ``_resume_reading`` sends it once they are out."""
        if self._closing:
            self._close()
            return
        reply = Reply(status, {"Error": reason})
        if self._task is None and not self._queue:
            self._refuse_and_linger(reply)
            return
        self._parked = reply
        self._disarm()
        self._pause_reading()
        self._next()

    def _refuse_and_linger(self, reply: Reply) -> None:
        """Write the refusal, end our side of the stream, and drop what the caller still sends for
        ``linger_s`` (and ``LINGER_BYTES``) before closing: a close with its bytes unread would make
        the kernel reset the connection, and the caller could lose the answer."""
        self._closing = True
        self._parked = None
        self._disarm()
        transport = self._transport
        if transport is None:
            return
        transport.write(encode(reply, close=True))
        server = self._server
        if server.stopping or not transport.can_write_eof():
            transport.close()
            return
        transport.write_eof()
        # a lingering connection is answered: it gives back its slot; at most max_connections
        # linger, the oldest (whose caller has had the longest to read its answer) closed first
        if self._counted:
            self._counted = False
            server.active -= 1
            server.connections.discard(self)
        lingering = server.lingering
        if len(lingering) >= server.limits.max_connections:
            oldest = next(iter(lingering))
            del lingering[oldest]
            oldest.end_linger()
        lingering[self] = None
        self._linger_bytes = LINGER_BYTES
        if self._paused_reading:
            self._paused_reading = False
            transport.resume_reading()
        self._timer = self._loop.call_later(server.linger_s, self.end_linger)

    def end_linger(self) -> None:
        """Close a refused connection, what was not sent by now included (a caller that has not
        read its answer by now holds no slot, and must not hold the socket either)."""
        self._disarm()
        if self._transport is not None:
            self._transport.abort()

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
        """Read on, once the answers before the next request are out; a refusal or a 100 Continue
        parked for them goes now."""
        if self._paused_reading and self._transport is not None and not self._closing:
            if self._parked is not None:
                self._refuse_and_linger(self._parked)
                return
            self._paused_reading = False
            self._transport.resume_reading()
            if self._continue_due:
                self._continue_due = False
                self._transport.write(CONTINUE)
                self._arm(self._server.limits.body_timeout_s, self._body_late)

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
        self.connections: set[_Connection] = set()
        # refused connections dropping what their callers still send, oldest first
        self.lingering: dict[_Connection, None] = {}
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
