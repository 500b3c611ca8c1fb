"""The socket between the vgpu-scheduler and its API helper (``vgpu.kube.offload``): length-prefixed
pickled frames, the messages they carry, the helper's end (``Writer``, run by ``python -m
vgpu.kube.offload``) and the scheduler's (``Calls``).

Messages: a request ``(id, method, args, kwargs)``; an answer ``(id, error or None, result)``, where
an error is ``(class name, message, status, reason)``; an event of a watch stream ``(id, (event
type, object))``, the stream ended by an answer with its id; ``(id, CANCEL, (), {})`` stops a stream
whose reader went away. The helper's first frame is ``READY``. Both ends are processes of ours, so
pickle is the format: nothing else writes to this socket.
"""

from __future__ import annotations

import asyncio
import logging
import pickle
import signal
import socket
import struct
import sys
from collections.abc import Callable
from typing import Any

from vgpu.core import errors
from vgpu.kube.aioapi import AioKubeApi

log = logging.getLogger(__name__)

WRITES = frozenset(
    {
        "create",
        "replace",
        "merge_patch",
        "merge_patch_status",
        "delete",
        "bind_pod",
        "evict_pod",
        "create_event",
    }
)
CLOSE_TIMEOUT_S = 10.0  # for the child to finish its writes and exit at close()
READY = (0, None, "ready")  # the child's first frame; requests are numbered from 1
WATCH = "watch"  # a request whose answer is a stream: events, then an answer that ends it
CANCEL = "cancel"  # (id, CANCEL, (), {}): stop the stream ``id`` (its reader went away)
END = object()  # a stream's end, in its queue
MAX_FRAME_BYTES = 64 << 20  # larger than any write or answer: a bigger length is a broken stream
# a read that brings many frames (a burst of watch events, of answers) is handled in slices of this
# much time, the loop getting a turn between them (reading paused meanwhile): a /filter that comes
# in, inside kube-scheduler's serial cycle, waits for at most one slice
SLICE_S = 0.0005
HEADER = struct.Struct("!I")
_ERRORS: dict[str, type[errors.KubeError]] = {
    cls.__name__: cls for cls in (errors.KubeError, errors.NotFound, errors.Conflict, errors.Gone)
}

Factory = Callable[[], AioKubeApi]
_ErrorTuple = tuple[str, str, int, str]


def _error_tuple(exc: errors.KubeError) -> _ErrorTuple:
    return (type(exc).__name__, str(exc), exc.status, exc.reason)


def _error(error: _ErrorTuple) -> errors.KubeError:
    name, text, status, reason = error
    return _ERRORS.get(name, errors.KubeError)(text, status=status, reason=reason)


def frame(message: object) -> bytes:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return HEADER.pack(len(data)) + data


class Frames(asyncio.Protocol):
    """Length-prefixed pickled messages over a stream socket, both ends (our own processes only)."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self.transport: asyncio.Transport | None = None
        self._sliced = False  # the rest of the buffer waits for the loop's next turn, reading paused
        loop = asyncio.get_running_loop()
        self._loop = loop
        self.ended: asyncio.Future[None] = loop.create_future()  # nothing more will arrive
        self.closed: asyncio.Future[None] = loop.create_future()  # the socket is closed

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        if not self._sliced:  # else the slice scheduled next gets to it
            self._drain(SLICE_S)

    def _drain(self, slice_s: float | None) -> None:
        """Hand over the buffer's complete frames, in order, for at most ``slice_s`` (None: all of
        them); the rest in the loop's next turn, with reading paused until they are done."""
        self._sliced = False
        deadline = None if slice_s is None else self._loop.time() + slice_s
        handed = 0  # at least one frame a slice, however short
        while len(self._buffer) >= HEADER.size:
            (size,) = HEADER.unpack_from(self._buffer)
            if size > MAX_FRAME_BYTES:
                self._broken(f"a frame of {size} bytes")
                return
            if len(self._buffer) < HEADER.size + size:
                break
            if handed and deadline is not None and self._loop.time() >= deadline:
                self._sliced = True
                if self.transport is not None:
                    self.transport.pause_reading()
                self._loop.call_soon(self._next_slice, slice_s)
                return
            data = bytes(self._buffer[HEADER.size : HEADER.size + size])
            del self._buffer[: HEADER.size + size]
            try:
                message = pickle.loads(data)
            except Exception as exc:  # a broken stream: nothing after it can be trusted
                self._broken(f"an undecodable frame: {exc!r}")
                return
            self.received(message)
            handed += 1
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()  # (a no-op unless a slice paused it)

    def _next_slice(self, slice_s: float | None) -> None:
        try:
            self._drain(slice_s)
        except Exception as exc:  # as asyncio does when data_received fails: the channel is done
            log.exception("API writer channel: handing over a frame failed")
            self._broken(f"a frame that could not be handed over: {exc!r}")

    def _broken(self, what: str) -> None:
        log.error("API writer channel: %s; closing it", what)
        self._buffer.clear()
        if self.transport is not None:
            self.transport.abort()

    @property
    def alive(self) -> bool:
        """Connected and not closing (an abort counts at once, before the loop's next step)."""
        return self.transport is not None and not self.transport.is_closing()

    def send(self, message: object) -> None:
        assert self.transport is not None
        self.transport.write(frame(message))

    def received(self, message: Any) -> None:
        raise NotImplementedError

    def eof_received(self) -> bool:
        """The other end shut its writing side: answers may still be sent (the child's case)."""
        self._drain(None)  # what came before the end is handed over first
        if not self.ended.done():
            self.ended.set_result(None)
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self._drain(None)  # answers that came before the close are answers, not lost writes
        for future in (self.ended, self.closed):
            if not future.done():
                future.set_result(None)


