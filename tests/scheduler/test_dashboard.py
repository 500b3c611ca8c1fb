"""The dashboard's snapshot (a pure function of the state) and the filter's pending reasons."""

from __future__ import annotations

import json
from typing import Any

import pytest
from vgpu.core import annotations as hami
from vgpu.core import fit
from vgpu.core.config import Config
from vgpu.core.device import GpuUsage, GpuUuid
from vgpu.core.lease import parse_micro_time
from vgpu_scheduler import dashboard
from vgpu_scheduler.pending import FilterReasons
from vgpu_scheduler.state import ClusterState

from tests.scheduler.scenario import T0, FakeClock, gpu_container, gpus

KEYS = hami.KEYS
STAMP = "2027-01-15T08:00:00.000000Z"  # T0 as a Lease renewTime
ONE_GPU_1000_MIB = [{"gpus": 1, "memoryMib": 1000, "memoryPercent": None, "cores": 0}]


def node(name: str, *, register: str | None = None, n: int = 2) -> dict[str, Any]:
    ann = {KEYS.node_register: register if register is not None else hami.encode_node_register(gpus(name, n))}
    return {"metadata": {"name": name, "annotations": ann}}


def lease(node_name: str, renew: str = STAMP) -> dict[str, Any]:
    return {"metadata": {"name": f"vgpu-device-plugin-{node_name}"}, "spec": {"renewTime": renew}}


def pod(
    name: str,
    *,
    node_name: str | None = None,
    devices: str | None = None,
    ns: str = "team",
    scheduler: str = "vgpu-scheduler",
    containers: list[dict[str, Any]] | None = None,
    phase: str = "Pending",
) -> dict[str, Any]:
    ann: dict[str, str] = {}
    if devices is not None:
        ann = {
            KEYS.assigned_node: node_name or "",
            KEYS.devices_allocated: devices,
            KEYS.bind_phase: "success",
        }
    spec: dict[str, Any] = {
        "schedulerName": scheduler,
        "containers": containers if containers is not None else [gpu_container(mem=1000)],
    }
    if node_name is not None and devices is not None:
        spec["nodeName"] = node_name
    return {
        "metadata": {"name": name, "namespace": ns, "uid": f"uid-{name}", "annotations": ann},
        "spec": spec,
        "status": {"phase": phase},
    }


@pytest.fixture
def state() -> ClusterState:
    """n1: two 16000 MiB GPUs, Lease fresh; n2: no Lease; n3: a corrupt register annotation."""
    s = ClusterState(Config(), clock=FakeClock())
    s.apply("nodes", "ADDED", node("n1"))
    s.apply("leases", "ADDED", lease("n1"))
    s.apply("nodes", "ADDED", node("n2", n=1))
    s.apply("nodes", "ADDED", node("n3", register="garbage"))
    s.apply("leases", "ADDED", lease("n3"))
    return s


def test_t0_matches_the_lease_stamp() -> None:
    assert parse_micro_time(STAMP).timestamp() == T0


def test_slices_show_who_holds_each_gpu_with_bound_and_binding_pods(state: ClusterState) -> None:
    state.apply("pods", "ADDED", pod("a", node_name="n1", devices="GPU-n1-0,NVIDIA,4000,30:;"))
    state.apply("pods", "ADDED", pod("b", node_name="n1", devices="GPU-n1-0,NVIDIA,8000,20:;", ns="alpha"))
    placement = fit.Placement(devices=(), usage={GpuUuid("GPU-n1-1"): GpuUsage(1, 2000, 10)})
    state.apply("pods", "ADDED", pod("c"))
    state.reserve("uid-c", namespace="team", node="n1", placement=placement, devices_raw="x")
    snap = dashboard.snapshot(state, FilterReasons(), now=T0)
    n1 = snap["nodes"][0]
    assert n1["name"] == "n1" and n1["problem"] is None
    gpu0, gpu1 = n1["gpus"]
    assert (gpu0["index"], gpu0["uuid"], gpu0["memoryMib"], gpu0["cores"]) == (0, "GPU-n1-0", 16000, 100)
    # the model as `vgpu status`, `vgpu simulate` and the demo show it, beside the register's type
    assert (gpu0["type"], gpu0["model"]) == ("NVIDIA-Tesla-T4", "Tesla-T4")
    assert (gpu0["usedMib"], gpu0["usedCores"], gpu0["usedSlots"]) == (12000, 50, 2)
    assert gpu0["pods"] == [  # sorted by namespace, then name
        {"namespace": "alpha", "name": "b", "memoryMib": 8000, "cores": 20, "binding": False},
        {"namespace": "team", "name": "a", "memoryMib": 4000, "cores": 30, "binding": False},
    ]
    assert gpu1["pods"] == [
        {"namespace": "team", "name": "c", "memoryMib": 2000, "cores": 10, "binding": True}
    ]
    assert snap["totals"] == {
        "nodes": 3,
        "nodesWithProblems": 2,
        "gpus": 3,
        "memoryMib": 48000,
        "usedMib": 14000,
        "cores": 300,
        "usedCores": 60,
        "pods": 3,
        "pending": 1,
    }
    assert snap["pending"] == [
        {
            "namespace": "team",
            "name": "c",
            "mode": "extender",
            "reason": "assigned to n1; waiting for the bind",
            "reasonAt": None,
            "asks": ONE_GPU_1000_MIB,
        }
    ]
    json.dumps(snap)  # JSON-able as it is


