"""The filter's walk in node-policy order (``order.ScoreOrder``, ``NodeInventory.pick_simple``) must
pick exactly the node that the pass over every candidate (``fit.scan_simple``) picks."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from vgpu.core import annotations as hami
from vgpu.core import fit
from vgpu.core.config import Config
from vgpu.core.device import Gpu, GpuUuid
from vgpu.core.poddevices import ContainerDevice
from vgpu.core.request import ContainerRequest
from vgpu_scheduler import inventory
from vgpu_scheduler.inventory import Picked
from vgpu_scheduler.order import ScoreOrder
from vgpu_scheduler.state import ClusterState

from tests.scheduler.scenario import T0, FakeClock

KEYS = hami.KEYS
STAMP = "2027-01-15T08:00:00.000000Z"  # T0 as a Lease renewTime
STALE = "2027-01-15T07:00:00.000000Z"  # an hour before: the plugin stopped reporting


def test_walk_orders_by_score_then_name_both_ways() -> None:
    order = ScoreOrder()
    for name, score in (("b", 5.0), ("a", 5.0), ("c", 1.0), ("d", 9.0)):
        order.set(name, score)
    assert list(order.walk(binpack=True)) == ["d", "a", "b", "c"]  # highest first, ties by name
    assert list(order.walk(binpack=False)) == ["c", "a", "b", "d"]  # lowest first, ties by name
    order.set("d", 0.0)  # a node moves when its usage changes
    order.discard("a")
    order.discard("ghost")  # not there: nothing happens
    assert list(order.walk(binpack=True)) == ["b", "c", "d"]
    assert list(order.walk(binpack=False)) == ["d", "c", "b"]
    assert (len(order), order.score("b"), order.score("a")) == (3, 5.0, None)


@given(
    st.lists(
        st.tuples(st.sampled_from("abcdefgh"), st.none() | st.sampled_from([0.0, 1.5, 2.0, 10.0, 30.0])),
        max_size=40,
    )
)
def test_walk_is_always_the_sorted_order(ops: list[tuple[str, float | None]]) -> None:
    order = ScoreOrder()
    scores: dict[str, float] = {}
    for name, score in ops:
        if score is None:
            order.discard(name)
            scores.pop(name, None)
        else:
            order.set(name, score)
            scores[name] = score
    assert list(order.walk(binpack=False)) == sorted(scores, key=lambda n: (scores[n], n))
    assert list(order.walk(binpack=True)) == sorted(scores, key=lambda n: (-scores[n], n))


def _node(name: str, gpus: list[Gpu], cordoned: list[int]) -> dict[str, Any]:
    notes = {KEYS.node_register: hami.encode_node_register(gpus)}
    if cordoned:
        notes[KEYS.device_cordon] = ",".join(gpus[i].uuid for i in cordoned if i < len(gpus))
    return {"metadata": {"name": name, "annotations": notes}}


def _lease(node: str, renew: str) -> dict[str, Any]:
    return {"metadata": {"name": f"vgpu-device-plugin-{node}"}, "spec": {"renewTime": renew}}


def _add_live_node(state: ClusterState, name: str, gpus: list[Gpu], *, used_mib: int) -> None:
    """A node whose plugin reports, with one pod using ``used_mib`` of its first GPU."""
    state.apply("nodes", "ADDED", _node(name, gpus, []))
    state.apply("leases", "ADDED", _lease(name, STAMP))
    state.apply("pods", "ADDED", _pod(f"{name}-p", name, [ContainerDevice(gpus[0].uuid, used_mib, 0)]))


def _pod(uid: str, node: str, devices: list[ContainerDevice]) -> dict[str, Any]:
    notes = {
        KEYS.assigned_node: node,
        KEYS.devices_allocated: hami.encode_pod_devices([devices]),
        KEYS.bind_phase: "success",
    }
    return {
        "metadata": {"uid": uid, "name": uid, "namespace": "ns", "annotations": notes},
        "spec": {"nodeName": node, "containers": [{"name": "c"}]},
        "status": {"phase": "Running"},
    }


@st.composite
def clusters(draw: st.DrawFn) -> tuple[ClusterState, list[str]]:
    """A state fed the way the watches feed it: nodes (some unhealthy or cordoned GPUs, some with
    no or a stale Lease, some with a corrupt register annotation) and pods using their GPUs."""
    state = ClusterState(Config(), clock=FakeClock(T0))
    names = [f"n{i}" for i in range(draw(st.integers(1, 12)))]
    for name in names:
        gpus = [
            Gpu(
                GpuUuid(f"GPU-{name}-{i}"),
                i,
                draw(st.integers(1, 4)),
                draw(st.sampled_from([4000, 8000, 16000])),
                100,
                "NVIDIA-T4",
                health=draw(st.booleans() | st.just(True)),
            )
            for i in range(draw(st.integers(1, 4)))
        ]
        node = _node(name, gpus, draw(st.lists(st.integers(0, 3), max_size=2)))
        if draw(st.integers(0, 9)) == 0:
            node["metadata"]["annotations"][KEYS.node_register] = "[{garbage"
        state.apply("nodes", "ADDED", node)
        renew = draw(st.sampled_from([STAMP, STAMP, STAMP, STALE, None]))
        if renew is not None:
            state.apply("leases", "ADDED", _lease(name, renew))
        for p in range(draw(st.integers(0, 6))):
            gpu = draw(st.sampled_from(gpus))
            device = ContainerDevice(
                gpu.uuid, draw(st.sampled_from([0, 1000, 3000, 8000])), draw(st.sampled_from([0, 30, 100]))
            )
            state.apply("pods", "ADDED", _pod(f"{name}-p{p}", name, [device]))
        if draw(st.integers(0, 9)) == 0:  # a pod leaves: the node moves in the order
            state.apply("pods", "DELETED", _pod(f"{name}-p0", name, []))
    return state, names


containers = st.builds(
    ContainerRequest,
    name=st.just("c"),
    count=st.integers(1, 3),
    memory_mib=st.sampled_from([0, 500, 2000, 7000, 16000]),
    memory_percent=st.none() | st.sampled_from([25, 50, 100]),
    cores=st.sampled_from([0, 10, 50, 100]),
)


@given(clusters(), containers, st.booleans(), st.data())
def test_pick_simple_picks_what_the_full_pass_picks(
    cluster: tuple[ClusterState, list[str]], container: ContainerRequest, binpack: bool, data: st.DataObject
) -> None:
    state, names = cluster
    if container.memory_mib:
        container = dataclasses.replace(container, memory_percent=None)
    candidates = data.draw(st.lists(st.sampled_from([*names, "ghost"]), unique=True), label="candidates")
    busy = frozenset(data.draw(st.lists(st.sampled_from(names)), label="busy"))
    for name in names:  # in the order: every node with an open GPU, at the score its view carries
        view = state.inventory.view(name)
        in_order = state.inventory.order.score(name)
        assert in_order == (view.score if view is not None and view.open else None)
    views = state.inventory.live_views(candidates, T0)
    scan = fit.scan_simple(views, candidates, container, binpack=binpack, busy=busy)
    expected = candidates[scan.best] if scan.best >= 0 else None
    original = inventory.PICK_CHECKS
    inventory.PICK_CHECKS = 10**6  # no cap: no node found must mean that no candidate fits
    try:
        picked = state.inventory.pick_simple(candidates, container, binpack=binpack, busy=busy, now=T0)
    finally:
        inventory.PICK_CHECKS = original
    if expected is None:
        assert picked == "none_fit"
    else:
        assert picked == Picked(expected, views[candidates.index(expected)])
        assert isinstance(picked, Picked) and picked.view is views[candidates.index(expected)]


def test_pick_simple_hands_over_to_the_full_pass_after_its_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    state = ClusterState(Config(), clock=FakeClock(T0))
    for i in range(6):  # n0-n4 have GPUs of 4,000 MiB, n5 of 16,000; the fuller ones come first
        name = f"n{i}"
        gpus = [Gpu(GpuUuid(f"GPU-{name}-{g}"), g, 4, 4000 if i < 5 else 16000, 100, "T4") for g in range(2)]
        _add_live_node(state, name, gpus, used_mib=100 * (10 - i))
    wants = ContainerRequest("c", 1, memory_mib=8000)  # only n5's GPUs have that much
    names = [f"n{i}" for i in range(6)]
    assert list(state.inventory.order.walk(binpack=True))[-1] == "n5"
    found = Picked("n5", state.inventory.view("n5"))
    assert state.inventory.pick_simple(names, wants, binpack=True, busy=frozenset(), now=T0) == found
    monkeypatch.setattr(inventory, "PICK_CHECKS", 5)
    assert state.inventory.pick_simple(names, wants, binpack=True, busy=frozenset(), now=T0) == "check_limit"
    monkeypatch.setattr(inventory, "PICK_CHECKS", 6)
    assert state.inventory.pick_simple(names, wants, binpack=True, busy=frozenset(), now=T0) == found
    assert state.inventory.pick_simple(names[:5], wants, binpack=True, busy=frozenset(), now=T0) == "none_fit"


def test_full_nodes_leave_the_order_and_come_back() -> None:
    state = ClusterState(Config(), clock=FakeClock(T0))
    gpus = [Gpu(GpuUuid("GPU-x-0"), 0, 1, 16000, 100, "T4")]  # one slot
    state.apply("nodes", "ADDED", _node("x", gpus, []))
    assert list(state.inventory.order.walk(binpack=True)) == ["x"]
    state.apply("pods", "ADDED", _pod("p", "x", [ContainerDevice(gpus[0].uuid, 1000, 0)]))
    assert list(state.inventory.order.walk(binpack=True)) == []  # no free slot: no pod can go there
    state.apply("pods", "DELETED", _pod("p", "x", []))
    assert list(state.inventory.order.walk(binpack=True)) == ["x"]
    state.apply("nodes", "MODIFIED", _node("x", gpus, [0]))  # its only GPU cordoned
    assert list(state.inventory.order.walk(binpack=True)) == []
    state.apply("nodes", "DELETED", _node("x", gpus, []))
    assert len(state.inventory.order) == 0


def test_busy_nodes_after_the_first_that_fits_are_passed_over_unchecked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Nodes with a bind in flight come first in binpack order; once one of them fits (the answer
    if no free node fits), the others cost no check, so a burst of binds does not use up the walk."""
    state = ClusterState(Config(), clock=FakeClock(T0))
    names = [f"n{i}" for i in range(5)]
    for i, name in enumerate(names):
        _add_live_node(
            state, name, [Gpu(GpuUuid(f"GPU-{name}-0"), 0, 4, 16000, 100, "T4")], used_mib=1000 * (5 - i)
        )
    assert list(state.inventory.order.walk(binpack=True)) == names
    wants = ContainerRequest("c", 1, memory_mib=1000)
    busy = frozenset(names[:4])  # binpack's four fullest: every one fits, all have binds in flight
    monkeypatch.setattr(inventory, "PICK_CHECKS", 2)  # n0 (the fallback) and n4: n1-n3 unchecked
    assert state.inventory.pick_simple(names, wants, binpack=True, busy=busy, now=T0) == Picked(
        "n4", state.inventory.view("n4")
    )
    monkeypatch.setattr(inventory, "PICK_CHECKS", 1)
    assert state.inventory.pick_simple(names, wants, binpack=True, busy=busy, now=T0) == "check_limit"
    # only busy nodes fit: the best of them, as the full pass would take it
    assert state.inventory.pick_simple(names[:4], wants, binpack=True, busy=busy, now=T0) == Picked(
        "n0", state.inventory.view("n0")
    )
