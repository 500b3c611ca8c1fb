"""inotify through ctypes: the event decoder (with garbage) and the watch on a real directory."""

import asyncio
import os
import pathlib
import struct

import pytest
from vgpu_device_plugin import dirwatch


def record(mask: int, name: bytes = b"", pad_to: int = 0) -> bytes:
    body = name + b"\0" * (max(pad_to, len(name) + 1 if name else 0) - len(name))
    return struct.pack("=iIII", 1, mask, 0, len(body)) + body


def test_parse_events_reads_names_and_masks() -> None:
    data = record(dirwatch.IN_CREATE, b"kubelet.sock", pad_to=16) + record(dirwatch.IN_DELETE_SELF)
    events = dirwatch.parse_events(data)
    assert events == [
        dirwatch.Event(mask=dirwatch.IN_CREATE, name="kubelet.sock"),
        dirwatch.Event(mask=dirwatch.IN_DELETE_SELF, name=""),
    ]
    assert [e.lost_watch for e in events] == [False, True]


@pytest.mark.parametrize(
    "data",
    [b"\x01\x02", record(dirwatch.IN_CREATE, b"x")[:-1], struct.pack("=iIII", 1, 0, 0, 99) + b"ab"],
    ids=["short-header", "short-name", "length-overruns"],
)
def test_parse_events_refuses_garbage(data: bytes) -> None:
    with pytest.raises(dirwatch.InotifyDecodeError):
        dirwatch.parse_events(data)


async def test_a_created_and_a_deleted_entry_each_call_back(tmp_path: pathlib.Path) -> None:
    changed = asyncio.Event()
    watch = dirwatch.InotifyWatcher().watch(tmp_path, changed.set)
    assert watch is not None and watch.active
    try:
        (tmp_path / "kubelet.sock").write_bytes(b"")
        await asyncio.wait_for(changed.wait(), 5)
        changed.clear()
        os.unlink(tmp_path / "kubelet.sock")
        await asyncio.wait_for(changed.wait(), 5)
    finally:
        watch.close()
    assert not watch.active
    watch.close()  # twice is harmless


async def test_the_watch_ends_with_its_directory(tmp_path: pathlib.Path) -> None:
    directory = tmp_path / "device-plugins"
    directory.mkdir()
    changed = asyncio.Event()
    watch = dirwatch.InotifyWatcher().watch(directory, changed.set)
    assert watch is not None
    directory.rmdir()
    await asyncio.wait_for(changed.wait(), 5)
    assert not watch.active  # the caller polls, and watches again once the directory is back


async def test_a_missing_directory_cannot_be_watched(tmp_path: pathlib.Path) -> None:
    assert dirwatch.InotifyWatcher().watch(tmp_path / "absent", lambda: None) is None
    assert dirwatch.NoWatcher().watch(tmp_path, lambda: None) is None


class _NoInotify:
    def inotify_init1(self, flags: int, /) -> int:
        return -1

    def inotify_add_watch(self, fd: int, path: bytes, mask: int, /) -> int:
        raise AssertionError("not reached")


async def test_a_kernel_refusing_inotify_means_polling(tmp_path: pathlib.Path) -> None:
    assert dirwatch.InotifyWatcher(_NoInotify()).watch(tmp_path, lambda: None) is None
