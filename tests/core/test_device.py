"""Virtual device IDs and usage arithmetic."""

from __future__ import annotations

import pytest
from vgpu.core import device
from vgpu.core.device import Gpu, GpuUsage, GpuUuid


def test_virtual_ids_and_back() -> None:
    gpu = Gpu(GpuUuid("GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448"), 0, 3, 1000, 100, "NVIDIA-T4")
    ids = device.virtual_device_ids(gpu)
    assert ids == [f"{gpu.uuid}-0", f"{gpu.uuid}-1", f"{gpu.uuid}-2"]
    assert {device.physical_uuid(i, gpus={gpu.uuid}) for i in ids} == {gpu.uuid}


DIGITS = "GPU-0fc3eda5-e98b-a25b-5b0d-123456789012"  # a real-looking UUID, last group all digits
MIG = "MIG-5b5b5b5b-1111-2222-3333-444444444444"


@pytest.mark.parametrize(
    ("raw", "gpus", "uuid"),
    [
        ("GPU-a-12", {"GPU-a"}, "GPU-a"),
        ("GPU-abc", {"GPU-abc"}, "GPU-abc"),
        (DIGITS, {DIGITS}, DIGITS),
        (DIGITS, set(), DIGITS),  # not ours at all: unchanged, never cut at its last dash
        (DIGITS + "-3", {DIGITS}, DIGITS),
        ("GPU-0fc3eda5-e98b-a25b-5b0d-1", {DIGITS}, "GPU-0fc3eda5-e98b-a25b-5b0d-1"),
        (MIG, {"GPU-a"}, MIG),
        ("GPU-a-07", {"GPU-a"}, "GPU-a-07"),  # we never write a leading zero
        ("GPU-a-", {"GPU-a"}, "GPU-a-"),
        ("GPU-a-²", {"GPU-a"}, "GPU-a-²"),
        ("GPU-a::3", {"GPU-a"}, "GPU-a::3"),  # not a form we generate
        ("", {"GPU-a"}, ""),
        ("7", {"GPU-a"}, "7"),
    ],
    ids=[
        "our-slot",
        "whole-gpu",
        "digit-uuid-ours",
        "digit-uuid-unknown",
        "digit-uuid-slot",
        "prefix-of-a-known-uuid",
        "mig",
        "leading-zero",
        "empty-slot",
        "unicode-digit",
        "double-colon",
        "empty",
        "bare-number",
    ],
)
def test_physical_uuid(raw: str, gpus: set[str], uuid: str) -> None:
    assert device.physical_uuid(raw, gpus=gpus) == uuid


def test_usage_arithmetic() -> None:
    used = GpuUsage().plus(memory_mib=100, cores=10).plus(memory_mib=50, cores=0)
    assert used == GpuUsage(2, 150, 10)
    assert used.minus(GpuUsage(1, 100, 20)) == GpuUsage(1, 50, 0)
    total = device.total_usage(
        [{GpuUuid("a"): GpuUsage(1, 1, 1)}, {GpuUuid("a"): GpuUsage(1, 2, 3), GpuUuid("b"): GpuUsage()}]
    )
    assert total == {"a": GpuUsage(2, 3, 4), "b": GpuUsage()}


@pytest.mark.parametrize(
    ("register_type", "shown"),
    [
        ("NVIDIA-Tesla T4", "Tesla T4"),  # the device plugin prefixed NVML's "Tesla T4"
        ("NVIDIA A100-SXM4-40GB", "NVIDIA A100-SXM4-40GB"),  # NVML's name already starts with NVIDIA
        ("NVIDIA-NVIDIA A10", "NVIDIA A10"),  # HAMi's plugin prefixes every name
        ("Other", "Other"),
    ],
)
def test_one_model_name_for_every_view(register_type: str, shown: str) -> None:
    assert device.model_name(register_type) == shown
