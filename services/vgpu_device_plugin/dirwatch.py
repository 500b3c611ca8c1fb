"""Watching kubelet's device-plugin directory: inotify through libc (ctypes), read on the event loop.

kubelet re-admits its pods within milliseconds of re-creating ``kubelet.sock`` after a restart,
and a pod whose container is not running while its resource has no healthy devices is rejected
then (docs/device-plugin.md, "Lifecycle"). So the plugin must learn of the new socket at once:
``InotifyWatcher.watch`` calls ``on_change`` on the event loop whenever an entry of the directory
is created, deleted or moved (or the kernel's queue overflowed), as NVIDIA's and HAMi's plugins do
with fsnotify. No new C dependency: ``inotify_init1`` and ``inotify_add_watch`` come from the C
library by ctypes, and the descriptor is read through ``loop.add_reader`` (never blocking).

``DirWatcher`` is the seam: ``NoWatcher`` (and ``InotifyWatcher`` where the C library, the kernel
or the directory refuses) returns ``None``, and the caller falls back to polling.
``parse_events`` is the pure decoder of what ``read(2)`` returns (``struct inotify_event``).
``Waker`` is the manager's sleep between its checks, cut short by a change in the directory.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
import os
import pathlib
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from vgpu.waits import wait_at_most

log = logging.getLogger(__name__)

# <sys/inotify.h>
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC
WATCHED = IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_DELETE_SELF | IN_MOVE_SELF

_HEADER = struct.Struct("=iIII")  # wd, mask, cookie, len: then len bytes of NUL-padded name


@dataclass(frozen=True)
class Event:
    mask: int
    name: str

    @property
    def lost_watch(self) -> bool:
        """The directory itself went away (or the kernel dropped the watch): poll from now on."""
        return bool(self.mask & (IN_DELETE_SELF | IN_MOVE_SELF | IN_IGNORED))


class InotifyDecodeError(ValueError):
    """``read(2)`` on an inotify descriptor returned bytes that are not whole events."""


def parse_events(data: bytes) -> list[Event]:
    """Decode the ``struct inotify_event`` records of one ``read(2)``. A truncated record is an
    InotifyDecodeError (the kernel never returns one: a caller treats it as "something changed")."""
    events: list[Event] = []
    offset = 0
    while offset < len(data):
        if len(data) - offset < _HEADER.size:
            raise InotifyDecodeError(f"truncated inotify event header at byte {offset} of {len(data)}")
        _wd, mask, _cookie, length = _HEADER.unpack_from(data, offset)
        offset += _HEADER.size
        if length > len(data) - offset:
            raise InotifyDecodeError(f"inotify event name of {length} bytes overruns the buffer")
        raw = data[offset : offset + length].split(b"\0", 1)[0]
        offset += length
        events.append(Event(mask=mask, name=os.fsdecode(raw)))
    return events


class Watch(Protocol):
    @property
    def active(self) -> bool:
        """False once the watch ended (closed, or the directory went away): watch again."""
        ...

    def close(self) -> None: ...


class DirWatcher(Protocol):
    def watch(self, directory: pathlib.Path, on_change: Callable[[], None]) -> Watch | None:
        """Call ``on_change`` (on the running loop) after any entry of ``directory`` is created,
        deleted or moved; None where the directory cannot be watched (the caller polls instead)."""
        ...


class NoWatcher:
    """Never watches: the caller polls (for platforms without inotify, and tests of the fallback)."""

    def watch(self, directory: pathlib.Path, on_change: Callable[[], None]) -> Watch | None:
        return None


class _FdWatch:
    """One inotify descriptor, read by the loop's reader callback."""

    def __init__(self, fd: int, directory: pathlib.Path, on_change: Callable[[], None]) -> None:
        self._fd = fd
        self._directory = directory
        self._on_change = on_change
        self._loop = asyncio.get_running_loop()
        self.active = True
        self._loop.add_reader(fd, self._readable)

    def close(self) -> None:
        if self.active:
            self.active = False
            self._loop.remove_reader(self._fd)
            os.close(self._fd)

    def _readable(self) -> None:
        try:
            data = os.read(self._fd, 64 * 1024)
        except BlockingIOError:
            return
        except OSError as exc:
            log.warning("reading inotify for %s failed: %s; polling it instead", self._directory, exc)
            self.close()
            self._on_change()
            return
        try:
            events = parse_events(data)
        except InotifyDecodeError as exc:
            log.warning("inotify for %s: %s", self._directory, exc)
            events = [Event(mask=IN_Q_OVERFLOW, name="")]
        if any(e.lost_watch for e in events):
            log.info("%s is gone: no longer watched (polling until it is back)", self._directory)
            self.close()
        if events:
            self._on_change()


class _Libc(Protocol):
    def inotify_init1(self, flags: int, /) -> int: ...

    def inotify_add_watch(self, fd: int, path: bytes, mask: int, /) -> int: ...


def _load_libc() -> _Libc | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name, use_errno=True)
        _ = libc.inotify_init1, libc.inotify_add_watch
    except (OSError, AttributeError, TypeError):
        return None
    libc.inotify_init1.argtypes = [ctypes.c_int]
    libc.inotify_init1.restype = ctypes.c_int
    libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
    libc.inotify_add_watch.restype = ctypes.c_int
    return libc


class InotifyWatcher:
    """``DirWatcher`` by inotify (Linux). The C library is loaded on first use."""

    def __init__(self, libc: _Libc | None = None) -> None:
        self._libc = libc
        self._loaded = libc is not None

    def watch(self, directory: pathlib.Path, on_change: Callable[[], None]) -> Watch | None:
        if not self._loaded:
            self._libc, self._loaded = _load_libc(), True
        libc = self._libc
        if libc is None:
            log.debug("inotify is not available here; polling %s instead", directory)
            return None
        fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            log.debug(
                "inotify_init1 failed: %s; polling %s instead", os.strerror(ctypes.get_errno()), directory
            )
            return None
        if libc.inotify_add_watch(fd, os.fsencode(directory), WATCHED) < 0:
            reason = os.strerror(ctypes.get_errno())
            os.close(fd)
            log.debug("cannot watch %s (%s); polling it instead", directory, reason)
            return None
        return _FdWatch(fd, directory, on_change)


class Waker:
    """The manager's sleep between checks: woken at once by a change in ``directory`` (watched with
    ``watcher``, again after the watch went away) or by ``wake()``; else it lasts ``poll_s``."""

    def __init__(self, watcher: DirWatcher, directory: pathlib.Path, *, node: str, poll_s: float) -> None:
        self._watcher = watcher
        self._directory = directory
        self._node = node
        self._poll_s = poll_s
        self._watch: Watch | None = None
        self._mode = ""
        self._woken = asyncio.Event()

    def wake(self) -> None:
        self._woken.set()

    async def sleep(self) -> None:
        self._ensure_watch()
        await wait_at_most(self._woken.wait(), self._poll_s)
        self._woken.clear()

    def close(self) -> None:
        if self._watch is not None:
            self._watch.close()
            self._watch = None

    def _ensure_watch(self) -> None:
        if self._watch is not None and self._watch.active:
            return
        self._watch = self._watcher.watch(self._directory, self.wake)
        mode = "inotify" if self._watch is not None else "polling"
        if mode != self._mode:
            log.info(
                "node %s: kubelet restarts are seen by %s on %s%s",
                self._node,
                mode,
                self._directory,
                "" if self._watch is not None else f" (every {self._poll_s:g} s)",
            )
            self._mode = mode
