"""``EventLog``: the store's resourceVersion counter, its bounded history of events and watch delivery.

- one global, increasing ``resourceVersion`` (an int rendered as a string): ``next_rv`` gives the
  version the next write stamps, ``commit`` records that write's event;
- the history keeps the last ``history_size`` events; a watch from a resourceVersion it no longer
  covers is ``Gone`` (410 Expired); ``""``/``"0"`` starts with synthetic ADDED events for what exists;
- every event goes to the open watchers of its kind. A watch filtered by selectors sees an object
  that starts or stops matching as ADDED or DELETED, as the real watch cache does; BOOKMARKs go to
  watchers that asked for them (``emit_bookmarks``).

Stored objects are never mutated in place, so the history holds them (and the object before a
MODIFIED) by reference.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping

from vgpu.core import errors
from vgpu.kube.port import JsonObj, WatchEvent
from vgpu.localcluster import selectors, validation
from vgpu.localcluster.kinds import KindInfo
from vgpu.localcluster.watcher import Watcher


class EventLog:
    """The resourceVersion, the event history and the open watches of one store."""

    def __init__(self, *, history_size: int, watch_queue_size: int) -> None:
        self._rv = 0
        # (rv, kind, event, the object before a MODIFIED)
        self._history: collections.deque[tuple[int, str, WatchEvent, JsonObj | None]] = collections.deque()
        self._history_size = history_size
        self._floor = 0  # every event with rv > floor is still in the history
        self._watchers: set[Watcher] = set()
        self._watch_queue_size = watch_queue_size

    @property
    def resource_version(self) -> str:
        """The current global resourceVersion."""
        return str(self._rv)

    def next_rv(self) -> str:
        """Advance the global resourceVersion and return it (for the write about to be committed)."""
        self._rv += 1
        return str(self._rv)

    def commit(self, info: KindInfo, event_type: str, obj: JsonObj, old: JsonObj | None) -> None:
        """Record one event in the history and fan it out to matching watchers."""
        event = WatchEvent(event_type, obj)  # type: ignore[arg-type]
        self._history.append((self._rv, info.plural, event, old))
        while len(self._history) > self._history_size:
            self._floor = self._history.popleft()[0]
        for w in list(self._watchers):
            if w.info is info:
                self._deliver(w, event, old)

    @staticmethod
    def _deliver(w: Watcher, event: WatchEvent, old: JsonObj | None) -> None:
        now = w.matches(event.object)
        before = old is not None and w.matches(old)
        if event.type == "MODIFIED" and now != before:
            w.push(WatchEvent("ADDED" if now else "DELETED", event.object))
        elif now:
            w.push(event)

    def watch(
        self,
        info: KindInfo,
        existing: Mapping[tuple[str, str], JsonObj],
        *,
        resource_version: str | None = None,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        allow_bookmarks: bool = False,
    ) -> Watcher:
        """Start a watch on ``info``'s kind, whose stored objects are ``existing``. ``None``, ``""``
        or ``"0"``: ADDED for every current match, then changes; otherwise changes after
        ``resource_version``, or ``Gone`` when the history lost some."""
        w = Watcher(
            info,
            namespace=namespace if info.namespaced else None,
            labels=selectors.parse_label_selector(label_selector),
            fields=selectors.parse_field_selector(field_selector, kind=info.plural),
            allow_bookmarks=allow_bookmarks,
            max_queue=self._watch_queue_size,
            on_close=self._watchers.discard,
        )
        if resource_version in (None, "", "0"):
            for _, obj in sorted(existing.items()):
                if w.matches(obj):
                    w.push(WatchEvent("ADDED", obj))
        else:
            try:
                since = int(str(resource_version))
            except ValueError:
                raise validation.bad_request(f"invalid resource version {resource_version!r}") from None
            if since < self._floor:
                raise errors.Gone(
                    f"too old resource version: {since} ({self._floor + 1})", status=410, reason="Expired"
                )
            for rv, plural, event, old in self._history:
                if rv > since and plural == info.plural:
                    self._deliver(w, event, old)
        self._watchers.add(w)
        return w

    def emit_bookmarks(self) -> None:
        """Send a BOOKMARK with the current resourceVersion to every watcher that allows them."""
        for w in list(self._watchers):
            if w.allow_bookmarks:
                marker = {
                    "kind": w.info.kind,
                    "apiVersion": w.info.api_version,
                    "metadata": {"resourceVersion": str(self._rv)},
                }
                w.push(WatchEvent("BOOKMARK", marker))

    def close_watchers(self) -> None:
        """End every open watch."""
        for w in list(self._watchers):
            w.close()

    @property
    def watchers(self) -> tuple[Watcher, ...]:
        """The open watches."""
        return tuple(self._watchers)

    @property
    def watcher_count(self) -> int:
        return len(self._watchers)
