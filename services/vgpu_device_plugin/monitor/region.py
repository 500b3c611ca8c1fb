"""Reading HAMi-core's shared region: what one GPU container records about its own GPU use.

HAMi-core (``libvgpu.so``, preloaded in every GPU container) keeps one memory-mapped file per
container, at ``CUDA_DEVICE_MEMORY_SHARED_CACHE`` (our Allocate points it into the host directory
``<hook>/vgpu/containers/<podUID>_<container>/``). Its layout is HAMi-core's ``shared_region_t``
(``src/multiprocess/multiprocess_memory_limit.h``), as HAMi's vGPU monitor reads it
(``pkg/monitor/nvidia/v0``, ``v1``); little-endian, C alignment::

    shared_region_t                      v1 offset (v0)
      int32  initialized_flag            0      (0)    == 19920718 once HAMi-core set it up
      uint32 major_version, minor_version 4, 8  (-)    v1: major 1; v0 has no version fields
      int32  sm_init_flag                12     (4)
      owner pid + sem_t (32 bytes)       16     (8)
      uint64 device_num                  56     (48)   devices in use, at most 16
      char   uuids[16][96]               64     (56)   NUL-terminated GPU UUIDs
      uint64 limit[16]                   1600   (1592) memory limit per device (bytes)
      uint64 sm_limit[16]                1728   (1720) SM limit per device (percent)
      shrreg_proc_slot_t procs[1024]     1856   (1848) one per process (1960 bytes; v0: 1168)
      int32  proc_num, utilization_switch, recent_kernel, priority
      int64  last_kernel_time            v1 only (unix seconds)

    shrreg_proc_slot_t
      int32 pid, hostpid                 0, 4   (the container's pid; the host's, as NVML sees it)
      device_memory_t used[16]           8      context, module, data, offset, total (+3 unused in v1)
      uint64 monitorused[16]             NVML's per-process figure, as HAMi-core last read it
      device_util_t device_util[16]      dec, enc, sm utilisation (+3 unused in v1)
      int32 status

A v0 file is recognised by its size (``sizeof(shared_region_t) + 1`` = 1,197,897 bytes, as HAMi
does: HAMi-core writes one byte past the struct to size the file), a v1 file by ``major_version``.
Nothing read from the file is trusted as a size: ``device_num`` and ``proc_num`` are checked
against the fixed arrays, and a file shorter than its layout is refused. Every problem is a
``RegionError`` naming it; the reader never raises anything else on any bytes.
"""

from __future__ import annotations

import os
import stat
import struct
from collections.abc import Callable
from dataclasses import dataclass

MAGIC = 19920718
MAX_DEVICES = 16
MAX_PROCS = 1024
UUID_BYTES = 96


class RegionError(Exception):
    """The file is not a shared region this reader understands (or not a complete one)."""


@dataclass(frozen=True)
class Layout:
    """Where the fields are, for one version of the struct."""

    version: str
    num: int
    uuids: int
    limit: int
    sm_limit: int
    procs: int
    slot_size: int
    memory_size: int  # device_memory_t
    monitorused: int  # within a slot
    util: int  # within a slot: device_util_t[16]
    util_size: int
    tail: int  # proc_num, utilization_switch, recent_kernel, priority (4 x int32)
    last_kernel: int | None
    size: int  # sizeof(shared_region_t)
    all_slots: bool  # v0 readers sum every slot; v1 readers the first proc_num


V0 = Layout(
    version="0",
    num=48,
    uuids=56,
    limit=1592,
    sm_limit=1720,
    procs=1848,
    slot_size=1168,
    memory_size=40,
    monitorused=648,
    util=776,
    util_size=24,
    tail=1848 + MAX_PROCS * 1168,
    last_kernel=None,
    size=1848 + MAX_PROCS * 1168 + 16,
    all_slots=True,
)
V1 = Layout(
    version="1",
    num=56,
    uuids=64,
    limit=1600,
    sm_limit=1728,
    procs=1856,
    slot_size=1960,
    memory_size=64,
    monitorused=1032,
    util=1160,
    util_size=48,
    tail=1856 + MAX_PROCS * 1960,
    last_kernel=1856 + MAX_PROCS * 1960 + 16,
    size=1856 + MAX_PROCS * 1960 + 56,
    all_slots=False,
)
V0_FILE_SIZE = V0.size + 1

_HEADER = struct.Struct("<iII")
_TAIL = struct.Struct("<iiii")
_I64 = struct.Struct("<q")
_PIDS = struct.Struct("<ii")
_MEMORY = struct.Struct("<5Q")
_U64 = struct.Struct("<Q")


@dataclass(frozen=True)
class DeviceUse:
    """One GPU of the container: its limits and the sums over the container's processes."""

    index: int  # position in the region (HAMi's ``vdeviceid``)
    uuid: str
    limit_bytes: int
    sm_limit_percent: int
    used_bytes: int  # Σ total
    context_bytes: int
    module_bytes: int
    data_bytes: int
    offset_bytes: int
    sm_util_percent: int  # Σ sm_util
    nvml_used_bytes: int  # Σ monitorused (HAMi-core's copy of NVML's per-process figure)


@dataclass(frozen=True)
class Process:
    pid: int
    host_pid: int


@dataclass(frozen=True)
class Region:
    version: str  # "0", or "<major>.<minor>"
    devices: tuple[DeviceUse, ...]
    processes: tuple[Process, ...]
    priority: int
    utilization_switch: int
    recent_kernel: int
    last_kernel_time: int  # unix seconds; 0 when unknown (v0, or no kernel yet)


