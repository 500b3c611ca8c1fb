"""DRA usage for the views: our ResourceSlices and the claims allocated on them, turned into the
per-node inventory, per-GPU usage and holders the extender path's views already show."""

from __future__ import annotations

from typing import Any

import pytest
from vgpu.core.device import Gpu, GpuUsage, GpuUuid
from vgpu.core.dra import usage

from tests.core.dra.dra_objects import claim, gpu_device, resource_slice, result

A0, A1 = GpuUuid("GPU-a0"), GpuUuid("GPU-a1")
SLICE_A = resource_slice("node-a", gpu_device(0, "GPU-a0"), gpu_device(1, "GPU-a1", unhealthy=True))


def test_slices_become_the_nodes_inventory() -> None:
    got = usage.build([SLICE_A, resource_slice("node-b", gpu_device(0, "GPU-b0", model="Tesla T4"))], [])
    assert list(got.nodes) == ["node-a", "node-b"]
    a = got.nodes["node-a"]
    assert a.inventory.gpus == (
        Gpu(A0, 0, 0, 40960, 100, "NVIDIA A100-SXM4-40GB"),
        Gpu(A1, 1, 0, 40960, 100, "NVIDIA A100-SXM4-40GB", health=False),
    )
    assert got.nodes["node-b"].inventory.gpus[0].type == "NVIDIA-Tesla T4"  # as the register annotation
    assert a.used == {} and a.holders == {} and got.problems == ()


@pytest.mark.parametrize(
    ("results", "expected"),
    [
        ([result("node-a", 0, memory="4Gi", cores="30")], GpuUsage(1, 4096, 30)),
        ([result("node-a", 0, memory="4096Mi")], GpuUsage(1, 4096, 0)),
        ([result("node-a", 0)], GpuUsage(1, 40960, 0)),
        ([result("node-a", 0, cores="50")], GpuUsage(1, 40960, 50)),
        (
            [result("node-a", 0, memory="1Gi", cores="10"), result("node-a", 0, memory="2Gi", cores="20")],
            GpuUsage(2, 3072, 30),
        ),
    ],
    ids=[
        "both-named",
        "cores-default-0",
        "memory-default-whole",
        "memory-default-whole-cores-named",
        "two-shares",
    ],
)
def test_consumed_capacity_with_defaults(results: list[dict[str, Any]], expected: GpuUsage) -> None:
    """A capacity the result leaves out was consumed at the slice's requestPolicy default (memory:
    the whole card, cores: 0), as kube-scheduler consumed it."""
    got = usage.build([SLICE_A], [claim("team", "c1", *results, reserved=("p1",))])
    assert got.nodes["node-a"].used == {A0: expected}
    assert got.problems == () and got.nodes["node-a"].problems == ()


@pytest.mark.parametrize(
    ("device_kw", "expected"),
    [
        ({"memory_default": None, "cores_default": None}, GpuUsage(1, 40960, 100)),
        ({"memory_default": "8Gi", "cores_default": "25"}, GpuUsage(1, 8192, 25)),
        ({"shared": False}, GpuUsage(1, 40960, 100)),
    ],
    ids=["no-policy-whole-capacity", "policy-defaults", "not-shared-whole-device"],
)
def test_defaults_follow_the_published_policy(device_kw: dict[str, Any], expected: GpuUsage) -> None:
    slices = [resource_slice("node-a", gpu_device(0, "GPU-a0", **device_kw))]
    got = usage.build(slices, [claim("team", "c1", result("node-a", 0), reserved=("p1",))])
    assert got.nodes["node-a"].used == {A0: expected}


@pytest.mark.parametrize(
    ("kwargs", "shown"),
    [
        ({"reserved": ("p1",)}, ["team/p1"]),
        ({"reserved": ("p1", "p2")}, ["team/p1", "team/p2"]),
        ({"owner": "p9"}, ["team/p9"]),
        ({"reserved": ("p1",), "owner": "p9"}, ["team/p1"]),
        ({}, ["team/claim:c1"]),
    ],
    ids=["reserved", "shared-claim", "owner-only", "reserved-wins", "nobody-yet"],
)
def test_holders_are_the_pods_using_the_claim(kwargs: dict[str, Any], shown: list[str]) -> None:
    got = usage.build([SLICE_A], [claim("team", "c1", result("node-a", 0, memory="1Gi"), **kwargs)])
    holders = got.nodes["node-a"].holders[A0]
    assert [h.shown for h in holders] == shown
    assert {(h.claim, h.memory_mib, h.cores) for h in holders} == {("c1", 1024, 0)}
    assert got.nodes["node-a"].used[A0] == GpuUsage(1, 1024, 0)  # one share, however many pods use it


def test_only_the_newest_pool_generation_and_our_driver_count() -> None:
    old = resource_slice("node-a", gpu_device(0, "GPU-old"), generation=1, name="old")
    new = resource_slice("node-a", gpu_device(0, "GPU-a0"), generation=2, name="new")
    theirs = resource_slice("node-a", gpu_device(0, "GPU-x"), driver="gpu.nvidia.com", name="nvidia")
    got = usage.build([old, new, theirs], [])
    assert [g.uuid for g in got.nodes["node-a"].inventory.gpus] == [A0]


def test_other_drivers_results_and_unallocated_claims_count_nothing() -> None:
    claims = [
        claim("team", "c1", result("node-a", 0, memory="1Gi", driver="gpu.nvidia.com")),
        claim("team", "c2"),
    ]
    got = usage.build([SLICE_A], claims)
    assert got.nodes["node-a"].used == {} and got.problems == ()


