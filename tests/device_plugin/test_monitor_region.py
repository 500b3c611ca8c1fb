"""The HAMi-core shared region reader: both layouts decode, and any other bytes (truncated, foreign,
wrong version, lying counts, garbage) are a RegionError, never a crash."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pathlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from vgpu_device_plugin.monitor import region

from tests.device_plugin.regionfile import RegionSpec, Slot, build

GIB = 1 << 30
MIB = 1 << 20


def _spec(**changes: object) -> RegionSpec:
    base = RegionSpec(
        uuids=["GPU-aaaa", "GPU-bbbb"],
        limits=[4 * GIB, 2 * GIB],
        sm_limits=[50, 30],
        slots=[
            Slot(10, 31000, {0: (5 * MIB, 7 * MIB, 100 * MIB, 0, 112 * MIB)}, {0: 20}, {0: 300 * MIB}),
            Slot(0, 0, {0: (1, 1, 1, 1, 999)}),  # a freed slot: ignored
            Slot(
                11,
                31001,
                {0: (5 * MIB, 0, 50 * MIB, 0, 55 * MIB), 1: (5 * MIB, 0, 10 * MIB, 1, 15 * MIB)},
                {0: 15, 1: 40},
                {1: 20 * MIB},
            ),
        ],
        last_kernel_time=1_700_000_000,
        priority=0,
    )
    return dataclasses.replace(base, **changes)


@pytest.mark.parametrize("version", [(1, 0), (1, 1), None], ids=["v1.0", "v1.1", "v0"])
def test_both_layouts_decode_to_the_same_figures(version: tuple[int, int] | None) -> None:
    got = region.parse_bytes(build(_spec(version=version)))
    assert got.version == ("0" if version is None else f"{version[0]}.{version[1]}")
    a, b = got.devices
    assert (a.index, a.uuid, a.limit_bytes, a.sm_limit_percent) == (0, "GPU-aaaa", 4 * GIB, 50)
    assert (a.used_bytes, a.context_bytes, a.module_bytes, a.data_bytes) == (
        167 * MIB,
        10 * MIB,
        7 * MIB,
        150 * MIB,
    )
    assert (a.sm_util_percent, a.nvml_used_bytes) == (35, 300 * MIB)
    assert (b.uuid, b.used_bytes, b.offset_bytes, b.sm_util_percent, b.nvml_used_bytes) == (
        "GPU-bbbb",
        15 * MIB,
        1,
        40,
        20 * MIB,
    )
    assert [(p.pid, p.host_pid) for p in got.processes] == [(10, 31000), (11, 31001)]
    assert got.priority == 0
    assert got.last_kernel_time == (0 if version is None else 1_700_000_000)


def test_v1_reads_only_the_slots_in_use() -> None:
    # HAMi-core compacts the table: slots past proc_num are stale and must not count
    got = region.parse_bytes(build(_spec(proc_num=1)))
    assert [p.pid for p in got.processes] == [10]
    assert got.devices[0].used_bytes == 112 * MIB


def test_an_unused_device_entry_is_left_out() -> None:
    got = region.parse_bytes(build(_spec(uuids=["GPU-aaaa", ""], device_num=2)))
    assert [d.uuid for d in got.devices] == ["GPU-aaaa"]


GOOD = build(_spec())
BAD = [
    ("empty", b"", "truncated"),
    ("eight-bytes", GOOD[:8], "truncated"),
    ("header-only", GOOD[:2000], "truncated"),
    ("half", GOOD[: len(GOOD) // 2], "truncated"),
    ("one-slot-short", GOOD[:-2000], "truncated"),
    ("foreign", b"\x7fELF" + GOOD[4:], "not a HAMi-core shared region"),
    ("zeros", bytes(len(GOOD)), "not a HAMi-core shared region"),
    ("uninitialised-magic", build(_spec(magic=1)), "not a HAMi-core shared region"),
    ("version-2", build(_spec(version=(2, 0))), "unsupported shared region version 2.0"),
    ("version-0-with-v1-size", build(_spec(version=(0, 0))), "unsupported shared region version 0.0"),
    ("devices-17", build(_spec(device_num=17)), "device count 17"),
    ("devices-huge", build(_spec(device_num=2**63)), "device count"),
    ("procs-negative", build(_spec(proc_num=-1)), "process count -1"),
    ("procs-2000", build(_spec(proc_num=2000)), "process count 2000"),
    ("uuid-not-text", build(_spec(uuids=["GPU-\x01\x02"])), "not printable"),
]


@pytest.mark.parametrize(("data", "message"), [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_bad_regions_are_refused_with_the_reason(data: bytes, message: str) -> None:
    with pytest.raises(region.RegionError, match=message):
        region.parse_bytes(data)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=4096))
def test_garbage_bytes_never_crash(data: bytes) -> None:
    with contextlib.suppress(region.RegionError):
        region.parse_bytes(data)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, len(GOOD) - 1), st.integers(0, 255)), max_size=40), st.integers(0, 64)
)
def test_a_corrupted_region_never_crashes(flips: list[tuple[int, int]], cut: int) -> None:
    data = bytearray(GOOD)
    for offset, value in flips + [(o, v) for o, v in ((0, 0x4E), (56, 0xFF), (64, 0x80)) if cut % 7 == 0]:
        data[offset] = value
    try:
        got = region.parse_bytes(bytes(data[: len(data) - cut * 997]))
    except region.RegionError:
        return
    assert len(got.devices) <= region.MAX_DEVICES
    assert len(got.processes) <= region.MAX_PROCS


def test_read_a_file(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "x.cache"
    path.write_bytes(GOOD)
    assert region.read(path) == region.parse_bytes(GOOD)


def test_files_that_are_not_regions(tmp_path: pathlib.Path) -> None:
    (tmp_path / "empty.cache").write_bytes(b"")
    (tmp_path / "target").write_bytes(GOOD)
    (tmp_path / "link.cache").symlink_to(tmp_path / "target")
    os.mkfifo(tmp_path / "fifo.cache")
    (tmp_path / "dir.cache").mkdir()
    for name, message in [
        ("empty.cache", "truncated"),
        ("link.cache", "cannot open"),
        ("fifo.cache", "not a regular file"),
        ("dir.cache", "not a regular file"),
        ("missing.cache", "cannot open"),
    ]:
        with pytest.raises(region.RegionError, match=message):
            region.read(tmp_path / name)
