"""GPU utilisation (the monitor's HostCoreUtilization): the NVML adapter over a fake pynvml with
garbage replies, and the fake backend's control."""

from __future__ import annotations

from typing import Any

import pytest
from vgpu.core.device import GpuUuid
from vgpu.core.errors import GpuBackendError
from vgpu.gpu import fake, nvml

from tests.gpu.fake_pynvml import FakeGpu, make_module


def _backend(gpu: FakeGpu) -> nvml.NvmlBackend:
    backend = nvml.NvmlBackend(make_module([gpu]))
    backend.open()
    return backend


@pytest.mark.parametrize("percent", [0, 37, 100])
def test_utilization(percent: int) -> None:
    assert _backend(FakeGpu("GPU-a", utilization=percent)).utilization_percent(GpuUuid("GPU-a")) == percent


@pytest.mark.parametrize(
    "reply", ["lots", -1, 101, True, None, 12.5], ids=["text", "negative", "over", "bool", "none", "float"]
)
def test_garbage_utilization_is_a_backend_error(reply: Any) -> None:
    with pytest.raises(GpuBackendError, match="GPU-a: not a percentage"):
        _backend(FakeGpu("GPU-a", utilization=reply)).utilization_percent(GpuUuid("GPU-a"))


def test_driver_failures_are_backend_errors() -> None:
    backend = _backend(FakeGpu("GPU-a", broken=True))
    with pytest.raises(GpuBackendError, match="utilization of GPU GPU-a failed"):
        backend.utilization_percent(GpuUuid("GPU-a"))
    with pytest.raises(GpuBackendError, match="GPU-b failed: Not Found"):
        backend.utilization_percent(GpuUuid("GPU-b"))


def test_fake_backend_utilization() -> None:
    backend = fake.FakeGpuBackend.from_yaml({"gpus": [{"uuid": "GPU-a", "name": "T4", "memoryMib": 1024}]})
    backend.open()
    assert backend.utilization_percent(GpuUuid("GPU-a")) == 0
    backend.set_utilization("GPU-a", 80)
    assert backend.utilization_percent(GpuUuid("GPU-a")) == 80
    with pytest.raises(GpuBackendError):
        backend.set_utilization("GPU-a", 101)
    with pytest.raises(GpuBackendError, match="Not Found"):
        backend.utilization_percent(GpuUuid("GPU-x"))
    backend.fail_memory_usage("driver gone")
    with pytest.raises(GpuBackendError, match="driver gone"):
        backend.utilization_percent(GpuUuid("GPU-a"))
