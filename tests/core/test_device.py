"""Virtual device IDs and usage arithmetic."""

from __future__ import annotations

import pytest
from vgpu.core import device
from vgpu.core.device import Gpu, GpuUsage, GpuUuid


def test_virtual_ids_and_back() -> None:
    gpu = Gpu(GpuUuid("GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448"), 0, 3, 1000, 100, "NVIDIA-T4")
    ids = device.virtual_device_ids(gpu)
    assert ids == [f"{gpu.uuid}-0", f"{gpu.uuid}-1", f"{gpu.uuid}-2"]
    assert {device.physical_uuid(i) for i in ids} == {gpu.uuid}


@pytest.mark.parametrize(
    ("raw", "uuid"), [("GPU-a-12", "GPU-a"), ("GPU-a::3", "GPU-a"), ("GPU-abc", "GPU-abc"), ("7", "7")]
)
def test_physical_uuid(raw: str, uuid: str) -> None:
    assert device.physical_uuid(raw) == uuid


def test_usage_arithmetic() -> None:
    used = GpuUsage().plus(memory_mib=100, cores=10).plus(memory_mib=50, cores=0)
    assert used == GpuUsage(2, 150, 10)
    assert used.minus(GpuUsage(1, 100, 20)) == GpuUsage(1, 50, 0)
    total = device.total_usage(
        [{GpuUuid("a"): GpuUsage(1, 1, 1)}, {GpuUuid("a"): GpuUsage(1, 2, 3), GpuUuid("b"): GpuUsage()}]
    )
    assert total == {"a": GpuUsage(2, 3, 4), "b": GpuUsage()}