Reader = Callable[[int, int], bytes]  # (offset, length) -> exactly that many bytes, else RegionError


def layout_of(head: bytes, file_size: int) -> tuple[Layout, str]:
    """The layout of a region of ``file_size`` bytes starting with ``head`` (12 bytes), and its
    version text; RegionError when it is not one this reader knows."""
    flag, major, minor = _HEADER.unpack_from(head, 0)
    if flag != MAGIC:
        raise RegionError(f"not a HAMi-core shared region (initialized flag {flag}, want {MAGIC})")
    if file_size == V0_FILE_SIZE:
        return V0, "0"
    if major != 1:
        raise RegionError(f"unsupported shared region version {major}.{minor} (this reader knows 0 and 1.x)")
    if file_size < V1.size:
        raise RegionError(f"truncated: {file_size} bytes, a version {major}.{minor} region needs {V1.size}")
    return V1, f"{major}.{minor}"


def _uuid(raw: bytes) -> str:
    text = raw.split(b"\0", 1)[0].decode("ascii", errors="replace")
    if not text.isprintable():
        raise RegionError(f"device uuid {text!r} is not printable text")
    return text


def bytes_reader(data: bytes) -> Reader:
    def at(offset: int, length: int) -> bytes:
        if offset + length > len(data):
            raise RegionError(f"truncated: {len(data)} bytes, need {offset + length}")
        return data[offset : offset + length]

    return at


def parse(at: Reader, file_size: int) -> Region:
    """Decode a region of ``file_size`` bytes read through ``at``: only the header, the tail and the
    slots in use are read."""
    if file_size < _HEADER.size:
        raise RegionError(f"truncated: {file_size} bytes, not even a header")
    layout, version = layout_of(at(0, _HEADER.size), file_size)
    header = at(0, layout.procs)
    tail = at(layout.tail, layout.size - layout.tail)
    (count,) = _U64.unpack_from(header, layout.num)
    if count > MAX_DEVICES:
        raise RegionError(f"device count {count} is more than the {MAX_DEVICES} the struct holds")
    proc_num, switch, recent, priority = _TAIL.unpack_from(tail, 0)
    if layout.all_slots:
        slots = MAX_PROCS
    elif 0 <= proc_num <= MAX_PROCS:
        slots = proc_num
    else:
        raise RegionError(f"process count {proc_num} is outside 0..{MAX_PROCS}")
    last_kernel = (
        0 if layout.last_kernel is None else _I64.unpack_from(tail, layout.last_kernel - layout.tail)[0]
    )
    table = at(layout.procs, slots * layout.slot_size)
    sums = [[0] * 7 for _ in range(count)]  # context, module, data, offset, total, sm, monitor
    processes = []
    for s in range(slots):
        base = s * layout.slot_size
        pid, host_pid = _PIDS.unpack_from(table, base)
        if pid <= 0:
            continue  # a free slot
        processes.append(Process(pid, host_pid))
        for d in range(count):
            memory = _MEMORY.unpack_from(table, base + 8 + d * layout.memory_size)
            row = sums[d]
            for k in range(5):
                row[k] += memory[k]
            row[5] += _U64.unpack_from(table, base + layout.util + d * layout.util_size + 16)[0]
            row[6] += _U64.unpack_from(table, base + layout.monitorused + d * 8)[0]
    devices = []
    for d in range(count):
        uuid = _uuid(header[layout.uuids + d * UUID_BYTES : layout.uuids + (d + 1) * UUID_BYTES])
        if not uuid:
            continue  # HAMi's IsValidUUID: an empty name is an unused entry
        context, module, data_bytes, offset, total, sm, monitor = sums[d]
        devices.append(
            DeviceUse(
                index=d,
                uuid=uuid,
                limit_bytes=_U64.unpack_from(header, layout.limit + d * 8)[0],
                sm_limit_percent=_U64.unpack_from(header, layout.sm_limit + d * 8)[0],
                used_bytes=total,
                context_bytes=context,
                module_bytes=module,
                data_bytes=data_bytes,
                offset_bytes=offset,
                sm_util_percent=sm,
                nvml_used_bytes=monitor,
            )
        )
    return Region(version, tuple(devices), tuple(processes), priority, switch, recent, last_kernel)


def parse_bytes(data: bytes) -> Region:
    """Decode a whole region held in memory (tests, and any bytes at all: RegionError or a Region)."""
    return parse(bytes_reader(data), len(data))


def read(path: str | os.PathLike[str]) -> Region:
    """Read and decode one region file; RegionError for any file that is not a whole region.

    ``pread`` rather than ``mmap``: the file lives in a directory the container can write, and a
    mapping of a file truncated while it is read kills the reader with SIGBUS; a short read is
    just a RegionError. Only the header, the tail and the slots in use are read (a few KiB)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise RegionError(f"cannot open: {exc.strerror or exc}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise RegionError("not a regular file")

        def at(offset: int, length: int) -> bytes:
            try:
                got = os.pread(fd, length, offset)
            except OSError as exc:
                raise RegionError(f"cannot read: {exc.strerror or exc}") from None
            if len(got) != length:
                raise RegionError(f"truncated while read: {offset + len(got)} bytes, need {offset + length}")
            return got

        return parse(at, info.st_size)
    finally:
        os.close(fd)
