"""GPU and node scores: the request counts, ties are deterministic."""

from __future__ import annotations

import pytest
from vgpu.core import policy
from vgpu.core.config import Policy
from vgpu.core.device import Gpu, GpuUsage, GpuUuid

G = Gpu(GpuUuid("g"), 0, 10, 10000, 100, "NVIDIA-X")


def test_gpu_score_counts_the_request() -> None:
    empty = policy.gpu_score_after(G, GpuUsage(), memory_mib=0, cores=0)
    bigger = policy.gpu_score_after(G, GpuUsage(), memory_mib=5000, cores=50)
    assert empty == pytest.approx(1.0)  # one slot of ten
    assert bigger == pytest.approx(10 * (0.1 + 0.5 + 0.5))


def test_gpu_score_zero_capacity_terms_are_skipped() -> None:
    odd = Gpu(GpuUuid("z"), 0, 0, 0, 0, "NVIDIA-X")
    assert policy.gpu_score_after(odd, GpuUsage(), memory_mib=10, cores=10) == 0.0


@pytest.mark.parametrize(
    ("pol", "expected"),
    [(Policy.BINPACK, ["full", "a-idle", "b-idle"]), (Policy.SPREAD, ["a-idle", "b-idle", "full"])],
)
def test_gpu_sort_key_orders_by_policy_then_numa_index(pol: Policy, expected: list[str]) -> None:
    gpus = {
        "full": (9.0, Gpu(GpuUuid("full"), 2, 1, 1, 1, "x")),
        "b-idle": (1.0, Gpu(GpuUuid("b-idle"), 1, 1, 1, 1, "x", numa=1)),
        "a-idle": (1.0, Gpu(GpuUuid("a-idle"), 3, 1, 1, 1, "x", numa=0)),
    }
    ordered = sorted(gpus, key=lambda k: policy.gpu_sort_key(gpus[k][0], gpus[k][1], pol))
    assert ordered == expected


@pytest.mark.parametrize(
    ("pol", "expected"),
    [
        # binpack: the lowest NUMA node first, fullest first within it; spread: the highest, emptiest
        (Policy.BINPACK, ["n0-full", "n0-idle", "n1-full", "n1-idle", "n2-idle"]),
        (Policy.SPREAD, ["n2-idle", "n1-idle", "n1-full", "n0-idle", "n0-full"]),
    ],
)
def test_numa_bind_sorts_by_numa_node_before_score(pol: Policy, expected: list[str]) -> None:
    gpus = {
        "n1-full": (9.0, Gpu(GpuUuid("n1-full"), 0, 1, 1, 1, "x", numa=1)),
        "n0-idle": (1.0, Gpu(GpuUuid("n0-idle"), 1, 1, 1, 1, "x", numa=0)),
        "n2-idle": (1.0, Gpu(GpuUuid("n2-idle"), 2, 1, 1, 1, "x", numa=2)),
        "n1-idle": (1.0, Gpu(GpuUuid("n1-idle"), 3, 1, 1, 1, "x", numa=1)),
        "n0-full": (8.0, Gpu(GpuUuid("n0-full"), 4, 1, 1, 1, "x", numa=0)),
    }
    ordered = sorted(gpus, key=lambda k: policy.gpu_sort_key(gpus[k][0], gpus[k][1], pol, numa_bind=True))
    assert ordered == expected


def test_node_score_is_hamis_formula() -> None:
    used = {GpuUuid("g"): GpuUsage(5, 2500, 25)}
    assert policy.node_score([G], used) == pytest.approx(10 * (0.5 + 0.25 + 0.25))
    assert policy.node_score([], {}) == 0.0


@pytest.mark.parametrize(
    ("pol", "scores", "expected"),
    [
        (Policy.BINPACK, [("a", 1.0), ("b", 3.0), ("c", 2.0)], "b"),
        (Policy.SPREAD, [("a", 1.0), ("b", 3.0), ("c", 0.5)], "c"),
        (Policy.BINPACK, [("z", 2.0), ("m", 2.0)], "m"),
        (Policy.SPREAD, [("z", 0.0), ("m", 0.0), ("q", 1.0)], "m"),
        (Policy.SPREAD, [], None),
    ],
)
def test_pick_node(pol: Policy, scores: list[tuple[str, float]], expected: str | None) -> None:
    assert policy.pick_node(scores, pol) == expected
