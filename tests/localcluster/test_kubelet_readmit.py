"""The restarted kubelet's re-admission decision (kubelet ≥ 1.27's device manager), table-driven."""

import json
from typing import Any

import pytest
from vgpu.localcluster import kubeletdevices, kubeletreadmit

RES = "example.com/dev"
NOTE = "allocations"
NO_HEALTHY = f"no healthy devices present; cannot allocate unhealthy devices {RES}"
NOT_HEALTHY = f"previously allocated devices are no longer healthy; cannot allocate unhealthy devices {RES}"


def pod(*, init: dict[str, Any] | None = None, running: bool = True, held: list[str] | None = None) -> Any:
    limits = {"resources": {"limits": {RES: "1"}}}
    notes = {NOTE: json.dumps({"main": {"resources": {RES: held}}})} if held is not None else {}
    return {
        "metadata": {"name": "p", "uid": "u", "annotations": notes},
        "spec": {
            "initContainers": [{"name": "prep", **limits, **(init or {})}] if init is not None else [],
            "containers": [{"name": "main", **limits}],
        },
        "status": {
            "phase": "Running",
            "containerStatuses": [
                {
                    "name": "main",
                    "state": {"running": {}} if running else {"waiting": {"reason": "CrashLoopBackOff"}},
                }
            ],
        },
    }


def book(*healthy: str, known: bool = True) -> kubeletdevices.DeviceBook:
    devices = kubeletdevices.DeviceBook()
    if known:
        devices.report(RES, [(d, "Healthy") for d in healthy])
    return devices


@pytest.mark.parametrize(
    ("the_pod", "devices", "error"),
    [
        (pod(), book(), None),  # running containers are left alone
        (pod(init={}), book(), NO_HEALTHY),  # the finished init container needs healthy devices
        (pod(init={}), book("d0"), None),
        (pod(init={"restartPolicy": "Always"}), book(), None),  # a sidecar runs with its pod
        (pod(running=False), book(), NO_HEALTHY),  # CrashLoopBackOff
        (pod(running=False, held=["d1"]), book("d0"), NOT_HEALTHY),
        (pod(running=False, held=["d0"]), book("d0"), None),
        (pod(init={}), book(known=False), None),  # not a resource kubelet's checkpoint knows
        (pod(running=False, held="junk"), book("d0"), None),  # type: ignore[arg-type]
    ],
    ids=[
        "running",
        "init-no-devices",
        "init-devices-back",
        "sidecar",
        "crashloop",
        "held-unhealthy",
        "held-healthy",
        "unknown-resource",
        "garbage-record",
    ],
)
def test_readmission(the_pod: Any, devices: kubeletdevices.DeviceBook, error: str | None) -> None:
    assert kubeletreadmit.readmission_error(the_pod, devices, allocations_annotation=NOTE) == error


def test_garbage_annotation_and_quantity_do_not_raise() -> None:
    bad = pod(init={"resources": {"limits": {RES: "lots"}}})
    bad["metadata"]["annotations"][NOTE] = "{not json"
    assert kubeletreadmit.readmission_error(bad, book(), allocations_annotation=NOTE) is None


@pytest.mark.parametrize(
    ("hint", "numa_of", "expected"),
    [
        (None, {"a0": frozenset({0}), "b0": frozenset({1})}, ([], [], ["a0", "b0", "x"])),
        (frozenset({0}), {}, ([], [], ["a0", "b0", "x"])),  # no device has a topology
        (frozenset({0}), {"a0": frozenset({0}), "b0": frozenset({1})}, (["a0"], ["b0"], ["x"])),
        (frozenset({0, 1}), {"a0": frozenset({0}), "b0": frozenset({1})}, (["a0", "b0"], [], ["x"])),
        (frozenset({1}), {"a0": frozenset({0, 1}), "b0": frozenset()}, (["a0"], [], ["b0", "x"])),
    ],
    ids=["no-hint", "no-topology", "numa0", "both", "multi-node-device"],
)
def test_filter_by_affinity(
    hint: frozenset[int] | None, numa_of: dict[str, frozenset[int]], expected: tuple[list[str], ...]
) -> None:
    got = kubeletdevices.filter_by_affinity(["x", "b0", "a0"], numa_of=numa_of, hint=hint)
    assert got == expected
