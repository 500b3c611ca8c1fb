"""``CallPool``: a fixed set of daemon threads that run blocking API calls for the event loop.

Why not asyncio's default executor: it is shared by everything (``to_thread``, ``getaddrinfo``,
metrics rendering), it is small (``min(32, cpus + 4)``: 6 threads on a 2-CPU node), and its
threads are joined at interpreter exit, so one call blocked on a dead API server holds a SIGTERM'd
process for the whole request timeout. Here the API calls get their own, sized pool; watches get
a thread each (``spawn``) so they never take a worker; and every thread is a daemon, so exiting
never waits for a blocked socket read.

The pool reports its backlog (``queued``, ``busy``, ``oldest_wait_s``) so readiness can say when
calls wait for a worker for too long. Time is read through an injectable clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")


@dataclass
class _Job:
    fn: Callable[[], Any]
    future: asyncio.Future[Any]
    loop: asyncio.AbstractEventLoop
    queued_at: float
    started: bool = field(default=False)


class CallPool:
    """``workers`` daemon threads named ``<name>-<i>``, started on the first call."""

    def __init__(self, workers: int, *, name: str = "kube-api", clock: Callable[[], float] = time.monotonic):
        if workers < 1:
            raise ValueError("a CallPool needs at least one worker")
        self.workers = workers
        self._name = name
        self._clock = clock
        self._queue: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._waiting: dict[int, _Job] = {}  # queued jobs not yet taken by a worker, by id
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._busy = 0
        self._closed = False

    async def run(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on a worker; cancelling the await abandons a call still waiting for a worker."""
        if self._closed:
            raise RuntimeError("the API call pool is closed")
        loop = asyncio.get_running_loop()
        job = _Job(fn, loop.create_future(), loop, self._clock())
        with self._lock:
            self._start_workers()
            self._waiting[id(job)] = job
        self._queue.put(job)
        try:
            result: T = await job.future
            return result
        finally:
            with self._lock:
                self._waiting.pop(id(job), None)  # cancelled while queued: the worker skips it

    def _start_workers(self) -> None:
        while len(self._threads) < self.workers:
            thread = threading.Thread(
                target=self._work, name=f"{self._name}-{len(self._threads)}", daemon=True
            )
            self._threads.append(thread)
            thread.start()

    def _work(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            with self._lock:
                if self._waiting.pop(id(job), None) is None:
                    continue  # its caller gave up while it waited
                self._busy += 1
            result: Any = None
            error: BaseException | None = None
            try:
                result = job.fn()
            except BaseException as exc:  # handed to the awaiting coroutine, raised there
                error = exc
            with self._lock:  # idle before the caller hears back, so it never sees its own call busy
                self._busy -= 1
            self._settle(job, result, error)

    @staticmethod
    def _settle(job: _Job, result: Any, exc: BaseException | None) -> None:
        def settle() -> None:
            if job.future.done():
                return
            if exc is not None:
                job.future.set_exception(exc)
            else:
                job.future.set_result(result)

        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is waiting any more
            job.loop.call_soon_threadsafe(settle)

    @property
    def busy(self) -> int:
        """Workers inside a call now."""
        return self._busy

    @property
    def queued(self) -> int:
        """Calls waiting for a worker."""
        return len(self._waiting)

    def oldest_wait_s(self) -> float:
        """How long the oldest call still waiting for a worker has waited (0 when none waits)."""
        with self._lock:
            oldest = min((job.queued_at for job in self._waiting.values()), default=None)
        return 0.0 if oldest is None else max(0.0, self._clock() - oldest)

    def close(self) -> None:
        """Stop taking calls; idle workers exit, busy ones exit after their call (never joined)."""
        if self._closed:
            return
        self._closed = True
        for _ in self._threads:
            self._queue.put(None)


def spawn(fn: Callable[[], None], *, name: str) -> threading.Thread:
    """A daemon thread of its own for a long-lived blocking loop (a watch stream)."""
    thread = threading.Thread(target=fn, name=name, daemon=True)
    thread.start()
    return thread