# ----- the child -----


class Writer(Frames):
    """The child's end: runs each request on ``api`` as a task and sends its answer back; a watch's
    events go back one frame each, as they come."""

    def __init__(self, api: AioKubeApi) -> None:
        super().__init__()
        self._api = api
        self.tasks: set[asyncio.Task[None]] = set()  # writes
        self.streams: dict[int, asyncio.Task[None]] = {}  # watches, by request id

    def received(self, message: Any) -> None:
        rid, method, args, kwargs = message
        loop = asyncio.get_running_loop()
        if method == CANCEL:
            stream = self.streams.pop(rid, None)
            if stream is not None:
                stream.cancel()
            return
        if method == WATCH:
            self.streams[rid] = loop.create_task(self._stream(rid, args, kwargs))
            return
        task = loop.create_task(self._run(rid, method, args, kwargs))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _stream(self, rid: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        error: _ErrorTuple | None = None
        try:
            async for event in self._api.watch(*args, **kwargs):
                if not self.alive:
                    return
                self.send((rid, (event.type, event.object)))
        except errors.KubeError as exc:
            error = _error_tuple(exc)
        except Exception as exc:  # a bug (a transform that fails, say): the reader gets an error
            log.exception("API writer: watch %s failed", args[:1])
            error = ("KubeError", f"watch: {exc!r}", 0, "")
        finally:
            if self.streams.get(rid) is asyncio.current_task():
                del self.streams[rid]
        if self.alive:
            self.send((rid, error, None))

    async def _run(self, rid: int, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        error: _ErrorTuple | None = None
        result = None
        try:
            if method not in WRITES:
                raise errors.KubeError(f"{method}: not a write or a watch the API writer makes", status=0)
            result = await getattr(self._api, method)(*args, **kwargs)
        except errors.KubeError as exc:
            error = _error_tuple(exc)
        except Exception as exc:  # a bug: the caller gets an error, the writer goes on
            log.exception("API writer: %s failed", method)
            error = ("KubeError", f"{method}: {exc!r}", 0, "")
        if self.alive:
            self.send((rid, error, result))


async def serve(sock: socket.socket, factory: Factory) -> None:
    api = factory()
    try:
        loop = asyncio.get_running_loop()
        transport, writer = await loop.create_unix_connection(lambda: Writer(api), sock=sock)
        writer.send(READY)
        await writer.ended  # the parent is stopping (or died): finish the writes asked, then go
        streams = list(writer.streams.values())
        for stream in streams:
            stream.cancel()
        if streams:
            await asyncio.wait(streams)
        if writer.tasks:
            await asyncio.wait(writer.tasks, timeout=CLOSE_TIMEOUT_S)
        transport.close()
    finally:
        await api.close()


def child_main() -> None:
    """The child process (``python -m vgpu.kube.offload``): its socket's descriptor, the factory
    and the log level arrive pickled on stdin; serve writes and watches until the parent's end closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the process group: the parent decides
    fd, factory, level = pickle.load(sys.stdin.buffer)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s[writer]: %(message)s")
    logging.getLogger("aiohttp").setLevel(max(level, logging.WARNING))
    asyncio.run(serve(socket.socket(fileno=fd), factory))


# ----- the parent -----


class Calls(Frames):
    """The parent's end: each request's future, resolved by its answer."""

    def __init__(self) -> None:
        super().__init__()
        self._next = 0
        self.ready: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting: dict[int, asyncio.Future[Any]] = {READY[0]: self.ready}
        # each open stream's events, then END or the error that ended it
        self._streams: dict[int, asyncio.Queue[Any]] = {}

    def call(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> asyncio.Future[Any]:
        rid = self._request(method, args, kwargs)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting[rid] = future
        return future

    def stream(
        self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[int, asyncio.Queue[Any]]:
        """Open a stream: its id and the queue its events arrive in."""
        rid = self._request(method, args, kwargs)
        queue: asyncio.Queue[Any] = asyncio.Queue()
        self._streams[rid] = queue
        return rid, queue

    def cancel(self, rid: int) -> None:
        """The stream's reader went away: tell the child to stop it (unless it has ended)."""
        if self._streams.pop(rid, None) is not None and self.alive:
            self.send((rid, CANCEL, (), {}))

    def _request(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
        if not self.alive:
            raise errors.KubeError(f"{method}: the API writer process is gone", status=0)
        self._next += 1
        self.send((self._next, method, args, kwargs))
        return self._next

    def eof_received(self) -> bool:
        return False  # the child is going: close, and fail what it did not answer

    def received(self, message: Any) -> None:
        if len(message) == 2:  # an event of a stream (a cancelled one's last few are dropped)
            queue = self._streams.get(message[0])
            if queue is not None:
                queue.put_nowait(message[1])
            return
        rid, error, result = message
        ended = self._streams.pop(rid, None)
        if ended is not None:
            ended.put_nowait(END if error is None else _error(error))
            return
        future = self._waiting.pop(rid, None)
        if future is None or future.done():
            return
        if error is None:
            future.set_result(result)
            return
        future.set_exception(_error(error))

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        streams, self._streams = self._streams, {}
        for queue in streams.values():
            queue.put_nowait(
                errors.KubeError("the API writer process exited: the watch it carried ended", status=0)
            )
        waiting, self._waiting = self._waiting, {}
        for future in waiting.values():
            if not future.done():
                future.set_exception(
                    errors.KubeError(
                        "the API writer process exited with the write in flight: it may or may not "
                        "have been made",
                        status=0,
                    )
                )
