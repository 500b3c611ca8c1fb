"""The fake GPU backend: GPUs described in YAML, with injectable XID events, vanishing GPUs and failures.

Used by tests and by the local cluster (``vgpu-device-plugin --backend fake --fake-gpus gpus.yaml``).
The YAML (keys camelCase; every key but ``name`` and ``memoryMib`` optional)::

    failInit: ""                  # non-empty: devices() raises GpuBackendError with this text
    gpus:
      - uuid: GPU-...             # default: derived from the seed (node name) and the index
        name: NVIDIA A100-SXM4-40GB
        memoryMib: 40960
        numa: 0                   # default: none
        minor: 0                  # default: the index
        pciBusId: "00000000:01:00.0"
        migEnabled: false
        migInstances: [{profile: 1g.10gb, memoryMib: 9856, gpuInstanceId: 1, computeInstanceId: 0,
                        start: 0, size: 1, uuid: MIG-...}]
        reservedMib: 0            # memory used with no process (the driver's reserve)
        processes: [{pid: 4242, usedMib: 2000}]   # processes on the GPU (usedMib null: unknown)

Control methods (thread-safe) drive health: ``inject_xid``, ``inject_lost``, ``vanish``,
``restore``, ``set_probe_ok``, ``fail_devices``; and memory use: ``set_memory_usage`` (used memory
and processes, e.g. memory used outside kube-vgpu), ``set_utilization``, ``fail_memory_usage``.
"""

from __future__ import annotations

import collections
import threading
import uuid as uuidlib
from collections.abc import Mapping
from typing import Any

from vgpu.core.device import GpuUuid
from vgpu.core.errors import GpuBackendError
from vgpu.gpu.port import DeviceInfo, EventKind, GpuEvent, GpuMemoryUsage, GpuProcess, MigInstance

_GPU_KEYS = {
    "uuid",
    "name",
    "memoryMib",
    "numa",
    "minor",
    "pciBusId",
    "migEnabled",
    "migInstances",
    "reservedMib",
    "processes",
}
_PROCESS_KEYS = {"pid", "usedMib"}
_MIG_KEYS = {"profile", "memoryMib", "gpuInstanceId", "computeInstanceId", "start", "size", "uuid"}


def _int(raw: Mapping[str, Any], key: str, where: str, default: int | None = None) -> int:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise GpuBackendError(f"fake GPUs: {where}.{key}: expected a non-negative integer, got {value!r}")
    return value


def _str(raw: Mapping[str, Any], key: str, where: str, default: str | None = None) -> str:
    value = raw.get(key, default)
    if not isinstance(value, str) or not value:
        raise GpuBackendError(f"fake GPUs: {where}.{key}: expected a non-empty string, got {value!r}")
    return value


def _check_keys(raw: Any, allowed: set[str], where: str) -> Mapping[str, Any]:
    if not isinstance(raw, Mapping):
        raise GpuBackendError(f"fake GPUs: {where}: expected a mapping, got {raw!r}")
    unknown = sorted(str(k) for k in raw if k not in allowed)
    if unknown:
        raise GpuBackendError(f"fake GPUs: {where}: unknown keys {unknown} (known: {sorted(allowed)})")
    return raw


def _memory_usage(spec: Mapping[str, Any], where: str, total_bytes: int) -> GpuMemoryUsage:
    reserved = _int(spec, "reservedMib", where, 0)
    items = spec.get("processes", []) or []
    if not isinstance(items, list):
        raise GpuBackendError(f"fake GPUs: {where}.processes: expected a list")
    processes = []
    for j, item in enumerate(items):
        pwhere = f"{where}.processes[{j}]"
        proc = _check_keys(item, _PROCESS_KEYS, pwhere)
        used = None if proc.get("usedMib", 0) is None else _int(proc, "usedMib", pwhere, 0) << 20
        processes.append(GpuProcess(_int(proc, "pid", pwhere), used))
    return make_usage(reserved << 20, processes, total_bytes=total_bytes, where=where)


def make_usage(
    reserved_bytes: int, processes: list[GpuProcess], *, total_bytes: int, where: str
) -> GpuMemoryUsage:
    """Used memory = the reserve plus every process's known memory, checked against the GPU's size."""
    used = reserved_bytes + sum(p.used_memory_bytes or 0 for p in processes)
    if used > total_bytes:
        raise GpuBackendError(
            f"fake GPUs: {where}: {used >> 20} MiB used is more than the GPU's {total_bytes >> 20} MiB"
        )
    return GpuMemoryUsage(used, tuple(processes))


def parse_devices(raw: Any, *, seed: str = "") -> tuple[list[DeviceInfo], str]:
    """Parse the YAML document (already loaded) into devices and the ``failInit`` text."""
    devices, fail_init, _ = parse_document(raw, seed=seed)
    return devices, fail_init


