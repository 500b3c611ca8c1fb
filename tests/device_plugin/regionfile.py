"""Writes HAMi-core shared region files for tests, in the documented layout.

The layout comes from HAMi-core's ``shared_region_t`` (``multiprocess_memory_limit.h``) written as
``struct`` formats with native C alignment (``@``), so the offsets here are computed by ``struct``
from the C declarations, independently of the hand-written offsets of the reader under test.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

MAGIC = 19920718
DEVICES = 16
PROCS = 1024

# v1 (major_version 1): device_memory_t has 3 unused u64, device_util_t 3, the slot 3, the region 4
V1_SLOT = struct.Struct("@ii" + f"{DEVICES * 8}Q" + f"{DEVICES}Q" + f"{DEVICES * 6}Q" + "i3Q")
V1_HEAD = struct.Struct("@iIIiI32sQ" + f"{DEVICES * 96}s" + f"{DEVICES}Q{DEVICES}Q")
V1_TAIL = struct.Struct("@iiiiq4Q")
# v0 (no version fields, no unused fields)
V0_SLOT = struct.Struct("@ii" + f"{DEVICES * 5}Q" + f"{DEVICES}Q" + f"{DEVICES * 3}Q" + "i0Q")
V0_HEAD = struct.Struct("@iiI32sQ" + f"{DEVICES * 96}s" + f"{DEVICES}Q{DEVICES}Q")
V0_TAIL = struct.Struct("@iiii0Q")


@dataclass
class Slot:
    pid: int
    host_pid: int
    # device index -> (context, module, data, offset, total) bytes
    memory: dict[int, tuple[int, int, int, int, int]] = field(default_factory=dict)
    sm_util: dict[int, int] = field(default_factory=dict)
    monitor: dict[int, int] = field(default_factory=dict)  # NVML per-process bytes


@dataclass
class RegionSpec:
    uuids: list[str]
    limits: list[int]
    sm_limits: list[int] | None = None
    slots: list[Slot] = field(default_factory=list)
    version: tuple[int, int] | None = (1, 0)  # None: the v0 layout
    magic: int = MAGIC
    device_num: int | None = None  # default len(uuids)
    proc_num: int | None = None  # default len(slots)
    priority: int = 1
    last_kernel_time: int = 0


def _slot_bytes(slot: Slot, *, v1: bool) -> bytes:
    per_memory = 8 if v1 else 5
    per_util = 6 if v1 else 3
    used = [0] * (DEVICES * per_memory)
    util = [0] * (DEVICES * per_util)
    monitor = [0] * DEVICES
    for d, fields in slot.memory.items():
        used[d * per_memory : d * per_memory + 5] = fields
    for d, sm in slot.sm_util.items():
        util[d * per_util + 2] = sm
    for d, b in slot.monitor.items():
        monitor[d] = b
    if v1:
        return V1_SLOT.pack(slot.pid, slot.host_pid, *used, *monitor, *util, 0, 0, 0, 0)
    return V0_SLOT.pack(slot.pid, slot.host_pid, *used, *monitor, *util, 0)


def build(spec: RegionSpec) -> bytes:
    """The file content HAMi-core leaves: the struct, then the one byte it writes past it."""
    v1 = spec.version is not None
    uuids = b"".join(u.encode().ljust(96, b"\0")[:96] for u in spec.uuids).ljust(DEVICES * 96, b"\0")
    limits = (spec.limits + [0] * DEVICES)[:DEVICES]
    sm = ((spec.sm_limits or [100] * len(spec.uuids)) + [0] * DEVICES)[:DEVICES]
    num = len(spec.uuids) if spec.device_num is None else spec.device_num
    slot_struct = V1_SLOT if v1 else V0_SLOT
    slots = b"".join(_slot_bytes(s, v1=v1) for s in spec.slots).ljust(PROCS * slot_struct.size, b"\0")
    proc_num = len(spec.slots) if spec.proc_num is None else spec.proc_num
    if spec.version is not None:
        major, minor = spec.version
        head = V1_HEAD.pack(spec.magic, major, minor, 1, 4242, b"", num, uuids, *limits, *sm)
        tail = V1_TAIL.pack(proc_num, 0, 0, spec.priority, spec.last_kernel_time, 0, 0, 0, 0)
    else:
        head = V0_HEAD.pack(spec.magic, 1, 4242, b"", num, uuids, *limits, *sm)
        tail = V0_TAIL.pack(proc_num, 0, 0, spec.priority)
    return head + slots + tail + b"\0"
