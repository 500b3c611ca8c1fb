"""charge_of: a pod's GPU footprint from its annotations, table-driven, garbage included."""

from __future__ import annotations

from typing import Any

import pytest
from vgpu.core import annotations
from vgpu_scheduler.charges import charge_of

KEYS = annotations.KEYS
NOW = 1_700_000_000.0
DEVICES = "GPU-a,NVIDIA,1000,30:;"


def pod(
    notes: dict[str, str], *, node: str | None = None, phase: str = "Pending", **spec: Any
) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "ns", "annotations": notes},
        "spec": {**({"nodeName": node} if node else {}), **spec},
        "status": {"phase": phase},
    }


DECIDED = {KEYS.assigned_node: "n1", KEYS.devices_allocated: DEVICES, KEYS.assigned_time: str(int(NOW))}


@pytest.mark.parametrize(
    ("obj", "held_mib"),
    [
        (pod(DECIDED, node="n1"), 1000),
        (pod({**DECIDED, KEYS.bind_phase: "allocating"}), 1000),  # bound in the Binding, watch lags
        (pod(DECIDED), 1000),  # filtered, not bound yet, within the TTL
        (pod({**DECIDED, KEYS.assigned_time: str(int(NOW - 61))}), None),  # expired decision
        (pod({**DECIDED, KEYS.assigned_time: "garbage"}), 1000),  # unreadable time: kept, never expires
        (pod(DECIDED, node="n1", phase="Succeeded"), None),
        (pod(DECIDED, node="n1", phase="Failed"), None),
        (pod({KEYS.devices_allocated: DEVICES}, node="n1"), None),  # no node annotation
        (pod({**DECIDED, KEYS.devices_allocated: "not,a,device"}, node="n1"), None),  # corrupt
        ({}, None),
        ({"metadata": None, "spec": None, "status": None}, None),
    ],
    ids=[
        "bound",
        "binding-in-flight",
        "reserved",
        "expired",
        "garbage-time",
        "succeeded",
        "failed",
        "no-node",
        "corrupt-devices",
        "empty",
        "nulls",
    ],
)
def test_charge_of(obj: dict[str, Any], held_mib: int | None) -> None:
    got = charge_of(obj, keys=KEYS, reservation_ttl_s=60, now=NOW)
    if held_mib is None:
        assert got is None
    else:
        assert got is not None and got.node == "n1" and got.namespace == "ns"
        assert sum(u.memory_mib for u in got.usage.values()) == held_mib
        assert got.devices_raw == DEVICES
