"""Pod footprints from device strings: the HAMi collapse rule for init containers, exact sums."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from vgpu.core import annotations, usage
from vgpu.core.device import GpuUsage, GpuUuid

A, B = GpuUuid("GPU-a"), GpuUuid("GPU-b")


@pytest.mark.parametrize(
    ("raw", "init_count", "init_done", "expected"),
    [
        ("GPU-a,NVIDIA,3000,0:;", 0, False, {A: GpuUsage(1, 3000, 0)}),
        ("GPU-a,NVIDIA,3000,10:;GPU-a,NVIDIA,5000,20:;", 0, False, {A: GpuUsage(2, 8000, 30)}),
        (
            "GPU-a,NVIDIA,4000,30:GPU-b,NVIDIA,4000,30:;",
            0,
            False,
            {A: GpuUsage(1, 4000, 30), B: GpuUsage(1, 4000, 30)},
        ),
        (";GPU-a,NVIDIA,1000,30:;", 0, False, {A: GpuUsage(1, 1000, 30)}),
        # init 5000/20 and app 4000/20 on one GPU: the larger wins, one slot
        ("GPU-a,NVIDIA,5000,20:;GPU-a,NVIDIA,4000,20:;", 1, False, {A: GpuUsage(1, 5000, 20)}),
        # two app containers outgrow the init container
        (
            "GPU-a,NVIDIA,5000,20:;GPU-a,NVIDIA,4000,20:;GPU-a,NVIDIA,4000,20:;",
            1,
            False,
            {A: GpuUsage(2, 8000, 40)},
        ),
        # init only on a GPU the app does not use: one slot while init runs
        (
            "GPU-b,NVIDIA,2000,0:;GPU-a,NVIDIA,1000,0:;",
            1,
            False,
            {A: GpuUsage(1, 1000, 0), B: GpuUsage(1, 2000, 0)},
        ),
        # once init containers are done, only the app containers count
        ("GPU-b,NVIDIA,2000,0:;GPU-a,NVIDIA,1000,0:;", 1, True, {A: GpuUsage(1, 1000, 0)}),
        ("", 0, False, {}),
        (";;", 0, False, {}),
    ],
    ids=[
        "one",
        "two-app-same-gpu",
        "multi-gpu",
        "cpu-then-gpu",
        "init-bigger",
        "app-sum-bigger",
        "init-other-gpu",
        "init-done",
        "empty",
        "no-devices",
    ],
)
def test_pod_usage(raw: str, init_count: int, init_done: bool, expected: dict[GpuUuid, GpuUsage]) -> None:
    devices = annotations.decode_pod_devices(raw)
    assert usage.pod_usage(devices, init_count=init_count, init_done=init_done) == expected


_usage = st.dictionaries(
    st.sampled_from([A, B]),
    st.builds(GpuUsage, st.integers(1, 4), st.integers(0, 10_000), st.integers(0, 100)),
)


@given(st.lists(_usage, max_size=8))
def test_add_then_remove_returns_to_empty(pods: list[dict[GpuUuid, GpuUsage]]) -> None:
    total = usage.node_usage(pods)
    for pod in pods:
        for uuid, used in pod.items():
            assert total[uuid].memory_mib >= used.memory_mib
    for pod in reversed(pods):
        usage.add(total, pod, sign=-1)
    assert total == {}