BAD_DEVICES: list[tuple[str, dict[str, Any]]] = [
    ("bad-name", {**gpu_device(0, "GPU-a0"), "name": "gpu-x"}),
    ("no-uuid", {**gpu_device(0, "GPU-a0"), "attributes": {}}),
    ("no-memory", {**gpu_device(0, "GPU-a0"), "capacity": {"cores": {"value": "100"}}}),
    ("bad-memory", gpu_device(0, "GPU-a0", memory_default="lots")),
    (
        "negative-cores",
        {**gpu_device(0, "GPU-a0"), "capacity": {**gpu_device(0, "x")["capacity"], "cores": {"value": "-5"}}},
    ),
    (
        "fractional-cores",
        {
            **gpu_device(0, "GPU-a0"),
            "capacity": {**gpu_device(0, "x")["capacity"], "cores": {"value": "1.5"}},
        },
    ),
    ("not-an-object", "gpu-0"),  # type: ignore[list-item]
]


@pytest.mark.parametrize("bad", [b for _, b in BAD_DEVICES], ids=[i for i, _ in BAD_DEVICES])
def test_a_garbage_device_is_skipped_with_a_reason(bad: Any) -> None:
    """The node's other GPUs still show; a claim on the skipped device is a problem, not a crash."""
    slices = [resource_slice("node-a", bad, gpu_device(1, "GPU-a1"))]
    claims = [
        claim("team", "c1", result("node-a", 0, memory="1Gi")),
        claim("team", "c2", result("node-a", 1, memory="2Gi")),
    ]
    got = usage.build(slices, claims)
    node = got.nodes["node-a"]
    assert [g.uuid for g in node.inventory.gpus] == [A1]
    assert node.used == {A1: GpuUsage(1, 2048, 0)}
    assert len(node.problems) == 2
    assert node.problems[0].startswith("ResourceSlice node-a-gpu.kube-vgpu.io spec.devices[0]: ")
    assert node.problems[1] == (
        "ResourceClaim team/c1 holds gpu-0 on node node-a, whose ResourceSlice does not publish it "
        "(gone or unhealthy)"
    )


GARBAGE_SLICES: list[tuple[str, Any]] = [
    ("not-an-object", "slice"),
    ("no-pool", {**resource_slice("node-a"), "spec": {"driver": "gpu.kube-vgpu.io"}}),
    ("generation-not-int", resource_slice("node-a", generation="two")),  # type: ignore[arg-type]
    (
        "devices-not-a-list",
        {**resource_slice("node-a"), "spec": {**resource_slice("node-a")["spec"], "devices": {}}},
    ),
]


@pytest.mark.parametrize("bad", [b for _, b in GARBAGE_SLICES], ids=[i for i, _ in GARBAGE_SLICES])
def test_a_garbage_slice_never_crashes_the_view(bad: Any) -> None:
    got = usage.build([bad, SLICE_A], [claim("team", "c1", result("node-a", 0, memory="1Gi"))])
    assert got.nodes["node-a"].used == {A0: GpuUsage(1, 1024, 0)}


GARBAGE_CLAIMS: list[tuple[str, Any, str]] = [
    ("not-an-object", ["claim"], ""),
    (
        "status-not-an-object",
        {"metadata": {"name": "c9", "namespace": "team"}, "status": "x"},
        "status is not an object",
    ),
    ("bad-quantity", claim("team", "c9", result("node-a", 0, memory="lots")), "consumedCapacity.memory"),
    ("no-pool", claim("team", "c9", {**result("node-a", 0), "pool": 3}), "pool"),
    (
        "unknown-pool",
        claim("team", "c9", result("node-z", 0, memory="1Gi")),
        "holds gpu-0 on pool node-z, which no ResourceSlice of gpu.kube-vgpu.io publishes",
    ),
    ("reserved-garbage", {**claim("team", "c9"), "status": {"reservedFor": "x"}}, ""),
]


@pytest.mark.parametrize(
    ("bad", "reason"), [(b, r) for _, b, r in GARBAGE_CLAIMS], ids=[i for i, _, _ in GARBAGE_CLAIMS]
)
def test_a_garbage_claim_is_skipped_with_a_reason(bad: Any, reason: str) -> None:
    good = claim("team", "c1", result("node-a", 0, memory="1Gi"), reserved=("p1",))
    got = usage.build([SLICE_A], [bad, good])
    assert got.nodes["node-a"].used == {A0: GpuUsage(1, 1024, 0)}
    if reason:
        assert len(got.problems) == 1 and reason in got.problems[0]
        assert got.problems[0].startswith("ResourceClaim team/c9")
    else:
        assert got.problems == ()


def test_empty_input_is_empty() -> None:
    assert usage.build([], []) == usage.EMPTY


def test_a_device_published_twice_in_a_pool_counts_once() -> None:
    one = resource_slice("node-a", gpu_device(0, "GPU-a0"), name="one")
    two = resource_slice("node-a", gpu_device(0, "GPU-dup"), name="two")
    node = usage.build([one, two], []).nodes["node-a"]
    assert [g.uuid for g in node.inventory.gpus] == [A0]
    assert node.problems == ("ResourceSlice two: gpu-0 published twice",)


def test_build_is_combine_of_what_was_read() -> None:
    """What a caller keeps per object (read_slice, read_claim) combines to the same usage."""
    claims = [claim("team", "c1", result("node-a", 0, memory="1Gi"), reserved=("p1",)), claim("team", "c2")]
    read = usage.combine([usage.read_slice(SLICE_A)], [usage.read_claim(c) for c in claims])
    assert read == usage.build([SLICE_A], claims)
    assert (
        usage.read_claim(claims[1]) is None and usage.read_slice(resource_slice("x", driver="other")) is None
    )
