"""``Watcher``: one watch on the local store, an async iterator of ``WatchEvent``.

The store pushes events (already filtered by the watcher's ``matches``); the consumer awaits
them. A watcher whose queue grows past ``max_queue`` is cut off (closed), as the real watch cache
drops consumers that fall too far behind; the consumer resumes from its last resourceVersion.
Each delivered object is a copy, so consumers may modify what they get.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable

from vgpu.kube.port import JsonObj, WatchEvent
from vgpu.localcluster import selectors
from vgpu.localcluster.kinds import KindInfo
from vgpu.localcluster.patch import clone


class Watcher:
    """One watch: an async iterator of ``WatchEvent``; ends when closed (``close()`` or the store)."""

    def __init__(
        self,
        info: KindInfo,
        *,
        namespace: str | None,
        labels: selectors.LabelSelector,
        fields: selectors.FieldSelector,
        allow_bookmarks: bool,
        max_queue: int,
        on_close: Callable[[Watcher], None] | None = None,
    ) -> None:
        self._on_close: Callable[[Watcher], None] | None = on_close
        self.info = info
        self.namespace = namespace
        self._labels = labels
        self._fields = fields
        self.allow_bookmarks = allow_bookmarks
        self._max_queue = max_queue
        self._queue: collections.deque[WatchEvent | None] = collections.deque()
        self._wakeup = asyncio.Event()
        self.closed = False
        self.ended = asyncio.Event()  # set by close(): lets callers wait for a watch to go away

    def matches(self, obj: JsonObj) -> bool:
        meta = obj.get("metadata", {})
        if self.namespace is not None and meta.get("namespace") != self.namespace:
            return False
        return self._labels.matches(meta.get("labels") or {}) and self._fields.matches(obj)

    def push(self, event: WatchEvent | None) -> None:
        if self.closed:
            return
        if event is not None and len(self._queue) >= self._max_queue:
            # a consumer this far behind is cut off, as the real watch cache does; it resumes
            self.close()
            return
        self._queue.append(event)
        self._wakeup.set()

    def close(self) -> None:
        """End this watch: the iterator stops after the events already queued."""
        if not self.closed:
            self._queue.append(None)
            self._wakeup.set()
            self.closed = True
            self.ended.set()
            if self._on_close is not None:
                self._on_close(self)

    def __aiter__(self) -> Watcher:
        return self

    async def __anext__(self) -> WatchEvent:
        event = await self.next_event()
        if event is None:
            raise StopAsyncIteration
        return event

    def pop_ready(self) -> WatchEvent | None:
        """The next queued event without waiting (the store's own object, not a copy), or None when
        none is queued or the watch has ended: lets a server write every ready event at once."""
        if not self._queue or self._queue[0] is None:
            return None
        return self._queue.popleft()

    async def next_event(self, *, timeout_s: float | None = None, copy: bool = True) -> WatchEvent | None:
        """The next event, or None when the watch has ended or ``timeout_s`` passed first.
        ``copy=False`` hands out the store's own object, for a caller that only serialises it."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        while not self._queue:
            self._wakeup.clear()
            if deadline is None:
                await self._wakeup.wait()
                continue
            remaining = deadline - loop.time()
            if remaining <= 0:
                return None
            try:
                async with asyncio.timeout(remaining):
                    await self._wakeup.wait()
            except TimeoutError:
                return None
        event = self._queue.popleft()
        if event is None:
            self._queue.appendleft(None)  # stay ended
            return None
        return WatchEvent(event.type, clone(event.object)) if copy else event
