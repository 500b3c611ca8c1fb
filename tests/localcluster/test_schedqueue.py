"""kube-scheduler's queue (active, back-off, unschedulable) and its numFeasibleNodesToFind arithmetic."""

from __future__ import annotations

import asyncio
import decimal
from typing import Any

import pytest
from vgpu.localcluster import intree, schedcache
from vgpu.localcluster.schedqueue import SchedulingQueue, Where, backoff_s

from tests.localcluster.conftest import make_node, make_pod


@pytest.mark.parametrize(
    ("nodes", "percentage", "expected"),
    [
        (0, 0, 0),
        (1, 0, 1),
        (99, 0, 99),  # below 100 nodes: every node
        (99, 10, 99),
        (100, 0, 100),  # 50 % of 100 is 50, but at least 100
        (1000, 0, 420),  # 50 - 8 = 42 %
        (5000, 0, 500),  # 50 - 40 = 10 %
        (6000, 0, 300),  # 50 - 48 = 2 %, floored at 5 %
        (20000, 0, 1000),  # 5 % floor
        (1000, 100, 1000),  # percentageOfNodesToScore: 100 scores every node
        (1000, 5, 100),  # 50 nodes, at least 100
        (1000, 50, 500),
    ],
    ids=str,
)
def test_num_feasible_nodes_to_find(nodes: int, percentage: int, expected: int) -> None:
    assert intree.num_feasible_nodes_to_find(nodes, percentage) == expected


