"""The API server's watch HTTP stream: ``GET ...?watch=true`` as streaming JSON lines.

One ``{"type","object"}`` line per event, written in one chunk for all the events already queued;
each store event is serialised once for all its watchers, as the watch cache does (the last
``ENCODED_EVENTS_KEPT``). The stream ends after ``timeoutSeconds`` (default
``DEFAULT_WATCH_TIMEOUT_S``), when the store closes the watcher, or when the client goes away. A
resourceVersion that is too old gets an ``ERROR`` event carrying a 410 Status, as the real server
sends it (or an HTTP 410 with ``gone_as_http=True``). While some open watch allows bookmarks, the
store emits BOOKMARKs every ``bookmark_interval_s``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
from collections.abc import Callable

from aiohttp import web

from vgpu.core import errors
from vgpu.kube.port import JsonObj, WatchEvent
from vgpu.localcluster import validation
from vgpu.localcluster.apipaths import Target, query_flag, status_body
from vgpu.localcluster.store import Store
from vgpu.localcluster.watcher import Watcher

log = logging.getLogger(__name__)

DEFAULT_WATCH_TIMEOUT_S = 1800.0
# (objects, resourceVersion, with column definitions) -> their Table
TableOf = Callable[[list[JsonObj], str, bool], JsonObj]
ENCODED_EVENTS_KEPT = 1024


class WatchStreams:
    """The open watch streams of one API server, their shared encodings and the bookmark timer."""

    def __init__(self, store: Store, *, bookmark_interval_s: float, gone_as_http: bool) -> None:
        self._store = store
        self._bookmark_interval_s = bookmark_interval_s
        self._gone_as_http = gone_as_http
        self._watchers: set[Watcher] = set()
        # each store event serialised once for all its watchers, as the watch cache does (bounded)
        self._lines: collections.OrderedDict[int, tuple[WatchEvent, bytes]] = collections.OrderedDict()
        self._bookmarks: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start the bookmark timer."""
        self._bookmarks = asyncio.create_task(self._bookmark_loop(), name="apiserver-bookmarks")

    async def stop(self) -> None:
        """Stop the bookmark timer and end every open stream."""
        if self._bookmarks is not None:
            self._bookmarks.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._bookmarks
            self._bookmarks = None
        for w in list(self._watchers):
            w.close()

    async def _bookmark_loop(self) -> None:
        while True:
            await asyncio.sleep(self._bookmark_interval_s)
            for w in list(self._watchers):
                if w.allow_bookmarks:
                    self._store.emit_bookmarks()
                    break

    def _encoded(self, event: WatchEvent) -> bytes:
        """``event`` as one watch line; the same store event reaches every watcher as one object."""
        cached = self._lines.get(id(event))
        if cached is not None and cached[0] is event:
            return cached[1]
        line = json.dumps({"type": event.type, "object": event.object}, separators=(",", ":")).encode()
        self._lines[id(event)] = (event, line + b"\n")
        if len(self._lines) > ENCODED_EVENTS_KEPT:
            self._lines.popitem(last=False)
        return line + b"\n"

    async def serve(
        self, request: web.Request, t: Target, *, as_table: TableOf | None = None
    ) -> web.StreamResponse:
        """Answer a watch request on ``t`` with a stream that lasts until it ends (see the module).
        With ``as_table`` (``kubectl get -w``) each object is sent as the one-row Table it makes, the
        column definitions in the first only."""
        q = request.query
        try:
            timeout_s = float(q.get("timeoutSeconds", DEFAULT_WATCH_TIMEOUT_S))
        except ValueError:
            raise validation.bad_request(f"invalid timeoutSeconds {q.get('timeoutSeconds')!r}") from None
        response = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        try:
            watcher = self._store.watch(
                t.info.plural,
                resource_version=q.get("resourceVersion"),
                namespace=t.namespace,
                label_selector=q.get("labelSelector"),
                field_selector=q.get("fieldSelector"),
                allow_bookmarks=query_flag(q.get("allowWatchBookmarks")),
            )
        except errors.Gone as exc:
            if self._gone_as_http:
                raise
            await response.prepare(request)
            error = {"type": "ERROR", "object": status_body(410, str(exc), reason="Expired")}
            await response.write(json.dumps(error).encode() + b"\n")
            await response.write_eof()
            return response
        self._watchers.add(watcher)
        try:
            response.enable_chunked_encoding()
            await response.prepare(request)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + max(0.0, timeout_s)
            sent = 0
            while True:
                event = await watcher.next_event(timeout_s=max(0.0, deadline - loop.time()), copy=False)
                if event is None:
                    break
                batch = [event]
                while (ready := watcher.pop_ready()) is not None:  # one write for all that are queued
                    batch.append(ready)
                if as_table is None:
                    lines = [self._encoded(e) for e in batch]
                else:
                    lines = []
                    for e in batch:
                        lines.append(_table_line(e, as_table, first=sent == 0))
                        sent += 1
                await response.write(b"".join(lines))
            await response.write_eof()
        except ConnectionResetError:  # the client went away (a watcher process stopped): not an error
            log.debug("watch on %s ended by the client", t.info.plural)
        except asyncio.CancelledError:
            log.debug("watch on %s ended by the client", t.info.plural)
            raise
        finally:
            watcher.close()
            self._watchers.discard(watcher)
        return response


def _table_line(event: WatchEvent, as_table: TableOf, *, first: bool) -> bytes:
    """One watch line whose object is a Table (BOOKMARK and ERROR objects are sent as they are)."""
    obj = event.object
    if event.type in ("ADDED", "MODIFIED", "DELETED"):
        obj = as_table([obj], str((obj.get("metadata") or {}).get("resourceVersion", "")), first)
    return json.dumps({"type": event.type, "object": obj}, separators=(",", ":")).encode() + b"\n"