def test_nodes_whose_device_plugin_is_not_reporting_say_why(state: ClusterState) -> None:
    clock = FakeClock(T0 + 3600)
    snap = dashboard.snapshot(state, FilterReasons(), now=clock())
    problems = {n["name"]: n["problem"] for n in snap["nodes"]}
    assert problems["n1"] == "device plugin not reporting for 3600 s"  # the Lease went stale
    assert problems["n2"] == "device plugin not reporting (no lease)"
    assert problems["n3"] is not None and problems["n3"].startswith("corrupt register annotation")
    assert [n["gpus"] for n in snap["nodes"] if n["name"] == "n3"] == [[]]
    fresh = dashboard.snapshot(state, FilterReasons(), now=T0 + 1)
    assert {n["name"]: n["problem"] for n in fresh["nodes"]}["n1"] is None


def test_pending_gpu_pods_with_their_reason_and_nothing_else(state: ClusterState) -> None:
    reasons = FilterReasons()
    state.apply("pods", "ADDED", pod("big", containers=[gpu_container(mem=200_000)]))
    reasons.failed("uid-big", "0/3 nodes fit: 1 no GPU with 200000 MiB free (n1)", now=T0 - 5)
    state.apply("pods", "ADDED", pod("new"))
    state.apply("pods", "ADDED", pod("other", scheduler="default-scheduler", ns="a"))
    state.apply("pods", "ADDED", pod("cpu", containers=[{"name": "c", "image": "x"}]))
    state.apply("pods", "ADDED", pod("done", phase="Succeeded"))
    state.apply("pods", "ADDED", pod("bound", node_name="n1", devices="GPU-n1-0,NVIDIA,1000,0:;"))
    # an unreadable request is listed only once the filter has said why
    bad = [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "lots"}}}]
    state.apply("pods", "ADDED", pod("garbled", containers=bad))
    state.apply("pods", "ADDED", pod("garbled-seen", containers=bad))
    reasons.failed("uid-garbled-seen", "invalid resource", now=T0)
    snap = dashboard.snapshot(state, reasons, now=T0)
    assert snap["pending"] == [
        {
            "namespace": "a",
            "name": "other",
            "mode": "extender",
            "reason": "schedulerName is 'default-scheduler', not 'vgpu-scheduler': kube-vgpu does not place it",
            "reasonAt": None,
            "asks": ONE_GPU_1000_MIB,
        },
        {
            "namespace": "team",
            "name": "big",
            "mode": "extender",
            "reason": "0/3 nodes fit: 1 no GPU with 200000 MiB free (n1)",
            "reasonAt": T0 - 5,
            "asks": [{"gpus": 1, "memoryMib": 200_000, "memoryPercent": None, "cores": 0}],
        },
        {  # its request cannot be read: what it asks is not known
            "namespace": "team",
            "name": "garbled-seen",
            "mode": "extender",
            "reason": "invalid resource",
            "reasonAt": T0,
            "asks": [],
        },
        {
            "namespace": "team",
            "name": "new",
            "mode": "extender",
            "reason": "no filter call yet: kube-scheduler has not asked kube-vgpu (its own checks may have ruled out every node: kubectl describe pod)",
            "reasonAt": None,
            "asks": ONE_GPU_1000_MIB,
        },
    ]
    capped = dashboard.snapshot(state, reasons, now=T0, max_pending=2)
    assert [p["name"] for p in capped["pending"]] == ["other", "big"]
    assert capped["totals"]["pending"] == 4


def test_snapshot_changes_nothing(state: ClusterState) -> None:
    state.apply("pods", "ADDED", pod("a", node_name="n1", devices="GPU-n1-0,NVIDIA,4000,30:;"))
    reasons = FilterReasons()
    reasons.failed("uid-gone", "x", now=T0)
    generation = state.generation
    first = dashboard.snapshot(state, reasons, now=T0)
    assert dashboard.snapshot(state, reasons, now=T0) == first
    assert state.generation == generation and len(reasons) == 1


def test_every_state_change_bumps_the_generation_and_calls_the_hook(state: ClusterState) -> None:
    calls: list[int] = []
    state.on_change = lambda: calls.append(state.generation)
    before = state.generation
    state.apply("pods", "ADDED", pod("a", node_name="n1", devices="GPU-n1-0,NVIDIA,4000,30:;"))
    state.apply("leases", "MODIFIED", lease("n1"))
    state.release("uid-a")
    assert state.generation > before + 2 and len(calls) == state.generation - before
    assert dashboard.snapshot(state, FilterReasons(), now=T0)["generation"] == state.generation


def test_an_empty_cluster_is_an_empty_snapshot() -> None:
    snap = dashboard.snapshot(ClusterState(Config(), clock=FakeClock()), FilterReasons(), now=T0)
    assert snap["nodes"] == [] and snap["pending"] == [] and snap["totals"]["gpus"] == 0


# --- the filter's reasons ---------------------------------------------------------------------


def test_reasons_keep_the_last_one_per_pod_bounded_oldest_out() -> None:
    reasons = FilterReasons(max_pods=2)
    reasons.failed("a", "first", now=1.0)
    reasons.failed("b", "b", now=2.0)
    reasons.failed("a", "second", now=3.0)  # a is now the newest
    reasons.failed("c", "c", now=4.0)  # b, the oldest, goes
    assert reasons.get("b") is None
    got = reasons.get("a")
    assert got is not None and (got.message, got.at_s) == ("second", 3.0)
    reasons.placed("a")
    assert reasons.get("a") is None and len(reasons) == 1
    assert reasons.prune({"x"}) == 1 and len(reasons) == 0
    with pytest.raises(ValueError, match="max_pods"):
        FilterReasons(max_pods=0)
