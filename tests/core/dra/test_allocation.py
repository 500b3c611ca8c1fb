"""Reading our GPUs' shares out of a ResourceClaim's allocation, garbage included."""

from __future__ import annotations

from typing import Any

import pytest
from vgpu.core.dra import allocation, names


def _claim(*results: dict[str, Any]) -> dict[str, Any]:
    return {"status": {"allocation": {"devices": {"results": list(results)}}}}


def _result(**extra: Any) -> dict[str, Any]:
    return {"request": "gpu", "driver": names.DRIVER, "pool": "node-a", "device": "gpu-1", **extra}


def test_consumed_capacity_is_read_in_mib_and_percent() -> None:
    claim = _claim(_result(consumedCapacity={"memory": "4Gi", "cores": "30"}, shareID="s-1"))
    assert allocation.shares(claim) == [
        allocation.DeviceShare(
            request="gpu", pool="node-a", device="gpu-1", memory_mib=4096, cores_percent=30, share_id="s-1"
        )
    ]


def test_other_drivers_are_skipped_and_missing_capacity_is_none() -> None:
    claim = _claim(_result(driver="gpu.nvidia.com"), _result(device="gpu-2"))
    (share,) = allocation.shares(claim)
    assert (share.device, share.memory_mib, share.cores_percent, share.share_id) == (
        "gpu-2",
        None,
        None,
        None,
    )


def test_unallocated_claim_has_no_shares() -> None:
    assert allocation.shares({}) == []
    assert allocation.shares({"status": {"reservedFor": []}}) == []


@pytest.mark.parametrize(
    "claim",
    [
        {"status": "x"},
        {"status": {"allocation": []}},
        {"status": {"allocation": {"devices": {"results": {"a": 1}}}}},
        {"status": {"allocation": {"devices": {"results": ["x"]}}}},
        _claim(_result(pool=None)),
        _claim(_result(device="")),
        _claim(_result(consumedCapacity=[])),
        _claim(_result(consumedCapacity={"memory": "lots"})),
        _claim(_result(consumedCapacity={"cores": "1.5.0"})),
        _claim(_result(shareID=7)),
    ],
    ids=[
        "status",
        "allocation",
        "results-map",
        "results-str",
        "pool",
        "device",
        "consumed",
        "memory",
        "cores",
        "share",
    ],
)
def test_garbage_is_an_allocation_error(claim: dict[str, Any]) -> None:
    with pytest.raises(allocation.AllocationError):
        allocation.shares(claim)


def test_reserved_for_lists_pod_uids() -> None:
    claim = {"status": {"reservedFor": [{"resource": "pods", "name": "p", "uid": "u-1"}, {"name": "q"}]}}
    assert allocation.reserved_for(claim) == ["u-1"]
    with pytest.raises(allocation.AllocationError):
        allocation.reserved_for({"status": {"reservedFor": "u-1"}})


def test_cdi_device_names_have_no_slash() -> None:
    assert names.cdi_device("uid-1", "gpu/m80g") == "uid-1-gpu-m80g"


@pytest.mark.parametrize(
    ("consumed", "mib"),
    [("4Gi", 4096), ("4096Mi", 4096), ("4294967296", 4096), ("4G", 3814), ("1500Ki", 1), ("0", 0)],
    ids=["Gi", "Mi", "plain-bytes", "decimal-G", "rounded-down", "zero"],
)
def test_consumed_memory_is_bytes_not_hami_mib(consumed: str, mib: int) -> None:
    """DRA capacities are byte quantities: a plain number is bytes (HAMi's gpumem reads it as MiB)."""
    (share,) = allocation.shares(_claim(_result(consumedCapacity={"memory": consumed})))
    assert share.memory_mib == mib