def parse_document(
    raw: Any, *, seed: str = ""
) -> tuple[list[DeviceInfo], str, dict[GpuUuid, GpuMemoryUsage]]:
    """Parse the YAML document into devices, the ``failInit`` text and each GPU's memory use."""
    doc = _check_keys(raw if raw is not None else {}, {"gpus", "failInit"}, "document")
    fail_init = doc.get("failInit", "") or ""
    if not isinstance(fail_init, str):
        raise GpuBackendError("fake GPUs: failInit: expected a string")
    items = doc.get("gpus", []) or []
    if not isinstance(items, list):
        raise GpuBackendError("fake GPUs: gpus: expected a list")
    devices: list[DeviceInfo] = []
    usage: dict[GpuUuid, GpuMemoryUsage] = {}
    for index, item in enumerate(items):
        where = f"gpus[{index}]"
        spec = _check_keys(item, _GPU_KEYS, where)
        default_uuid = f"GPU-{uuidlib.uuid5(uuidlib.NAMESPACE_URL, f'vgpu-fake/{seed}/{index}')}"
        numa = spec.get("numa")
        if numa is not None:
            numa = _int(spec, "numa", where)
        mig_enabled = spec.get("migEnabled", False)
        if not isinstance(mig_enabled, bool):
            raise GpuBackendError(f"fake GPUs: {where}.migEnabled: expected true or false")
        mig_raw = spec.get("migInstances", []) or []
        if not isinstance(mig_raw, list):
            raise GpuBackendError(f"fake GPUs: {where}.migInstances: expected a list")
        gpu_uuid = _str(spec, "uuid", where, default_uuid)
        instances = []
        for j, m in enumerate(mig_raw):
            mwhere = f"{where}.migInstances[{j}]"
            mspec = _check_keys(m, _MIG_KEYS, mwhere)
            gi = _int(mspec, "gpuInstanceId", mwhere, j + 1)
            instances.append(
                MigInstance(
                    uuid=_str(
                        mspec,
                        "uuid",
                        mwhere,
                        f"MIG-{uuidlib.uuid5(uuidlib.NAMESPACE_URL, f'{gpu_uuid}/{j}')}",
                    ),
                    profile=_str(mspec, "profile", mwhere),
                    memory_total_bytes=_int(mspec, "memoryMib", mwhere) << 20,
                    gpu_instance_id=gi,
                    compute_instance_id=_int(mspec, "computeInstanceId", mwhere, 0),
                    placement_start=_int(mspec, "start", mwhere, 0),
                    placement_size=_int(mspec, "size", mwhere, 1),
                )
            )
        devices.append(
            DeviceInfo(
                uuid=GpuUuid(gpu_uuid),
                index=index,
                name=_str(spec, "name", where),
                memory_total_bytes=_int(spec, "memoryMib", where) << 20,
                minor_number=_int(spec, "minor", where, index),
                pci_bus_id=_str(spec, "pciBusId", where, f"00000000:{index + 1:02X}:00.0"),
                numa_node=numa,
                mig_enabled=mig_enabled,
                mig_instances=tuple(instances),
            )
        )
        usage[GpuUuid(gpu_uuid)] = _memory_usage(spec, where, devices[-1].memory_total_bytes)
    if len({d.uuid for d in devices}) != len(devices):
        raise GpuBackendError("fake GPUs: duplicate GPU UUIDs")
    return devices, fail_init, usage


