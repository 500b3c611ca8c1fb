"""Used memory and running processes per GPU (issue 13.4): the NVML adapter over a fake pynvml, with
garbage replies, and the fake backend's injection of memory used outside kube-vgpu."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from vgpu.core.device import GpuUuid
from vgpu.core.errors import GpuBackendError
from vgpu.gpu import fake, nvml
from vgpu.gpu.port import GpuMemoryUsage, GpuProcess

from tests.gpu.fake_pynvml import FakeGpu, NVMLError, make_module

MIB = 1 << 20


def usage_of(gpu: FakeGpu) -> GpuMemoryUsage:
    backend = nvml.NvmlBackend(make_module([gpu]))
    backend.open()
    return backend.memory_usage(GpuUuid(gpu.uuid))


GOOD = [
    ("idle", FakeGpu("GPU-a", used=0), GpuMemoryUsage(0, ())),
    (
        "compute-and-graphics",
        FakeGpu("GPU-a", used=900 * MIB, compute=[(20, 500 * MIB)], graphics=[(10, 100 * MIB)]),
        GpuMemoryUsage(900 * MIB, (GpuProcess(10, 100 * MIB), GpuProcess(20, 500 * MIB))),
    ),
    (
        "a-process-in-both-lists-counts-once",
        FakeGpu("GPU-a", used=600 * MIB, compute=[(7, 500 * MIB)], graphics=[(7, 300 * MIB)]),
        GpuMemoryUsage(600 * MIB, (GpuProcess(7, 500 * MIB),)),
    ),
    (
        "memory-not-available",
        FakeGpu("GPU-a", used=MIB, compute=[(7, None)]),
        GpuMemoryUsage(MIB, (GpuProcess(7, None),)),
    ),
    (
        "graphics-not-supported",
        FakeGpu("GPU-a", used=MIB, compute=[(7, MIB)], graphics=None),
        GpuMemoryUsage(MIB, (GpuProcess(7, MIB),)),
    ),
]


@pytest.mark.parametrize(("gpu", "want"), [c[1:] for c in GOOD], ids=[c[0] for c in GOOD])
def test_memory_usage(gpu: FakeGpu, want: GpuMemoryUsage) -> None:
    assert usage_of(gpu) == want


GARBAGE = [
    ("used-not-a-number", FakeGpu("GPU-a", used="lots"), "not a memory reading"),
    ("used-negative", FakeGpu("GPU-a", used=-1), "not a memory reading"),
    ("used-a-bool", FakeGpu("GPU-a", used=True), "not a memory reading"),
    ("used-over-total", FakeGpu("GPU-a", memory=MIB, used=2 * MIB), "not a memory reading"),
    ("processes-not-a-list", FakeGpu("GPU-a", compute="pid 7"), "compute processes of GPU GPU-a: not a list"),
    ("pid-garbage", FakeGpu("GPU-a", compute=[("seven", MIB)]), "not a process"),
    ("pid-negative", FakeGpu("GPU-a", compute=[(-3, MIB)]), "not a process"),
    ("process-memory-garbage", FakeGpu("GPU-a", graphics=[(7, "1Mi")]), "not a process"),
    ("process-memory-negative", FakeGpu("GPU-a", graphics=[(7, -5)]), "not a process"),
    (
        "processes-fail",
        FakeGpu("GPU-a", compute=NVMLError("Unknown Error")),
        "compute processes of GPU GPU-a",
    ),
    ("gpu-broken", FakeGpu("GPU-a", broken=True), "memory info of GPU GPU-a failed: Unknown Error"),
]


@pytest.mark.parametrize(("gpu", "message"), [c[1:] for c in GARBAGE], ids=[c[0] for c in GARBAGE])
def test_garbage_nvml_replies_are_backend_errors(gpu: FakeGpu, message: str) -> None:
    with pytest.raises(GpuBackendError, match=message):
        usage_of(gpu)


def test_unknown_gpu_and_closed_backend() -> None:
    backend = nvml.NvmlBackend(make_module([FakeGpu("GPU-a")]))
    with pytest.raises(GpuBackendError, match="not opened"):
        backend.memory_usage(GpuUuid("GPU-a"))
    backend.open()
    with pytest.raises(GpuBackendError, match="GPU-zzz"):
        backend.memory_usage(GpuUuid("GPU-zzz"))


FAKE = """
gpus:
  - uuid: GPU-a
    name: T4
    memoryMib: 16000
    reservedMib: 300
    processes: [{pid: 42, usedMib: 2000}, {pid: 43, usedMib: null}]
  - uuid: GPU-b
    name: T4
    memoryMib: 16000
"""


def test_fake_backend_reports_and_injects_memory_usage() -> None:
    backend = fake.FakeGpuBackend.from_yaml(yaml.safe_load(FAKE))
    a = backend.memory_usage(GpuUuid("GPU-a"))
    assert a == GpuMemoryUsage(2300 * MIB, (GpuProcess(42, 2000 * MIB), GpuProcess(43, None)))
    assert backend.memory_usage(GpuUuid("GPU-b")) == GpuMemoryUsage(0)
    backend.set_memory_usage("GPU-b", reserved_mib=100, processes={9: 1000})
    assert backend.memory_usage(GpuUuid("GPU-b")) == GpuMemoryUsage(1100 * MIB, (GpuProcess(9, 1000 * MIB),))
    backend.fail_memory_usage("GPU is lost")
    with pytest.raises(GpuBackendError, match="GPU is lost"):
        backend.memory_usage(GpuUuid("GPU-a"))
    backend.fail_memory_usage("")
    backend.vanish("GPU-a")
    with pytest.raises(GpuBackendError, match="Not Found"):
        backend.memory_usage(GpuUuid("GPU-a"))
    with pytest.raises(GpuBackendError, match="more than the GPU's 16000 MiB"):
        backend.set_memory_usage("GPU-b", processes={1: 20000})
    with pytest.raises(GpuBackendError, match="no GPU GPU-zzz"):
        backend.set_memory_usage("GPU-zzz")


@pytest.mark.parametrize(
    ("gpu", "message"),
    [
        pytest.param({"processes": 3}, r"gpus\[0\].processes: expected a list", id="processes-not-a-list"),
        pytest.param({"processes": [{"usedMib": 1}]}, r"processes\[0\].pid", id="no-pid"),
        pytest.param({"processes": [{"pid": 1, "usedMib": -1}]}, "usedMib", id="negative-memory"),
        pytest.param({"processes": [{"pid": 1, "mem": 1}]}, "unknown keys", id="unknown-key"),
        pytest.param({"reservedMib": "lots"}, "reservedMib", id="reserved-garbage"),
        pytest.param({"reservedMib": 20000}, "more than the GPU's", id="over-the-gpu"),
    ],
)
def test_garbage_fake_memory_is_a_clear_error(gpu: dict[str, Any], message: str) -> None:
    doc = {"gpus": [{"name": "T4", "memoryMib": 16000, **gpu}]}
    with pytest.raises(GpuBackendError, match=message):
        fake.FakeGpuBackend.from_yaml(doc)
