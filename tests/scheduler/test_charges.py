"""charge_of: a pod's GPU footprint from its annotations, table-driven, garbage included."""

from __future__ import annotations

from typing import Any

import pytest
from vgpu.core import annotations
from vgpu.core.device import GpuUsage, GpuUuid
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


SIDECAR_POD_DEVICES = "GPU-a,NVIDIA,8000,0:;GPU-a,NVIDIA,4000,10:;GPU-a,NVIDIA,2000,20:;"
SETUP = {"name": "setup", "resources": {}}
PROXY = {"name": "proxy", "restartPolicy": "Always", "resources": {}}
EXITED = {"terminated": {"exitCode": 0, "reason": "Completed"}}
RUNNING = {"running": {"startedAt": "2026-01-01T00:00:00Z"}}
RESTARTING = {"terminated": {"exitCode": 137, "reason": "Error"}}


@pytest.mark.parametrize(
    ("setup_state", "proxy_state", "want"),
    [
        # the regular init container finished: only its share goes; the running sidecar stays
        (EXITED, RUNNING, (2, 6000, 30)),
        (EXITED, RESTARTING, (2, 6000, 30)),  # a sidecar between restarts still holds its slice
        # the regular init container still runs (beside nothing of the pod's yet): its peak counts
        (RUNNING, RUNNING, (2, 8000, 30)),
    ],
    ids=["init-exited-sidecar-running", "init-exited-sidecar-restarting", "init-running"],
)
def test_a_sidecar_is_charged_after_the_init_containers_finish(
    setup_state: dict[str, Any], proxy_state: dict[str, Any], want: tuple[int, int, int]
) -> None:
    obj = pod(
        {**DECIDED, KEYS.devices_allocated: SIDECAR_POD_DEVICES},
        node="n1",
        phase="Running",
        initContainers=[SETUP, PROXY],
        containers=[{"name": "main", "resources": {}}],
    )
    obj["status"]["initContainerStatuses"] = [
        {"name": "setup", "state": setup_state},
        {"name": "proxy", "state": proxy_state},
    ]
    got = charge_of(obj, keys=KEYS, reservation_ttl_s=60, now=NOW)
    assert got is not None
    assert got.usage == {GpuUuid("GPU-a"): GpuUsage(*want)}
