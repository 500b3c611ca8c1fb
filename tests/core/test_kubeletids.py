"""kubelet's device IDs against the scheduler's GPUs (``vgpu.core.kubeletids``)."""

import pytest
from vgpu.core import annotations, kubeletids
from vgpu.core.device import GpuUuid

A, B = GpuUuid("GPU-a"), GpuUuid("GPU-b")
GPUS = {A, B}


def entry(*uuids: GpuUuid) -> annotations.ContainerDevices:
    return tuple(annotations.ContainerDevice(u, 1, 1, "NVIDIA") for u in uuids)


@pytest.mark.parametrize(
    ("devices", "ids", "different"),
    [
        (entry(A), ["GPU-a-3"], False),
        (entry(A, B), ["GPU-b-0", "GPU-a-1"], False),  # kubelet's order does not matter
        (entry(A), ["GPU-b-0"], True),
        (entry(A, B), ["GPU-a-0", "GPU-a-1"], True),  # as many IDs on each GPU
        (entry(A), ["GPU-a"], False),  # a plain UUID (MIG-style IDs)
        (entry(A), ["garbage"], True),
        (entry(A), [], True),
    ],
    ids=["same", "order", "other-gpu", "counts", "plain-uuid", "garbage", "none"],
)
def test_mismatch(devices: annotations.ContainerDevices, ids: list[str], different: bool) -> None:
    assert (kubeletids.mismatch(devices, ids, gpus=GPUS) is not None) == different


@pytest.mark.parametrize(
    ("numa", "numa_sent", "reused", "cause"),
    [
        ({A: 0, B: 1}, True, False, "TopologyManager aligned the container to another NUMA node"),
        ({A: 0, B: 0}, True, False, "kubelet did not take the preferred allocation"),
        ({A: 0, B: 1}, False, False, "kubelet did not take the preferred allocation"),
        ({}, True, False, "kubelet did not take the preferred allocation"),
        ({A: 0, B: 1}, True, True, "kubelet reused the devices of the pod's init container"),
    ],
    ids=["numa", "same-numa", "numa-not-sent", "numa-unknown", "reused"],
)
def test_mismatch_reason_names_both_sides_and_the_cause(
    numa: dict[GpuUuid, int | None], numa_sent: bool, reused: bool, cause: str
) -> None:
    found = kubeletids.mismatch(entry(B), ["GPU-a-0"], gpus=GPUS)
    assert found is not None
    text = kubeletids.mismatch_reason(
        found, container="main", ids=["GPU-a-0"], numa=numa, numa_sent=numa_sent, reused=reused
    )
    assert text.startswith("container main: kubelet's devices ['GPU-a-0'] are on GPU(s) GPU-a (NUMA ")
    assert "the scheduler assigned GPU-b (NUMA " in text and cause in text