@pytest.mark.parametrize(
    ("attempts", "expected"), [(1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (5, 10.0), (12, 10.0)]
)
def test_backoff_doubles_from_one_second_to_ten(attempts: int, expected: float) -> None:
    assert backoff_s(attempts, initial_s=1.0, max_s=10.0) == expected


def _search(nodes: int, *, full: frozenset[int] = frozenset()) -> schedcache.SchedulerCache:
    cache = schedcache.SchedulerCache()
    for i in range(nodes):
        cache.set_node(make_node(f"n{i:04d}", allocatable={"example.com/gpu": "0" if i in full else "1"}))
    return cache


def _facts(limits: dict[str, Any] | None = None) -> intree.PodFacts:
    pod = make_pod("p", limits=limits)
    return intree.pod_facts(pod, {k: decimal.Decimal(v) for k, v in (limits or {}).items()}, ignored=())


def test_find_feasible_stops_at_num_feasible_and_rotates_the_start() -> None:
    cache = _search(1000)
    first = cache.find_feasible(_facts(), percentage=0)
    second = cache.find_feasible(_facts(), percentage=0)
    assert (len(first.nodes), first.nodes[0], first.nodes[-1]) == (420, "n0000", "n0419")
    assert (len(second.nodes), second.nodes[0]) == (420, "n0420")
    third = cache.find_feasible(_facts(), percentage=0)
    assert third.nodes[0] == "n0840" and third.nodes[-1] == "n0259"  # wrapped around
    assert cache.find_feasible(_facts(), percentage=100).nodes[0] == "n0260"


def test_find_feasible_counts_the_infeasible_nodes_it_looked_at() -> None:
    cache = _search(200, full=frozenset({0, 1, 2}))
    found = cache.find_feasible(_facts({"example.com/gpu": 1}), percentage=0)
    assert len(found.nodes) == 100 and sorted(found.statuses) == ["n0000", "n0001", "n0002"]
    assert found.statuses["n0000"] == ["Insufficient example.com/gpu"]
    assert cache.find_feasible(_facts(), percentage=0).nodes[0] == "n0103"


async def test_unschedulable_pods_wait_for_a_move_and_respect_their_back_off() -> None:
    q: SchedulingQueue[str] = SchedulingQueue(initial_backoff_s=60.0, max_backoff_s=60.0)
    q.add("a")
    q.add("b")
    assert await q.pop() == ("a", 1)
    assert q.failed("a", 1, unschedulable=True) == 60.0
    assert q.where("a") is Where.UNSCHEDULABLE
    assert await q.pop() == ("b", 2)
    q.move_all()  # a cluster event while b's cycle runs
    assert q.where("a") is Where.BACKOFF  # still backing off: not straight to active
    q.failed("b", 2, unschedulable=True)
    assert q.where("b") is Where.BACKOFF  # its cycle saw the move begin: never parked as unschedulable


async def test_an_unschedulable_pod_past_its_back_off_goes_to_active_on_a_move() -> None:
    q: SchedulingQueue[str] = SchedulingQueue(initial_backoff_s=0.0, max_backoff_s=0.0)
    q.add("a")
    key, cycle = await q.pop()
    q.failed(key, cycle, unschedulable=True)
    assert q.where("a") is Where.UNSCHEDULABLE
    q.updated("a")  # the pod itself changed
    assert q.where("a") is Where.ACTIVE
    assert await asyncio.wait_for(q.pop(), 5) == ("a", 2)


async def test_a_pod_updated_during_its_cycle_is_retried_at_once_when_the_cycle_fails() -> None:
    """v1.20's PriorityQueue.Update adds a pod that is in no queue (in its cycle) to activeQ, so the
    failed cycle does not park it with the unschedulable pods, back-off or not."""
    q: SchedulingQueue[str] = SchedulingQueue(initial_backoff_s=60.0, max_backoff_s=60.0)
    q.add("a")
    key, cycle = await q.pop()
    q.updated("a")  # an annotation written while its filter runs
    assert q.where("a") is Where.IN_FLIGHT
    q.failed(key, cycle, unschedulable=True)
    assert q.where("a") is Where.ACTIVE
    assert await asyncio.wait_for(q.pop(), 5) == ("a", 2)
    q.failed("a", 2, unschedulable=True)  # no update this time: parked as before
    assert q.where("a") is Where.UNSCHEDULABLE


async def test_errors_back_off_then_park_as_unschedulable_after_repeated_failures() -> None:
    q: SchedulingQueue[str] = SchedulingQueue(
        initial_backoff_s=0.001, max_backoff_s=0.002, error_attempts_before_unschedulable=3
    )
    q.add("a")
    places = []
    for _ in range(3):
        key, cycle = await asyncio.wait_for(q.pop(), 5)  # back-off expiry brings it back
        q.failed(key, cycle, unschedulable=False)
        places.append(q.where("a"))
    assert places == [Where.BACKOFF, Where.BACKOFF, Where.UNSCHEDULABLE]
    assert q.attempts("a") == 3


async def test_unschedulable_pods_are_flushed_after_the_timeout() -> None:
    q: SchedulingQueue[str] = SchedulingQueue(
        initial_backoff_s=0.0, max_backoff_s=0.0, unschedulable_timeout_s=0.01
    )
    q.add("a")
    key, cycle = await q.pop()
    q.failed(key, cycle, unschedulable=True)
    assert q.where("a") is Where.UNSCHEDULABLE
    assert await asyncio.wait_for(q.pop(), 5) == ("a", 2)  # no event: the flush brings it back


async def test_forgotten_pods_leave_every_queue() -> None:
    q: SchedulingQueue[str] = SchedulingQueue(initial_backoff_s=0.0, max_backoff_s=0.0)
    q.add("a")
    q.add("a")  # seen again: queued once
    assert len(q) == 1
    key, cycle = await q.pop()
    q.forget("a")  # deleted during its cycle
    assert q.failed(key, cycle, unschedulable=True) == 0.0 and q.where("a") is None
    q.add("b")
    q.forget("b")
    q.add("c")
    assert await asyncio.wait_for(q.pop(), 5) == ("c", 2)


def test_remembered_verdicts_and_scores_follow_the_nodes_usage() -> None:
    cache = _search(1)
    facts = _facts({"example.com/gpu": 1})
    request = {"example.com/gpu": decimal.Decimal(1)}
    assert cache.find_feasible(facts, percentage=0).nodes == ["n0000"]
    empty = cache.score("n0000", request)
    pod = make_pod("a", limits={"example.com/gpu": 1, "cpu": "4"})
    cache.assume(("default", "a"), pod, "n0000")
    assert cache.find_feasible(facts, percentage=0).statuses == {"n0000": ["Insufficient example.com/gpu"]}
    assert cache.score("n0000", request) < empty  # 4 of 8 cpus taken
    cache.forget(("default", "a"), pod)
    assert cache.find_feasible(facts, percentage=0).nodes == ["n0000"]
    assert cache.score("n0000", request) == empty


@pytest.mark.parametrize(
    ("change", "reparsed"),
    [
        (
            lambda n: n["metadata"].setdefault("annotations", {}).update({"hami.io/mutex.lock": "t,ns,p"}),
            False,
        ),
        (lambda n: n["status"].update({"capacity": {"cpu": "9"}}), False),  # not read by the filters
        (lambda n: n["status"]["allocatable"].update({"cpu": "0"}), True),
        (lambda n: n["metadata"]["labels"].update({"zone": "b"}), True),
        (lambda n: n["spec"].update({"taints": [{"key": "k", "effect": "NoSchedule"}]}), True),
        (lambda n: n["spec"].update({"unschedulable": True}), True),
        (lambda n: n["status"]["conditions"][0].update({"status": "False"}), True),
    ],
    ids=["annotation", "capacity", "allocatable", "label", "taint", "unschedulable", "not-ready"],
)
def test_a_node_update_is_parsed_again_only_when_a_field_the_filters_read_changed(
    change: Any, reparsed: bool
) -> None:
    cache = schedcache.SchedulerCache()
    node = make_node("n1", labels={"zone": "a"})
    assert cache.set_node(node)
    before = cache.facts("n1")
    facts = _facts({"cpu": 1})
    assert cache.find_feasible(facts, percentage=0).nodes == ["n1"]
    updated = make_node("n1", labels={"zone": "a"})
    change(updated)
    moved = cache.set_node(updated)
    assert (cache.facts("n1") is not before) == reparsed
    assert moved == reparsed  # a move event (pending pods retried) only for a relevant change


def test_a_new_allocatable_is_seen_by_the_next_search_despite_the_remembered_verdict() -> None:
    cache = schedcache.SchedulerCache()
    cache.set_node(make_node("n1"))
    facts = _facts({"cpu": 1})
    assert cache.find_feasible(facts, percentage=0).nodes == ["n1"]
    cache.set_node(make_node("n1", allocatable={"cpu": "0"}))
    assert cache.find_feasible(facts, percentage=0).statuses == {"n1": ["Insufficient cpu"]}


async def test_queued_time_is_the_last_wait_in_the_active_queue() -> None:
    """From entering activeQ (added, or back from back-off) to the pop that hands the pod out."""
    now = [100.0]
    q: SchedulingQueue[str] = SchedulingQueue(initial_backoff_s=1.0, max_backoff_s=1.0, clock=lambda: now[0])
    assert q.queued_s("a") == 0.0  # unknown
    q.add("a")
    q.add("b")
    now[0] = 100.25
    assert await q.pop() == ("a", 1)
    assert q.queued_s("a") == pytest.approx(0.25)
    now[0] = 100.75
    assert await q.pop() == ("b", 2)
    assert q.queued_s("b") == pytest.approx(0.75)
    q.failed("a", 1, unschedulable=False)  # back-off for 1 s: until 101.75
    now[0] = 102.0
    assert await asyncio.wait_for(q.pop(), 5) == ("a", 3)  # the flush put it in activeQ, popped at once
    assert q.queued_s("a") == 0.0
