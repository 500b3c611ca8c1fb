"""``Connection``: one TCP connection of the extender listener, read with ``httptools``, answered in order.

A complete ``POST /filter`` is decided and answered inside ``data_received``, with no task and no
further turn; ``/bind`` and ``/preempt``, which wait for the API server, run as a task each and
answer when done. One request at a time per connection, in order (kube-scheduler's client does not
pipeline; a client that does is read no further until the answer is written). Garbage is answered
400 and the connection closed. ``Expect: 100-continue`` is answered ``100 Continue`` once the body
is wanted (after the answers to earlier requests), any other expectation 417. ``HEAD`` (like any
method but ``POST``) is 405 with ``Allow: POST``, and its answers carry no body.

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
import logging
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

import httptools

from vgpu_scheduler import listener
from vgpu_scheduler.extender_read import MAX_HEAD_BYTES, Request, RequestReader
from vgpu_scheduler.extender_wire import CONTINUE, AsyncVerb, Reply, encode, encode_unserved

if TYPE_CHECKING:
    from vgpu_scheduler.extender_http import ExtenderServer

log = logging.getLogger(__name__)

# after a refusal, what the caller still sends is read and dropped for this long (the server's
# ``linger_s``) and up to this many bytes (then no longer read), before the close (Go's net/http:
# 500 ms, 256 KiB)
LINGER_S = 0.5
LINGER_BYTES = 256 << 10


class Connection(asyncio.Protocol):
    """One TCP connection: its requests read (``RequestReader``), answered in order, kept alive,
    held to the limits."""

    def __init__(self, server: ExtenderServer) -> None:
        self._server = server
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._reader = RequestReader(
            verbs=server.verbs,
            limits=server.limits,
            limit_log=server.limit_log,
            on_head=self._head_read,
            on_request=self._request_read,
        )
        self._peer = "?"
        self._counted = False
        self._closing = False
        self._queue: deque[Request] = deque()
        self._task: asyncio.Task[Reply] | None = None  # the async verb being answered
        self._paused_reading = False
        self._paused_writing = False
        self._timer: asyncio.TimerHandle | None = None
        self._answered = 0  # requests answered on this connection
        self._parked: Reply | None = None  # a refusal waiting for the answers before it
        self._continue_due = False  # a 100 Continue waiting for the answers before it
        self._linger_bytes = 0  # after a refusal: bytes still read (and dropped) before reading stops

    # --- asyncio.Protocol ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        server = self._server
        self._transport = transport
        self._peer = self._reader.peer = listener.peer(transport)
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
        reader = self._reader
        try:
            reader.feed(data)
        except httptools.HttpParserCallbackError:  # raised by our callbacks: a bug, not the request
            log.exception("extender listener: reading a request from %s failed", self._peer)
            self._fail(500, "internal error reading the request")
            return
        except httptools.HttpParserUpgrade:
            if reader.refused is None and self._queue:
                self._queue.pop()  # the upgrade request itself (llhttp completes it, then stops)
            self._fail(400, "protocol upgrades are not served here")
            return
        except httptools.HttpParserError as exc:
            self._fail(400, f"malformed HTTP request: {exc}")
            return
        if reader.refused is not None:
            self._fail(*reader.refused)
            return
        if reader.head_over_cap():
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
        # one until a compaction): the reader's parser holds our callbacks, the transport a method
        # of itself
        self._reader.close()  # nothing is parsed after this: data_received drops what comes when closing
        if self._transport is not None:
            listener.release(self._transport)

    # --- the reader's calls ----------------------------------------------------------------

    def _head_read(self) -> None:
        """A request's head is complete and within its caps: its body is wanted now (the body
        timer starts), or its ``Expect`` is answered first."""
        if self._reader.expect is not None and not self._expectation_met():
            return  # refused (417), or its 100 Continue (and the body timer) waits its turn
        self._arm(self._server.limits.body_timeout_s, self._body_late)

    def _request_read(self, request: Request) -> None:
        if self._closing:
            return
        self._disarm()
        self._queue.append(request)
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

    def _finished(self, task: asyncio.Task[Reply], request: Request) -> None:
        self._server.tasks.discard(task)
        if task is not self._task:  # the connection went meanwhile
            return
        self._task = None
        if task.cancelled():
            return
        self._answer(task.result(), request)
        self._next()

    def _answer(self, reply: Reply, request: Request) -> None:
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

    def _unserved(self, reply: Reply, request: Request, *, allow: str = "") -> None:
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
        reader = self._reader
        expect, reader.expect = reader.expect, None
        assert expect is not None
        if expect.strip().lower() != b"100-continue":
            text = expect.decode("latin-1")[:64]
            reader.refused = (417, f"Expect: {text!r} is not supported (only 100-continue)")
            return False
        if reader.length == 0 or reader.http_version() == "1.0":  # (1.0: to be ignored)
            return True
        if self._task is not None or self._queue:
            self._continue_due = True
            self._pause_reading()
            return False
        assert self._transport is not None
        self._transport.write(CONTINUE)
        return True

    # --- limits and closing ------------------------------------------------------------------

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
        if self._reader.in_head or self._answered == 0:
            self._server.limit_log.hit(
                "request-head",
                f"closed the connection from {self._peer}: no complete request within "
                f"{self._server.limits.idle_timeout_s:g} s",
            )
        self._close()

    def _body_late(self) -> None:
        self._timer = None
        reason = f"body not received within {self._server.limits.body_timeout_s:g} s"
        reader = self._reader
        self._server.limit_log.hit("body", f"{reader.method} {reader.path} from {self._peer}: {reason}")
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
