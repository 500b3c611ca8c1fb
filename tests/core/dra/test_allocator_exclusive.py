"""HAMi's sharing rules under kube-scheduler's consumable capacity, with the slice kube-vgpu
publishes (``slices.build``), in the local cluster's allocator: every share consumes at least 1 %
of the cores and one slot, so a claim asking ``cores: 100`` needs an idle GPU, a GPU with all
cores taken takes no one, and a GPU takes at most ``deviceSplitCount`` shares. The same rules on
the real kube-scheduler 1.36: ``tests/realk8s/test_dra_exclusive_real.py``."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from vgpu.core.device import Gpu, GpuUuid, NodeInventory, NodeName
from vgpu.core.dra import allocator, names, slices

from tests.localcluster import draobjects as dra

CLASSES = {names.DEVICE_CLASS: dra.device_class()}
NODE = "n1"


def published(*, count: int = 10, cores: int = 100, gpus: int = 1) -> list[dict[str, Any]]:
    """The node's slice as the device plugin publishes it (split count ``count``)."""
    inventory = NodeInventory(
        NodeName(NODE),
        tuple(
            Gpu(GpuUuid(f"GPU-{i:04d}"), i, count, 16384, cores, "NVIDIA A100-SXM4-16GB", numa=0)
            for i in range(gpus)
        ),
    )
    return [slices.build(inventory, driver_version=None).body]


class Node:
    """Claims placed one at a time on one node, each counting against the next (as kube-scheduler
    counts the allocated claims)."""

    def __init__(self, slice_bodies: list[dict[str, Any]]) -> None:
        self.slices = slice_bodies
        self.allocated: list[dict[str, Any]] = []
        self._ids = itertools.count()

    def place(self, name: str, *, memory_mib: int = 1000, cores: int | None = None) -> dict[str, Any] | None:
        """The claim's allocation, or None when kube-scheduler would say it does not fit."""
        claim = dra.claim(name, dra.gpu_request(memory_mib=memory_mib, cores=cores))
        got = allocator.allocate(
            [claim],
            node=NODE,
            slices=self.slices,
            classes=CLASSES,
            allocated=self.allocated,
            new_share_id=lambda: f"00000000-0000-0000-0000-{next(self._ids):012d}",
        )
        if got is None:
            return None
        self.allocated.append({**claim, "status": {"allocation": got[0]}})
        return got[0]

    def release(self, name: str) -> None:
        self.allocated = [c for c in self.allocated if c["metadata"]["name"] != name]


def consumed(allocation_body: dict[str, Any] | None) -> dict[str, str]:
    assert allocation_body is not None
    (result,) = allocation_body["devices"]["results"]
    return dict(result["consumedCapacity"])


@pytest.mark.parametrize("second_cores", [None, 0, 1, 50], ids=["no-cores", "zero", "one", "fifty"])
def test_no_claim_joins_a_gpu_held_by_a_cores_100_claim(second_cores: int | None) -> None:
    node = Node(published())
    assert consumed(node.place("exclusive", cores=100)) == {"memory": "1000Mi", "cores": "100", "slots": "1"}
    assert node.place("second", cores=second_cores) is None
    node.release("exclusive")
    assert node.place("second", cores=second_cores) is not None


@pytest.mark.parametrize("first_cores", [None, 0, 1, 50], ids=["no-cores", "zero", "one", "fifty"])
def test_a_cores_100_claim_needs_an_idle_gpu(first_cores: int | None) -> None:
    node = Node(published())
    assert node.place("first", cores=first_cores) is not None
    assert node.place("exclusive", cores=100) is None
    # on a second, idle GPU it fits
    two = Node(published(gpus=2))
    assert two.place("first", cores=first_cores) is not None
    got = two.place("exclusive", cores=100)
    assert got is not None and got["devices"]["results"][0]["device"] == "gpu-1"


def test_no_cores_asked_consumes_the_1_percent_floor_and_a_slot() -> None:
    node = Node(published())
    assert consumed(node.place("none")) == {"memory": "1000Mi", "cores": "1", "slots": "1"}
    assert consumed(node.place("zero", cores=0)) == {"memory": "1000Mi", "cores": "1", "slots": "1"}


def test_a_gpu_whose_cores_are_all_taken_takes_no_one() -> None:
    node = Node(published())
    assert node.place("a", cores=60) is not None
    assert node.place("b", cores=40) is not None
    assert node.place("no-cores") is None  # HAMi: a GPU with all cores used takes no one


@pytest.mark.parametrize("split_count", [1, 3, 10])
def test_the_split_count_plus_first_claim_is_refused(split_count: int) -> None:
    node = Node(published(count=split_count))
    for i in range(split_count):
        assert node.place(f"s{i}", memory_mib=100) is not None, i
    assert node.place("one-too-many", memory_mib=100) is None
    node.release("s0")
    assert node.place("one-too-many", memory_mib=100) is not None


def test_with_core_scaling_a_cores_100_claim_shares_the_gpu() -> None:
    """deviceCoreScaling 2 publishes 200 %: as in the extender (exclusivity needs a 100-core
    GPU), a cores-100 claim fits beside another claim there."""
    node = Node(published(cores=200))
    assert node.place("first", cores=50) is not None
    assert node.place("big", cores=100) is not None
    assert node.place("another-big", cores=100) is None  # 50 + 100 + 100 > 200