class FakeGpuBackend:
    """A GpuBackend whose GPUs, events and failures are set by the caller."""

    def __init__(
        self,
        devices: list[DeviceInfo],
        *,
        fail_init: str = "",
        memory: Mapping[GpuUuid, GpuMemoryUsage] | None = None,
    ) -> None:
        self._all = list(devices)
        self._memory: dict[GpuUuid, GpuMemoryUsage] = dict(memory or {})
        self._memory_fail = ""
        self._utilization: dict[GpuUuid, int] = {}
        self._gone: set[GpuUuid] = set()
        self._probe_bad: set[GpuUuid] = set()
        self._fail = fail_init
        self._events: collections.deque[GpuEvent] = collections.deque()
        self._cond = threading.Condition()
        self._interrupted = False
        self._closed = False

    @classmethod
    def from_yaml(cls, raw: Any, *, seed: str = "") -> FakeGpuBackend:
        """Build from the loaded YAML document (see the module docstring)."""
        devices, fail_init, memory = parse_document(raw, seed=seed)
        return cls(devices, fail_init=fail_init, memory=memory)

    # --- GpuBackend ---------------------------------------------------------------------------

    def open(self) -> None:
        """As NvmlBackend.open: fails when the YAML says the driver is missing (``failInit``)."""
        with self._cond:
            if self._fail:
                raise GpuBackendError(f"NVML not available: {self._fail}")

    def devices(self) -> list[DeviceInfo]:
        with self._cond:
            if self._fail:
                raise GpuBackendError(f"NVML not available: {self._fail}")
            return [d for d in self._all if d.uuid not in self._gone]

    def wait_event(self, timeout_s: float) -> GpuEvent | None:
        with self._cond:
            if not self._events and not self._interrupted and not self._closed:
                self._cond.wait(timeout_s)
            self._interrupted = False
            return self._events.popleft() if self._events else None

    def probe(self, uuid: GpuUuid) -> bool:
        with self._cond:
            known = any(d.uuid == uuid for d in self._all)
            return known and uuid not in self._gone and uuid not in self._probe_bad and not self._fail

    def memory_usage(self, uuid: GpuUuid) -> GpuMemoryUsage:
        with self._cond:
            if self._fail or self._memory_fail:
                raise GpuBackendError(
                    f"NVML memory info of GPU {uuid} failed: {self._fail or self._memory_fail}"
                )
            if uuid in self._gone or not any(d.uuid == uuid for d in self._all):
                raise GpuBackendError(f"NVML memory info of GPU {uuid} failed: Not Found")
            return self._memory.get(uuid, GpuMemoryUsage(0))

    def utilization_percent(self, uuid: GpuUuid) -> int:
        with self._cond:
            if self._fail or self._memory_fail:
                raise GpuBackendError(
                    f"NVML utilization of GPU {uuid} failed: {self._fail or self._memory_fail}"
                )
            if uuid in self._gone or not any(d.uuid == uuid for d in self._all):
                raise GpuBackendError(f"NVML utilization of GPU {uuid} failed: Not Found")
            return self._utilization.get(uuid, 0)

    def interrupt(self) -> None:
        with self._cond:
            self._interrupted = True
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    # --- control ------------------------------------------------------------------------------

    def _push(self, event: GpuEvent) -> None:
        with self._cond:
            self._events.append(event)
            self._cond.notify_all()

    def inject_xid(self, uuid: str, xid: int) -> None:
        """An XID error event on one GPU (the probe keeps passing unless ``set_probe_ok`` says not)."""
        self._push(GpuEvent(EventKind.XID, GpuUuid(uuid), xid=xid))

    def inject_lost(self, uuid: str | None, detail: str = "injected") -> None:
        """The backend lost a GPU (or every GPU when ``uuid`` is None)."""
        self._push(GpuEvent(EventKind.LOST, GpuUuid(uuid) if uuid else None, detail=detail))

    def vanish(self, uuid: str) -> None:
        """The GPU falls off the bus: absent from devices(), probes fail."""
        with self._cond:
            self._gone.add(GpuUuid(uuid))
        self._push(GpuEvent(EventKind.LOST, GpuUuid(uuid), detail="GPU vanished"))

    def restore(self, uuid: str) -> None:
        with self._cond:
            self._gone.discard(GpuUuid(uuid))

    def set_probe_ok(self, uuid: str, ok: bool) -> None:
        with self._cond:
            if ok:
                self._probe_bad.discard(GpuUuid(uuid))
            else:
                self._probe_bad.add(GpuUuid(uuid))

    def set_memory_usage(
        self, uuid: str, *, reserved_mib: int = 0, processes: Mapping[int, int | None] | None = None
    ) -> None:
        """What the GPU reports as used: ``reserved_mib`` with no process, plus ``processes`` (pid to
        MiB; None: the driver cannot say). Memory used outside kube-vgpu is injected this way."""
        gpu = next((d for d in self._all if d.uuid == uuid), None)
        if gpu is None:
            raise GpuBackendError(f"fake GPUs: no GPU {uuid}")
        procs = [
            GpuProcess(pid, None if mib is None else mib << 20) for pid, mib in (processes or {}).items()
        ]
        usage = make_usage(reserved_mib << 20, procs, total_bytes=gpu.memory_total_bytes, where=uuid)
        with self._cond:
            self._memory[GpuUuid(uuid)] = usage

    def set_utilization(self, uuid: str, percent: int) -> None:
        """What utilization_percent() answers for the GPU (default 0)."""
        if not 0 <= percent <= 100:
            raise GpuBackendError(f"fake GPUs: utilization {percent} of {uuid} is not 0..100")
        with self._cond:
            self._utilization[GpuUuid(uuid)] = percent

    def fail_memory_usage(self, message: str) -> None:
        """Make memory_usage() and utilization_percent() fail (``""`` to heal), as a driver that stops answering does."""
        with self._cond:
            self._memory_fail = message

    def fail_devices(self, message: str) -> None:
        """Make devices() fail (``""`` to heal), as a missing driver does."""
        with self._cond:
            self._fail = message
