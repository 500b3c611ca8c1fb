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


SIDECAR_CASES = [
    # (id, device string, init count, sidecar indices, init done, expected)
    # a sidecar runs beside the app container: summed, a slot each
    (
        "sidecar-adds-to-app",
        "GPU-a,NVIDIA,4000,10:;GPU-a,NVIDIA,6000,20:;",
        1,
        {0},
        False,
        {A: GpuUsage(2, 10000, 30)},
    ),
    # a regular init container before the sidecar runs alone: the larger of it and sidecar + app
    (
        "init-before-sidecar",
        "GPU-a,NVIDIA,8000,0:;GPU-a,NVIDIA,4000,0:;GPU-a,NVIDIA,3000,0:;",
        2,
        {1},
        False,
        {A: GpuUsage(2, 8000, 0)},
    ),
    # a regular init container after the sidecar runs beside it: 4000 + 5000 outgrows 4000 + 3000
    (
        "init-after-sidecar",
        "GPU-a,NVIDIA,4000,0:;GPU-a,NVIDIA,5000,0:;GPU-a,NVIDIA,3000,0:;",
        2,
        {0},
        False,
        {A: GpuUsage(2, 9000, 0)},
    ),
    # ... only beside a sidecar on the same GPU
    (
        "init-after-sidecar-elsewhere",
        "GPU-b,NVIDIA,4000,0:;GPU-a,NVIDIA,5000,0:;GPU-a,NVIDIA,3000,0:;",
        2,
        {0},
        False,
        {A: GpuUsage(1, 5000, 0), B: GpuUsage(1, 4000, 0)},
    ),
    # the regular init containers finished: the sidecar keeps counting with the app
    (
        "init-done-keeps-the-sidecar",
        "GPU-a,NVIDIA,9000,0:;GPU-a,NVIDIA,4000,10:;GPU-a,NVIDIA,2000,20:;",
        2,
        {1},
        True,
        {A: GpuUsage(2, 6000, 30)},
    ),
    (
        "init-not-done",
        "GPU-a,NVIDIA,9000,0:;GPU-a,NVIDIA,4000,10:;GPU-a,NVIDIA,2000,20:;",
        2,
        {1},
        False,
        {A: GpuUsage(2, 9000, 30)},
    ),
    # a sidecar alone on its GPU
    (
        "sidecar-alone",
        "GPU-b,NVIDIA,4000,0:;GPU-a,NVIDIA,1000,0:;",
        1,
        {0},
        True,
        {A: GpuUsage(1, 1000, 0), B: GpuUsage(1, 4000, 0)},
    ),
]


@pytest.mark.parametrize(
    ("raw", "init_count", "sidecars", "init_done", "expected"),
    [c[1:] for c in SIDECAR_CASES],
    ids=[c[0] for c in SIDECAR_CASES],
)
def test_pod_usage_with_sidecars(
    raw: str, init_count: int, sidecars: set[int], init_done: bool, expected: dict[GpuUuid, GpuUsage]
) -> None:
    devices = annotations.decode_pod_devices(raw)
    got = usage.pod_usage(devices, init_count=init_count, sidecars=frozenset(sidecars), init_done=init_done)
    assert got == expected


def _status(init: list[dict[str, str]], *states: dict[str, object]) -> list[dict[str, object]]:
    """Statuses named after ``init``'s containers, in their order."""
    return [{"name": c["name"], "state": s} for c, s in zip(init, states, strict=True)]


EXITED = {"terminated": {"exitCode": 0}}
FAILED = {"terminated": {"exitCode": 1}}
RUNNING = {"running": {"startedAt": "2026-01-01T00:00:00Z"}}
SIDECAR = {"name": "proxy", "restartPolicy": "Always"}
REGULAR = {"name": "setup"}

INIT_DONE_CASES = [
    ("regular-exited", [REGULAR], _status([REGULAR], EXITED), True),
    ("regular-running", [REGULAR], _status([REGULAR], RUNNING), False),
    ("regular-failed", [REGULAR], _status([REGULAR], FAILED), False),
    # a running sidecar is no unfinished init container
    (
        "regular-exited-sidecar-running",
        [REGULAR, SIDECAR],
        _status([REGULAR, SIDECAR], EXITED, RUNNING),
        True,
    ),
    ("sidecar-first-running", [SIDECAR, REGULAR], _status([SIDECAR, REGULAR], RUNNING, EXITED), True),
    ("sidecar-restarting", [REGULAR, SIDECAR], _status([REGULAR, SIDECAR], EXITED, FAILED), True),
    (
        "regular-after-sidecar-running",
        [SIDECAR, REGULAR],
        _status([SIDECAR, REGULAR], RUNNING, RUNNING),
        False,
    ),
    # statuses are matched by name, not by position
    ("statuses-in-another-order", [REGULAR, SIDECAR], _status([SIDECAR, REGULAR], RUNNING, EXITED), True),
    ("status-of-another-name", [REGULAR], [{"name": "other", "state": EXITED}], False),
    ("only-sidecars", [SIDECAR], _status([SIDECAR], RUNNING), False),
    ("no-init", [], [], False),
    ("statuses-missing", [REGULAR], [], False),
    ("statuses-garbage", [REGULAR], "done", False),
    ("items-garbage", [REGULAR], ["x"], False),
]


@pytest.mark.parametrize(
    ("init", "statuses", "done"), [c[1:] for c in INIT_DONE_CASES], ids=[c[0] for c in INIT_DONE_CASES]
)
def test_regular_init_done(init: list[object], statuses: object, done: bool) -> None:
    pod = {"spec": {"initContainers": init}, "status": {"initContainerStatuses": statuses}}
    assert usage.regular_init_done(pod) is done
