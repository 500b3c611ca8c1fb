"""A stand-in for the ``pynvml`` module: the functions NvmlBackend calls, over a list of GPUs."""

from __future__ import annotations

import types
from dataclasses import dataclass, field
from typing import Any


class NVMLError(Exception):
    pass


class NVMLError_Timeout(NVMLError):
    pass


class NVMLError_NotSupported(NVMLError):
    pass


class NVMLError_LibraryNotFound(NVMLError):
    pass


@dataclass
class FakeGpu:
    uuid: str
    name: str = "NVIDIA A100-SXM4-40GB"
    memory: int = 40 << 30
    minor: int = 0
    bus_id: bytes | str = b"00000000:3B:00.0"
    mig_mode: tuple[int, int] | None = None  # None: NotSupported
    migs: list[FakeGpu] = field(default_factory=list)
    gi: int = 0
    ci: int = 0
    broken: bool = False
    pages_pending: int | None = 0  # None: NotSupported
    remapped: tuple[int, int, int, int] | None = (0, 0, 0, 0)  # None: NotSupported
    used: Any = 0  # bytes (anything, to feed garbage)
    # running processes as (pid, usedGpuMemory bytes or None); None: NotSupported; an exception: raised
    compute: Any = field(default_factory=list)
    graphics: Any = field(default_factory=list)
    utilization: Any = 0  # percent (anything, to feed garbage)


def make_module(gpus: list[FakeGpu], *, init_error: Exception | None = None) -> Any:
    """A module-like object; ``.events`` is a list the test fills with (handle, type, data)."""
    m = types.SimpleNamespace()
    m.NVMLError = NVMLError
    m.NVMLError_Timeout = NVMLError_Timeout
    m.NVMLError_NotSupported = NVMLError_NotSupported
    m.NVML_DEVICE_MIG_ENABLE = 1
    m.nvmlEventTypeXidCriticalError = 8
    m.events = []
    m.calls = []
    m.register_fail = set()

    def init() -> None:
        m.calls.append("init")
        if init_error is not None:
            raise init_error

    def check(gpu: FakeGpu) -> FakeGpu:
        if gpu.broken:
            raise NVMLError("Unknown Error")
        return gpu

    m.nvmlInit = init
    m.nvmlShutdown = lambda: m.calls.append("shutdown")
    m.nvmlSystemGetDriverVersion = lambda: "550.54"
    m.nvmlDeviceGetCount = lambda: len(gpus)
    m.nvmlDeviceGetHandleByIndex = lambda i: gpus[i]
    m.nvmlDeviceGetUUID = lambda h: check(h).uuid
    m.nvmlDeviceGetName = lambda h: check(h).name
    m.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=check(h).memory, used=check(h).used)
    m.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=check(h).utilization, memory=0)

    def processes(listed: Any) -> Any:
        if listed is None:
            raise NVMLError_NotSupported("Not Supported")
        if isinstance(listed, Exception):
            raise listed
        if not isinstance(listed, list):
            return listed
        return [types.SimpleNamespace(pid=pid, usedGpuMemory=mem) for pid, mem in listed]

    m.nvmlDeviceGetComputeRunningProcesses = lambda h: processes(check(h).compute)
    m.nvmlDeviceGetGraphicsRunningProcesses = lambda h: processes(check(h).graphics)
    m.nvmlDeviceGetMinorNumber = lambda h: check(h).minor
    m.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(busId=check(h).bus_id)

    def mig_mode(h: FakeGpu) -> tuple[int, int]:
        if h.mig_mode is None:
            raise NVMLError_NotSupported("Not Supported")
        return h.mig_mode

    m.nvmlDeviceGetMigMode = mig_mode
    m.nvmlDeviceGetMaxMigDeviceCount = lambda h: 7

    def mig_handle(h: FakeGpu, i: int) -> FakeGpu:
        if i >= len(h.migs):
            raise NVMLError("Not Found")
        return h.migs[i]

    m.nvmlDeviceGetMigDeviceHandleByIndex = mig_handle
    m.nvmlDeviceGetGpuInstanceId = lambda h: h.gi
    m.nvmlDeviceGetComputeInstanceId = lambda h: h.ci

    def by_uuid(u: str) -> FakeGpu:
        for g in gpus:
            if g.uuid == u:
                return g
        raise NVMLError("Not Found")

    m.nvmlDeviceGetHandleByUUID = by_uuid
    m.NVML_FEATURE_ENABLED = 1

    def pages(h: FakeGpu) -> int:
        if h.pages_pending is None:
            raise NVMLError_NotSupported("Not Supported")
        return h.pages_pending

    def remapped(h: FakeGpu) -> tuple[int, int, int, int]:
        if h.remapped is None:
            raise NVMLError_NotSupported("Not Supported")
        return h.remapped

    m.nvmlDeviceGetRetiredPagesPendingStatus = pages
    m.nvmlDeviceGetRemappedRows = remapped
    m.nvmlEventSetCreate = lambda: "event-set"
    m.nvmlEventSetFree = lambda s: m.calls.append("free")

    def register(h: FakeGpu, kind: int, s: str) -> None:
        if h.uuid in m.register_fail:
            raise NVMLError("Insufficient Permissions")
        m.calls.append(("register", h.uuid, kind))

    m.nvmlDeviceRegisterEvents = register

    def wait(s: str, timeout_ms: int) -> Any:
        if not m.events:
            raise NVMLError_Timeout("Timeout")
        item = m.events.pop(0)
        if isinstance(item, Exception):
            raise item
        handle, kind, data = item
        return types.SimpleNamespace(device=handle, eventType=kind, eventData=data)

    m.nvmlEventSetWait_v2 = wait
    return m
