"""The NVML backend: the only module that talks to ``pynvml`` (from the ``nvidia-ml-py`` package).

The pynvml module is a constructor parameter, so tests pass a fake module object and production
passes ``import pynvml``. Every ``NVMLError`` (and a missing library) becomes ``GpuBackendError``.
NUMA nodes come from sysfs (``<sysfs_root>/bus/pci/devices/<bus id>/numa_node``), as HAMi reads them.
MIG layout is only read, never changed.
"""

from __future__ import annotations

import logging
import pathlib
import threading
from types import ModuleType
from typing import Any

from vgpu.core.device import GpuUuid
from vgpu.core.errors import GpuBackendError
from vgpu.gpu.port import DeviceInfo, EventKind, GpuEvent, GpuMemoryUsage, GpuProcess, MigInstance

log = logging.getLogger(__name__)


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace").rstrip("\x00")
    return str(value)


def _bytes(value: Any) -> int | None:
    """A non-negative byte count as NVML gives it, else None (pynvml maps "not available" to None)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def normalize_bus_id(bus_id: str) -> str:
    """NVML's ``00000000:3B:00.0`` → sysfs's ``0000:3b:00.0`` (lowercase, 4-digit domain)."""
    text = bus_id.strip().lower()
    domain, sep, rest = text.partition(":")
    if sep and len(domain) > 4:
        domain = domain[-4:]
        return f"{domain}:{rest}"
    return text


def read_numa_node(sysfs_root: pathlib.Path, bus_id: str) -> int | None:
    """The NUMA node of a PCI device; None when unreadable or negative (no NUMA)."""
    path = sysfs_root / "bus" / "pci" / "devices" / normalize_bus_id(bus_id) / "numa_node"
    try:
        value = int(path.read_text().strip())
    except (OSError, ValueError):
        return None
    return value if value >= 0 else None


def _mig_profile_from_name(name: str) -> str:
    """``NVIDIA A100-SXM4-40GB MIG 1g.5gb`` → ``1g.5gb`` (the name is all NVML offers cheaply)."""
    _, sep, profile = name.rpartition("MIG ")
    return profile.strip() if sep else name


class NvmlBackend:
    """GpuBackend over NVML. ``open()`` initialises the library; failures say NVML is not available."""

    def __init__(self, nvml: ModuleType, *, sysfs_root: pathlib.Path = pathlib.Path("/sys")) -> None:
        self._nvml = nvml
        self._sysfs_root = sysfs_root
        self._lock = threading.Lock()
        self._open = False
        self._event_set: Any = None
        self._interrupted = threading.Event()
        self._pending: list[GpuEvent] = []
        self._uuid_at: dict[int, GpuUuid] = {}  # index → UUID as devices() last read it

    def _error(self, what: str, exc: BaseException) -> GpuBackendError:
        return GpuBackendError(f"NVML {what} failed: {exc}")

    def open(self) -> None:
        try:
            self._nvml.nvmlInit()
        except (self._nvml.NVMLError, OSError) as exc:
            raise GpuBackendError(f"NVML not available: {exc}") from None
        self._open = True
        try:
            log.info("NVML initialised: driver %s", _text(self._nvml.nvmlSystemGetDriverVersion()))
        except self._nvml.NVMLError as exc:
            log.info("NVML initialised; driver version unreadable: %s", exc)

    def close(self) -> None:
        with self._lock:
            if self._event_set is not None:
                try:
                    self._nvml.nvmlEventSetFree(self._event_set)
                except self._nvml.NVMLError as exc:
                    log.warning("NVML event set free failed: %s", exc)
                self._event_set = None
            if self._open:
                self._open = False
                try:
                    self._nvml.nvmlShutdown()
                except self._nvml.NVMLError as exc:
                    log.warning("NVML shutdown failed: %s", exc)

    def _require_open(self) -> None:
        if not self._open:
            raise GpuBackendError("NVML not available: backend not opened")

    def devices(self) -> list[DeviceInfo]:
        self._require_open()
        nv = self._nvml
        try:
            count = nv.nvmlDeviceGetCount()
        except nv.NVMLError as exc:
            raise self._error("device count", exc) from None
        out: list[DeviceInfo] = []
        for index in range(count):
            try:
                handle = nv.nvmlDeviceGetHandleByIndex(index)
                uuid = GpuUuid(_text(nv.nvmlDeviceGetUUID(handle)))
                name = _text(nv.nvmlDeviceGetName(handle))
                memory = int(nv.nvmlDeviceGetMemoryInfo(handle).total)
                minor = int(nv.nvmlDeviceGetMinorNumber(handle))
                bus_id = _text(nv.nvmlDeviceGetPciInfo(handle).busId)
            except nv.NVMLError as exc:  # e.g. off the bus: the other GPUs are still served
                log.error("NVML reading GPU %d failed: %s; GPU left out", index, exc)
                continue
            try:
                mig_enabled, instances = self._mig(handle, index)
            except GpuBackendError as exc:
                log.error("GPU %d (%s): %s; GPU left out", index, uuid, exc)
                continue
            self._uuid_at[index] = uuid
            out.append(
                DeviceInfo(
                    uuid=uuid,
                    index=index,
                    name=name,
                    memory_total_bytes=memory,
                    minor_number=minor,
                    pci_bus_id=bus_id,
                    numa_node=read_numa_node(self._sysfs_root, bus_id),
                    mig_enabled=mig_enabled,
                    mig_instances=instances,
                )
            )
        return out

    def _mig(self, handle: Any, index: int) -> tuple[bool, tuple[MigInstance, ...]]:
        nv = self._nvml
        try:
            current, _pending = nv.nvmlDeviceGetMigMode(handle)
        except nv.NVMLError:
            return False, ()  # not supported (pre-Ampere) or not permitted: no MIG
        if current != nv.NVML_DEVICE_MIG_ENABLE:
            return False, ()
        instances: list[MigInstance] = []
        try:
            slots = nv.nvmlDeviceGetMaxMigDeviceCount(handle)
        except nv.NVMLError as exc:
            raise self._error(f"MIG device count of GPU {index}", exc) from None
        for slot in range(slots):
            try:
                mig = nv.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            except nv.NVMLError:
                continue  # an empty slot
            try:
                instances.append(
                    MigInstance(
                        uuid=_text(nv.nvmlDeviceGetUUID(mig)),
                        profile=_mig_profile_from_name(_text(nv.nvmlDeviceGetName(mig))),
                        memory_total_bytes=int(nv.nvmlDeviceGetMemoryInfo(mig).total),
                        gpu_instance_id=int(nv.nvmlDeviceGetGpuInstanceId(mig)),
                        compute_instance_id=int(nv.nvmlDeviceGetComputeInstanceId(mig)),
                    )
                )
            except nv.NVMLError as exc:
                raise self._error(f"reading MIG device {slot} of GPU {index}", exc) from None
        return True, tuple(instances)

    def _ensure_event_set(self) -> None:
        """Create the event set on first use; GPUs whose events cannot be registered are LOST (one
        that cannot even be read is LOST under the UUID ``devices()`` last read at its index)."""
        nv = self._nvml
        with self._lock:
            if self._event_set is not None:
                return
            try:
                event_set = nv.nvmlEventSetCreate()
                count = nv.nvmlDeviceGetCount()
            except nv.NVMLError as exc:
                raise self._error("event set create", exc) from None
            for index in range(count):
                try:
                    handle = nv.nvmlDeviceGetHandleByIndex(index)
                    uuid = GpuUuid(_text(nv.nvmlDeviceGetUUID(handle)))
                except nv.NVMLError as exc:
                    known = self._uuid_at.get(index)
                    if known is None:  # never listed by devices(): no GPU to mark
                        log.error("NVML reading GPU %d for events failed: %s; no events from it", index, exc)
                    else:
                        self._pending.append(
                            GpuEvent(EventKind.LOST, known, detail=f"reading GPU {index} failed: {exc}")
                        )
                    continue
                try:
                    nv.nvmlDeviceRegisterEvents(handle, nv.nvmlEventTypeXidCriticalError, event_set)
                except nv.NVMLError_NotSupported:
                    log.warning("GPU %s is too old for XID events; no event health checks on it", uuid)
                except nv.NVMLError as exc:
                    self._pending.append(
                        GpuEvent(EventKind.LOST, uuid, detail=f"event registration failed: {exc}")
                    )
            self._event_set = event_set

    def wait_event(self, timeout_s: float) -> GpuEvent | None:
        """The next XID event, None after ``timeout_s``; GpuBackendError when the wait itself fails
        (a GPU off the bus answers at once, every time: the caller backs off)."""
        self._require_open()
        nv = self._nvml
        self._ensure_event_set()
        if self._pending:
            return self._pending.pop(0)
        if self._interrupted.is_set():
            self._interrupted.clear()
            return None
        try:
            data = nv.nvmlEventSetWait_v2(self._event_set, max(0, int(timeout_s * 1000)))
        except nv.NVMLError_Timeout:
            return None
        except nv.NVMLError as exc:
            raise self._error("event wait", exc) from None
        if data.eventType != nv.nvmlEventTypeXidCriticalError:
            return None
        try:
            uuid: GpuUuid | None = GpuUuid(_text(nv.nvmlDeviceGetUUID(data.device)))
        except nv.NVMLError as exc:
            return GpuEvent(
                EventKind.LOST, None, xid=int(data.eventData), detail=f"event UUID unreadable: {exc}"
            )
        return GpuEvent(EventKind.XID, uuid, xid=int(data.eventData))

    def probe(self, uuid: GpuUuid) -> bool:
        """The GPU answers and needs no reset: no page retirement or row remapping pending."""
        if not self._open:
            return False
        nv = self._nvml
        try:
            handle = nv.nvmlDeviceGetHandleByUUID(uuid)
            nv.nvmlDeviceGetMemoryInfo(handle)
        except nv.NVMLError:
            return False
        try:
            if nv.nvmlDeviceGetRetiredPagesPendingStatus(handle) == nv.NVML_FEATURE_ENABLED:
                log.warning("GPU %s: retired pages pending; it needs a reset", uuid)
                return False
        except nv.NVMLError:
            pass  # not supported (e.g. Ampere and later remap rows instead)
        try:
            _corrected, _uncorrected, pending, failure = nv.nvmlDeviceGetRemappedRows(handle)
            if pending or failure:
                log.warning(
                    "GPU %s: row remapping %s; it needs a reset", uuid, "failed" if failure else "pending"
                )
                return False
        except nv.NVMLError:
            pass  # not supported before Ampere
        return True

    def memory_usage(self, uuid: GpuUuid) -> GpuMemoryUsage:
        """``nvmlDeviceGetMemoryInfo().used`` and the compute and graphics processes (a process in
        both lists is counted once, with the larger figure). A list NVML does not support on this
        GPU is empty; anything that is not a byte count is a GpuBackendError naming the GPU."""
        self._require_open()
        nv = self._nvml
        try:
            handle = nv.nvmlDeviceGetHandleByUUID(uuid)
            info = nv.nvmlDeviceGetMemoryInfo(handle)
        except nv.NVMLError as exc:
            raise self._error(f"memory info of GPU {uuid}", exc) from None
        used = _bytes(getattr(info, "used", None))
        total = _bytes(getattr(info, "total", None))
        if used is None or total is None or used > total:
            raise GpuBackendError(
                f"NVML memory info of GPU {uuid}: not a memory reading "
                f"(used {getattr(info, 'used', None)!r} of {getattr(info, 'total', None)!r} bytes)"
            )
        found: dict[int, int | None] = {}
        for what in ("Compute", "Graphics"):
            call = getattr(nv, f"nvmlDeviceGet{what}RunningProcesses", None)
            if call is None:
                continue
            try:
                listed = call(handle)
            except nv.NVMLError_NotSupported:
                continue
            except nv.NVMLError as exc:
                raise self._error(f"{what.lower()} processes of GPU {uuid}", exc) from None
            if not isinstance(listed, list | tuple):
                raise GpuBackendError(f"NVML {what.lower()} processes of GPU {uuid}: not a list: {listed!r}")
            for proc in listed:
                pid = getattr(proc, "pid", None)
                raw = getattr(proc, "usedGpuMemory", None)
                memory = _bytes(raw)
                if (
                    isinstance(pid, bool)
                    or not isinstance(pid, int)
                    or pid < 0
                    or (raw is not None and memory is None)
                ):
                    raise GpuBackendError(
                        f"NVML {what.lower()} processes of GPU {uuid}: not a process "
                        f"(pid {pid!r}, usedGpuMemory {raw!r})"
                    )
                have = found.get(pid)
                found[pid] = memory if have is None else max(have, memory or 0)
        processes = tuple(GpuProcess(pid, found[pid]) for pid in sorted(found))
        return GpuMemoryUsage(used, processes)

    def utilization_percent(self, uuid: GpuUuid) -> int:
        """``nvmlDeviceGetUtilizationRates().gpu``; anything but 0..100 is a GpuBackendError."""
        self._require_open()
        nv = self._nvml
        try:
            rates = nv.nvmlDeviceGetUtilizationRates(nv.nvmlDeviceGetHandleByUUID(uuid))
        except nv.NVMLError as exc:
            raise self._error(f"utilization of GPU {uuid}", exc) from None
        gpu = getattr(rates, "gpu", None)
        if isinstance(gpu, bool) or not isinstance(gpu, int) or not 0 <= gpu <= 100:
            raise GpuBackendError(f"NVML utilization of GPU {uuid}: not a percentage: {gpu!r}")
        return gpu

    def interrupt(self) -> None:
        # nvmlEventSetWait cannot be woken; the caller's short timeout bounds the wait instead.
        self._interrupted.set()


def load(*, sysfs_root: pathlib.Path = pathlib.Path("/sys")) -> NvmlBackend:
    """The production backend: imports ``pynvml`` (nvidia-ml-py); call ``open()`` next."""
    try:
        import pynvml
    except ImportError as exc:  # the package is a dependency; a broken install still gets a clear error
        raise GpuBackendError(f"NVML not available: cannot import pynvml: {exc}") from None
    return NvmlBackend(pynvml, sysfs_root=sysfs_root)
