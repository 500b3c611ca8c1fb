"""The live dashboard on the Service port: ``GET /ui``, ``GET /ui/state``, ``GET /ui/events``.

* ``/ui``: one static page (``static/dashboard.html``: inline style and script, nothing fetched
  from elsewhere, no build step), served with a Content-Security-Policy that allows only its own
  inline script (by hash) and connections back to this origin.
* ``/ui/state``: ``dashboard.snapshot`` as JSON, for scripts and for a first look with curl.
* ``/ui/events``: Server-Sent Events (``text/event-stream``). Each ``state`` event is a whole
  snapshot: one at connect, then one after each change of what the page shows (``livefeed.Feed``:
  debounced, a bounded queue per client, at most ``MAX_CLIENTS`` streams, 503 beyond). A
  ``: keep-alive`` comment every ``keepalive_s`` without news, which is also how a client that went
  away is noticed (the write fails) and its stream cleaned up. A write the client has not taken
  within ``write_timeout_s`` (it stopped reading but keeps the connection: a stopped process, a
  sleeping laptop behind a port-forward) ends its stream too: it would hold its place forever.
  Small frames never fill the socket buffers, so such a client is not noticed that way: every
  stream therefore ends after ``max_stream_s`` (with a ``retry:`` the browser's EventSource
  reconnects after ``RETRY_MS`` and gets a fresh snapshot; a client that stopped reading does not
  come back, and its place is free again).

Everything is read from memory and nothing is changed: GET only, query strings are ignored. What a
snapshot reads is captured on the event loop (``dashboard.capture``); the snapshot is built and
encoded to JSON in a worker thread, so filters barely wait for it (``bench/dashboard_bench.py``).
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import hashlib
import importlib.resources
import json
import logging
import re
import time
from collections.abc import Callable
from typing import Protocol

from aiohttp import web

from vgpu_scheduler import dashboard, livefeed
from vgpu_scheduler.draviews import DraViews
from vgpu_scheduler.pending import FilterReasons
from vgpu_scheduler.state import ClusterState

log = logging.getLogger(__name__)

MAX_CLIENTS = 16  # event streams at once: each holds one of the Service port's connections
QUEUE_SIZE = 4  # snapshots waiting per slow client (the oldest are dropped: the newest supersedes)
DEBOUNCE_S = 0.25  # a burst of changes within this becomes one event
REFRESH_S = 5.0  # a snapshot is rebuilt at least this often (Lease ages change without an event)
KEEPALIVE_S = 15.0
WRITE_TIMEOUT_S = 60.0  # an event not taken by the client within this ends its stream
MAX_STREAM_S = 120.0  # every stream ends after this long; a reading client reconnects (RETRY_MS)
# a filter's reason stays this long though the pods watch does not show its pod (yet: the filter
# reads the pod from kube-scheduler, which may be ahead of the watch); after that it is pruned
PRUNE_GRACE_S = 60.0
RETRY_MS = 2000  # EventSource reconnects after this long when a stream ends
_VOLATILE = ("at", "generation")  # fields that change without the page showing anything new


def _page() -> bytes:
    return importlib.resources.files("vgpu_scheduler").joinpath("static/dashboard.html").read_bytes()


def content_security_policy(page: bytes) -> str:
    """Only the page's own inline scripts (by sha256) and style; connections to this origin only."""
    hashes = " ".join(
        "'sha256-" + base64.b64encode(hashlib.sha256(script).digest()).decode() + "'"
        for script in re.findall(rb"<script>(.*?)</script>", page, flags=re.DOTALL)
    )
    scripts = hashes or "'none'"
    return (
        f"default-src 'none'; script-src {scripts}; style-src 'unsafe-inline'; "
        "connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    )


@dataclasses.dataclass(frozen=True)
class Frame:
    """One snapshot: the JSON of what it shows (compared between pushes) and the JSON sent."""

    shown: bytes
    data: bytes
    generation: int
    reasons_version: int = 0  # FilterReasons.version when captured


def encode(snap: dashboard.Snapshot) -> Frame:
    """The snapshot's JSON (``data``) and that of all it shows (``shown``: without ``at`` and
    ``generation``), sharing one encoding."""
    shown = json.dumps({k: v for k, v in snap.items() if k not in _VOLATILE}, separators=(",", ":"))
    volatile = json.dumps({"at": snap["at"], "generation": snap["generation"]}, separators=(",", ":"))
    data = volatile[:-1] + "," + shown[1:]  # both are non-empty JSON objects: splice them
    return Frame(shown.encode(), data.encode(), snap["generation"])


def _frame(cap: dashboard.Capture, max_pending: int, reasons_version: int) -> Frame:
    frame = encode(dashboard.build(cap, max_pending=max_pending))
    return dataclasses.replace(frame, reasons_version=reasons_version)


class Dashboard:
    """The dashboard of one ``ClusterState``; sets the ``on_change`` of the state and of the
    reasons to its feed's poke."""

    def __init__(
        self,
        state: ClusterState,
        reasons: FilterReasons,
        *,
        clock: Callable[[], float] = time.time,
        max_clients: int = MAX_CLIENTS,
        queue_size: int = QUEUE_SIZE,
        debounce_s: float = DEBOUNCE_S,
        refresh_s: float = REFRESH_S,
        keepalive_s: float = KEEPALIVE_S,
        write_timeout_s: float = WRITE_TIMEOUT_S,
        max_stream_s: float = MAX_STREAM_S,
        max_pending: int = dashboard.DEFAULT_MAX_PENDING,
        preemptions: PreemptionLog | None = None,
        dra: DraViews | None = None,
    ) -> None:
        """``preemptions``: the own preemption path's decisions (``selfpreempt.SelfPreemption``);
        ``dra``: the DRA mode's slices and claims (``draviews``)."""
        self.preemptions = preemptions
        self.dra = dra
        self.state = state
        self.reasons = reasons
        self._clock = clock
        self.keepalive_s = keepalive_s
        self.write_timeout_s = write_timeout_s
        self.max_stream_s = max_stream_s
        self._max_pending = max_pending
        self._refresh_s = refresh_s
        self._built: tuple[Frame, float] | None = None  # the last frame and when it was built
        self._building = asyncio.Lock()
        self.page = _page()
        self.csp = content_security_policy(self.page)
        self.feed: livefeed.Feed[Frame] = livefeed.Feed(
            "dashboard",
            self.frame,
            same=lambda a, b: a.shown == b.shown,
            max_subscribers=max_clients,
            queue_size=queue_size,
            debounce_s=debounce_s,
            refresh_s=refresh_s,
        )
        state.on_change = self.feed.poke
        reasons.on_change = self.feed.poke
        if dra is not None:
            dra.on_change = self.feed.poke

    def capture(self) -> dashboard.Capture:
        """What the snapshot now reads; drops expired decisions and the reasons of pods that are
        gone first (on the event loop): those the pods watch does not show, older than
        ``PRUNE_GRACE_S`` (retries.py reads the reasons too)."""
        now = self._clock()
        self.state.expire()
        self.reasons.prune(self.state.pods, failed_before=now - PRUNE_GRACE_S)
        rows = self.preemptions.rows() if self.preemptions is not None else ()
        dra = self.dra.capture() if self.dra is not None else None
        return dashboard.capture(self.state, self.reasons, now=now, preemptions=rows, dra=dra)

    def _version(self) -> int:
        """What the frame depends on besides the state: the reasons, the preemption decisions, the
        DRA objects."""
        return (
            self.reasons.version
            + (self.preemptions.version if self.preemptions is not None else 0)
            + (self.dra.generation if self.dra is not None else 0)
        )

    async def frame(self) -> Frame:
        """The frame now: the last one while neither the state nor the reasons changed and it is
        younger than ``refresh_s``; one build at a time (requests arriving meanwhile wait for it
        and share it)."""
        async with self._building:
            now = self._clock()
            last = self._built
            if (
                last is not None
                and (last[0].generation, last[0].reasons_version) == (self.state.generation, self._version())
                and now - last[1] < self._refresh_s
            ):
                return last[0]
            cap = self.capture()
            frame = await asyncio.to_thread(_frame, cap, self._max_pending, self._version())
            self._built = (frame, now)
            return frame

    async def aclose(self) -> None:
        """End every event stream (the app's shutdown: before aiohttp waits for handlers)."""
        await self.feed.aclose()


class PreemptionLog(Protocol):
    """The own preemption path's decisions, as the dashboard reads them."""

    version: int

    def rows(self) -> list[dashboard.PreemptionRow]: ...


DASHBOARD = web.AppKey("dashboard", Dashboard)

_COMMON_HEADERS = {
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


async def page(request: web.Request) -> web.Response:
    board = request.app[DASHBOARD]
    return web.Response(
        body=board.page,
        content_type="text/html",
        charset="utf-8",
        headers={**_COMMON_HEADERS, "Content-Security-Policy": board.csp},
    )


async def state(request: web.Request) -> web.Response:
    frame = await request.app[DASHBOARD].frame()
    return web.Response(
        body=frame.data, content_type="application/json", charset="utf-8", headers=_COMMON_HEADERS
    )


def _event(frame: Frame) -> bytes:
    return b"id: %d\nevent: state\ndata: %s\n\n" % (frame.generation, frame.data)


class _Stalled(Exception):
    """The client did not take a write within ``write_timeout_s``: it stopped reading."""


async def _write(response: web.StreamResponse, data: bytes, timeout_s: float) -> None:
    """``response.write`` waits while the client's socket buffers are full; ``_Stalled`` after
    ``timeout_s`` of that."""
    try:
        async with asyncio.timeout(timeout_s):
            await response.write(data)
    except TimeoutError:
        raise _Stalled from None


async def events(request: web.Request) -> web.StreamResponse:
    board = request.app[DASHBOARD]
    try:
        if len(board.feed) >= board.feed.max_subscribers:  # before building anything
            raise livefeed.FeedFull(f"{board.feed.max_subscribers} clients are connected already")
        first = await board.frame()
        subscriber = board.feed.subscribe(first)
    except livefeed.FeedFull as exc:
        return web.Response(status=503, text=f"{exc}; try again later", headers={"Retry-After": "10"})
    response = web.StreamResponse(
        headers={
            **_COMMON_HEADERS,
            "Content-Type": "text/event-stream",
            "X-Accel-Buffering": "no",  # proxies: pass each event on at once
        }
    )
    loop = asyncio.get_running_loop()
    ends_at = loop.time() + board.max_stream_s
    try:
        await response.prepare(request)
        await _write(response, b"retry: %d\n\n" % RETRY_MS + _event(first), board.write_timeout_s)
        while (left_s := ends_at - loop.time()) > 0:
            try:
                frame = await subscriber.next(min(board.keepalive_s, left_s))
            except TimeoutError:
                if loop.time() < ends_at:
                    await _write(response, b": keep-alive\n\n", board.write_timeout_s)
                continue
            if frame is None:  # the server is shutting down
                break
            await _write(response, _event(frame), board.write_timeout_s)
        else:  # its time is up: a reading client comes back (retry:), one that stopped reading does not
            if request.transport is not None and request.transport.get_write_buffer_size() > 0:
                request.transport.abort()  # it has not taken what was sent: finishing would wait on it
    except ConnectionError:  # the client went away (aiohttp's ClientConnectionResetError is one)
        log.debug("dashboard event stream to %s closed by the client", request.remote)
    except _Stalled:
        log.info(
            "dashboard event stream to %s: an event waited %g s for the client to read it; closing it",
            request.remote,
            board.write_timeout_s,
        )
        if request.transport is not None:
            request.transport.abort()  # else finishing the response would wait on it again
    finally:
        await board.feed.unsubscribe(subscriber)
    return response
