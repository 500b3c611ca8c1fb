"""``Informer``: a watch-fed, in-memory cache of one kind of object (client-go's reflector + store).

``run()`` lists, then watches from the list's resourceVersion; when a watch ends it resumes from
the last resourceVersion seen (events and BOOKMARKs both advance it). When the server says the
resourceVersion is too old (``Gone``, 410) it re-lists and emits *synthetic* changes for the
difference between the cache and the fresh list (ADDED, MODIFIED, and DELETED for objects that
went away while disconnected), so the cache and the callbacks stay exact. Identity is the uid, not
the name: an object deleted and re-created under the same name meanwhile (a StatefulSet pod) comes
out as DELETED of the old object then ADDED of the new one, never as one MODIFIED. Any other error is
logged and retried with capped exponential back-off. ``synced`` is set once the first list is in
the cache. ``run()`` returns only by cancellation, which it honours promptly and cleanly.

Callback semantics: ``on_event(change)`` is called on the event loop, one change at a time, in
the order the server produced them, after the cache already reflects the change. ``change.old``
is the cached object before the change (None for ADDED). A callback may be a plain function or a
coroutine function (awaited before the next change is applied). An exception from a callback is
logged with the object's name and does not stop the informer. A list's changes are applied in one
step of the event loop (plain-function callbacks see the whole list before anything else runs); a
watch's burst of events gives the loop a turn every ``yield_after_s`` (0.5 ms) of applying them.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal

from vgpu.core import errors
from vgpu.kube.port import JsonObj, Kind, KubeApi, Transform, WatchEvent

log = logging.getLogger(__name__)

# a watch delivering a burst of events that are all already read gives the event loop a turn after
# this much of it (a stream with its data buffered never waits, so without it the whole burst is
# one step of the loop): what waits for the loop meanwhile, the scheduler's /filter in
# kube-scheduler's serial cycle above all, waits for at most this much of the burst
YIELD_AFTER_S = 0.0005

ChangeType = Literal["ADDED", "MODIFIED", "DELETED"]


@dataclass(frozen=True)
class Change:
    """One change to the cache: the new object (the last known one for DELETED) and the old one."""

    type: ChangeType
    object: JsonObj
    old: JsonObj | None


Callback = Callable[[Change], Awaitable[None] | None]
# told a list is about to be asked for, then, once its changes were applied, what it listed: a
# reader that keeps something about objects the cache may never have held (a write of its own made
# while the watch was down) can settle it against the list
ListStarting = Callable[[], None]
Listed = Callable[[list[JsonObj]], None]
Key = tuple[str, str]


def object_key(obj: JsonObj) -> Key:
    """(namespace, name) of an object; namespace is "" for cluster-scoped kinds."""
    meta = obj.get("metadata") or {}
    return (meta.get("namespace") or "", meta.get("name") or "")


class Informer:
    """A cache of ``kind`` objects matching the selectors, kept current by a watch."""

    def __init__(
        self,
        api: KubeApi,
        kind: Kind,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        on_event: Callback | None = None,
        transform: Transform | None = None,
        watch_timeout_s: float = 300.0,
        backoff_initial_s: float = 0.1,
        backoff_max_s: float = 10.0,
        quiet_watch_s: float = 1.0,
        yield_after_s: float = YIELD_AFTER_S,
        unserved_ok: bool = False,
        unserved_log_level: int = logging.WARNING,
        on_list_starting: ListStarting | None = None,
        on_listed: Listed | None = None,
    ) -> None:
        """``unserved_ok``: a kind the API server may not serve (an API version newer than it): a
        404 to the first list counts as synced with nothing cached (logged once, at
        ``unserved_log_level``: INFO where its absence is normal); the list is retried at the
        back-off's pace and fills the cache if the kind is ever served."""
        self._api = api
        self._unserved_ok = unserved_ok
        self._unserved_log_level = unserved_log_level
        self.kind = kind
        self._namespace = namespace
        self._label_selector = label_selector
        self._field_selector = field_selector
        self._on_event = on_event
        self._on_list_starting = on_list_starting
        self._on_listed = on_listed
        # applied to every listed or watched object before it is cached (client-go's SetTransform):
        # keep what the reader needs, drop the rest, for memory
        self._transform = transform
        self._watch_timeout_s = watch_timeout_s
        self._backoff_initial_s = backoff_initial_s
        self._backoff_max_s = backoff_max_s
        # a watch that lasted this long without events ended normally (server timeout), not in error
        self._quiet_watch_s = quiet_watch_s
        self._yield_after_s = yield_after_s
        self._cache: dict[Key, JsonObj] = {}
        self.resource_version = ""
        self.synced = asyncio.Event()
        self.relists = 0  # how many times a list (re)filled the cache; visible for tests and metrics

    def get(self, namespace: str | None, name: str) -> JsonObj | None:
        """The cached object, or None. Use ``None`` or ``""`` as namespace for cluster-scoped kinds.
        The object is the cache's own: do not modify it."""
        return self._cache.get((namespace or "", name))

    def items(self) -> list[JsonObj]:
        """Every cached object (the cache's own dicts: do not modify them)."""
        return list(self._cache.values())

    def __len__(self) -> int:
        return len(self._cache)

    async def run(self) -> None:
        """List, watch, resume, re-list on Gone, back off on errors; until cancelled."""
        backoff_s = self._backoff_initial_s
        need_list = True
        while True:
            try:
                if need_list:
                    await self._relist()
                    need_list = False
                    backoff_s = self._backoff_initial_s
                started = asyncio.get_running_loop().time()
                got_events = await self._watch_once()
                lasted_s = asyncio.get_running_loop().time() - started
                if got_events or lasted_s >= self._quiet_watch_s:
                    # a healthy watch (events, or a quiet one the server ended at its timeout)
                    backoff_s = self._backoff_initial_s
                    continue
                # a watch that ended at once with nothing: back off so a closing server is not hammered
            except errors.Gone:
                log.info(
                    "informer %s: resourceVersion %s is too old; re-listing", self.kind, self.resource_version
                )
                need_list = True
                continue
            except errors.NotFound as exc:
                if not (self._unserved_ok and need_list):
                    log.warning("informer %s: %s; retrying in %.2fs", self.kind, exc, backoff_s)
                elif not self.synced.is_set():
                    log.log(
                        self._unserved_log_level,
                        "informer %s: not served by this API server (%s): none cached, "
                        "the list retried every %.0f s",
                        self.kind,
                        exc,
                        self._backoff_max_s,
                    )
                    self.synced.set()
            except Exception as exc:
                log.warning("informer %s: %s; retrying in %.2fs", self.kind, exc, backoff_s)
            await asyncio.sleep(backoff_s)
            backoff_s = min(backoff_s * 2, self._backoff_max_s)

    async def _relist(self) -> None:
        if self._on_list_starting is not None:
            self._on_list_starting()
        listed = await self._api.list(
            self.kind,
            namespace=self._namespace,
            label_selector=self._label_selector,
            field_selector=self._field_selector,
        )
        items = listed.items if self._transform is None else [self._transform(o) for o in listed.items]
        fresh = {object_key(obj): obj for obj in items}
        changes: list[Change] = []
        for key, old in list(self._cache.items()):
            if key not in fresh:
                del self._cache[key]
                changes.append(Change("DELETED", old, old))
        for key, obj in fresh.items():
            old_obj = self._cache.get(key)
            self._cache[key] = obj
            if old_obj is not None and _uid(old_obj) != _uid(obj):
                # deleted and re-created under the same name while we were away (a StatefulSet
                # pod): two objects, so the old one's DELETED, then the new one's ADDED
                changes.append(Change("DELETED", old_obj, old_obj))
                old_obj = None
            if old_obj is None:
                changes.append(Change("ADDED", obj, None))
            elif _rv(old_obj) != _rv(obj):
                changes.append(Change("MODIFIED", obj, old_obj))
        self.resource_version = listed.resource_version
        self.relists += 1
        log.debug(
            "informer %s: listed %d objects at resourceVersion %s",
            self.kind,
            len(fresh),
            self.resource_version,
        )
        # the cache is whole before any callback runs, and synced is set before the first callback
        self.synced.set()
        for change in changes:
            await self._notify(change)
        if self._on_listed is not None:
            self._on_listed(items)

    async def _watch_once(self) -> bool:
        got = False
        stream = self._api.watch(
            self.kind,
            resource_version=self.resource_version,
            namespace=self._namespace,
            label_selector=self._label_selector,
            field_selector=self._field_selector,
            timeout_s=self._watch_timeout_s,
            transform=self._transform,  # applied where the events are decoded (another process, perhaps)
        )
        aclose = getattr(stream, "aclose", None)
        loop = asyncio.get_running_loop()
        since = loop.time()  # the last turn given (or the watch's start)
        try:
            async for event in stream:
                got = True
                await self._apply(event)
                if loop.time() - since >= self._yield_after_s:
                    await asyncio.sleep(0)  # one turn: the rest of a burst waits behind what is ready
                    since = loop.time()
        finally:
            if aclose is not None:
                with contextlib.suppress(Exception):
                    await aclose()
        return got

    async def _apply(self, event: WatchEvent) -> None:
        rv = _rv(event.object)
        if event.type == "BOOKMARK":
            if rv:
                self.resource_version = rv
            return
        obj = event.object  # the watch applied the transform
        key = object_key(obj)
        old = self._cache.get(key)
        if rv:
            self.resource_version = rv
        if event.type == "DELETED":
            if old is None:
                return
            del self._cache[key]
            await self._notify(Change("DELETED", obj, old))
            return
        self._cache[key] = obj
        await self._notify(Change("ADDED" if old is None else "MODIFIED", obj, old))

    async def _notify(self, change: Change) -> None:
        if self._on_event is None:
            return
        try:
            result = self._on_event(change)
            if inspect.isawaitable(result):
                await result
        except Exception:
            ns, name = object_key(change.object)
            log.exception("informer %s: callback failed on %s %s/%s", self.kind, change.type, ns, name)


def _rv(obj: JsonObj) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


def _uid(obj: JsonObj) -> str:
    return str((obj.get("metadata") or {}).get("uid") or "")
