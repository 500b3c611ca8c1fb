"""A live feed of one changing value to a capped set of subscribers (the dashboard's SSE clients).

The producer calls ``poke()`` at every change (cheap: it sets an event; the cluster state calls it
on each watch event and decision). While anyone is subscribed, one task (``feed-<name>``) waits
for a poke, lets the burst settle for ``debounce_s``, renders the value once and offers it to every
subscriber whose last one differed; with no poke it renders every ``refresh_s`` anyway (what the
value shows may age without a change: a device plugin's Lease going stale). Rendering is kept to
``busy_share`` of the time: after a render that took r seconds the next one waits until r /
``busy_share`` has passed since this one began (a big cluster's dashboard is then pushed less
often instead of taking the CPU from the scheduler's real work). A subscriber's queue
holds at most ``queue_size`` messages: a client too slow to drain it loses the oldest (each
message is the whole value, so the newest one supersedes them). At most ``max_subscribers`` at
once: ``subscribe`` raises ``FeedFull`` beyond that. The task runs only while someone is
subscribed; ``unsubscribe`` of the last one and ``aclose`` stop it and wait for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


class FeedFull(Exception):
    """``max_subscribers`` are subscribed already."""


class Subscriber(Generic[T]):
    """One client's bounded queue. ``None`` in it means: the feed is closing, stop."""

    def __init__(self, queue_size: int) -> None:
        self._queue: asyncio.Queue[T | None] = asyncio.Queue(maxsize=queue_size)
        self.dropped = 0  # messages lost because the client was slow

    def offer(self, item: T | None) -> None:
        while self._queue.full():
            self._queue.get_nowait()
            self.dropped += 1
        self._queue.put_nowait(item)

    @property
    def waiting(self) -> int:
        """Messages not taken yet."""
        return self._queue.qsize()

    async def next(self, timeout_s: float) -> T | None:
        """The next message; ``TimeoutError`` when none came within ``timeout_s``."""
        async with asyncio.timeout(timeout_s):
            return await self._queue.get()


class Feed(Generic[T]):
    """See the module docstring. ``await render()`` gives the value now (it may hand work to a
    thread) and ``same(a, b)`` says whether two values show the same (then nothing is sent)."""

    def __init__(
        self,
        name: str,
        render: Callable[[], Awaitable[T]],
        *,
        same: Callable[[T, T], bool],
        max_subscribers: int = 16,
        queue_size: int = 4,
        debounce_s: float = 0.25,
        refresh_s: float = 5.0,
        busy_share: float = 0.1,
    ) -> None:
        if (
            max_subscribers < 1
            or queue_size < 1
            or debounce_s < 0
            or refresh_s <= 0
            or not 0 < busy_share <= 1
        ):
            raise ValueError(
                "max_subscribers and queue_size must be >= 1, debounce_s >= 0, refresh_s > 0, "
                "0 < busy_share <= 1"
            )
        self.name = name
        self._render = render
        self._same = same
        self.max_subscribers = max_subscribers
        self._queue_size = queue_size
        self._debounce_s = debounce_s
        self._refresh_s = refresh_s
        self._busy_share = busy_share
        self._next_render_s = 0.0  # loop time before which the next render waits (busy_share)
        self._subscribers: dict[Subscriber[T], T | None] = {}  # -> the last value it was sent
        self._poked = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.idle = asyncio.Event()  # set while nobody is subscribed
        self.idle.set()
        self.renders = 0  # values rendered by the task (tests, benchmarks)

    def __len__(self) -> int:
        return len(self._subscribers)

    def poke(self) -> None:
        """The value changed (call it from the producer; cheap, never blocks)."""
        self._poked.set()

    def subscribe(self, current: T) -> Subscriber[T]:
        """A new subscriber, who was just sent ``current``; ``FeedFull`` at the cap."""
        if len(self._subscribers) >= self.max_subscribers:
            raise FeedFull(f"{self.max_subscribers} clients are connected already")
        subscriber: Subscriber[T] = Subscriber(self._queue_size)
        self._subscribers[subscriber] = current
        self.idle.clear()
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name=f"feed-{self.name}")
        return subscriber

    async def unsubscribe(self, subscriber: Subscriber[T]) -> None:
        """Forget ``subscriber``; the last one out stops the task."""
        self._subscribers.pop(subscriber, None)
        if not self._subscribers:
            await self._stop()
            self.idle.set()

    async def aclose(self) -> None:
        """Tell every subscriber to stop (``None``) and stop the task."""
        for subscriber in self._subscribers:
            subscriber.offer(None)
        await self._stop()

    async def _stop(self) -> None:
        task, self._task = self._task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._refresh_s):
                    await self._poked.wait()
            loop = asyncio.get_running_loop()
            if self._poked.is_set() and self._debounce_s:
                await asyncio.sleep(self._debounce_s)  # let a burst of changes settle
            if (wait_s := self._next_render_s - loop.time()) > 0:
                await asyncio.sleep(wait_s)  # rendering takes at most busy_share of the time
            self._poked.clear()
            started_s = loop.time()
            try:
                value = await self._render()
            except Exception:  # a bug in rendering must not end the feed for everyone
                log.exception("live feed %s: rendering failed", self.name)
                continue
            finally:
                self._next_render_s = started_s + (loop.time() - started_s) / self._busy_share
            self.renders += 1
            for subscriber, last in self._subscribers.items():
                if last is None or not self._same(last, value):
                    self._subscribers[subscriber] = value
                    subscriber.offer(value)
