"""/preempt is bounded (issue 49): its priority is the cluster's, and one call cannot hold the loop."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

from vgpu.core.config import Config
from vgpu.localcluster.client import LocalKubeApi
from vgpu.localcluster.store import Store
from vgpu_scheduler.events import EventRecorder
from vgpu_scheduler.preempt import Preempter
from vgpu_scheduler.priorities import PriorityClasses
from vgpu_scheduler.state import ClusterState

from bench import fleet
from tests.scheduler.scenario import Cluster, gpus
from tests.scheduler.test_preempt import HIGH, LOW, meta_args, pending, running, uid, victims


async def test_a_body_priority_above_the_clusters_evicts_nothing() -> None:
    c = Cluster()
    c.add_node("node-a", gpus("node-a", 1))
    await c.start()
    try:
        running(c, "same", "node-a", 0, 15000, priority=LOW)
        pre = pending(c, "peer", 8000, priority=LOW)
        await c.synced()
        forged = {**pre, "spec": {**pre["spec"], "priority": 10**30}}
        status, body = await c.post("preempt", meta_args(forged, {"node-a": []}))
        assert status == 200 and victims(body) == {}, body
        # the same call with the priority the cluster gave it: nothing either, and a real one works
        honest = pending(c, "boss", 8000, priority=HIGH)
        await c.synced()
        status, body = await c.post("preempt", meta_args(honest, {"node-a": []}))
        assert victims(body) == {"node-a": [uid(c, "same")]}, body
    finally:
        await c.stop()


async def test_the_priority_class_decides_over_the_pods_copy() -> None:
    classes = PriorityClasses()
    classes.apply("ADDED", {"metadata": {"name": "high"}, "value": 1000, "preemptionPolicy": "Never"})
    pod = {"spec": {"priorityClassName": "high", "priority": 5}}
    assert classes.standing(pod).priority == 1000 and not classes.standing(pod).may_preempt
    classes.apply("DELETED", {"metadata": {"name": "high"}})
    assert classes.standing(pod).priority == 5 and classes.standing(pod).may_preempt  # the admitted value
    for garbage in ({"metadata": {"name": "x"}, "value": "9"}, {"metadata": {}, "value": 1}, {}):
        classes.apply("ADDED", garbage)
    assert classes.by_name == {}
    assert classes.standing({"spec": "nonsense"}).priority == 0


async def test_an_unknown_preemptor_preempts_nothing() -> None:
    c = Cluster()
    c.add_node("node-a", gpus("node-a", 1))
    await c.start()
    try:
        running(c, "low", "node-a", 0, 15000, priority=LOW)
        await c.synced()
        stranger = {
            "metadata": {"name": "ghost", "namespace": "default", "uid": "no-such-uid"},
            "spec": {
                "priority": HIGH,
                "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
            },
        }
        status, body = await c.post("preempt", meta_args(stranger, {"node-a": []}))
        assert status == 200 and victims(body) == {} and "not a known pod" in body["Error"]
    finally:
        await c.stop()


class Ticking:
    """A work clock that advances ``step_s`` at every read."""

    def __init__(self, step_s: float) -> None:
        self._times = itertools.count()
        self._step_s = step_s

    def __call__(self) -> float:
        return next(self._times) * self._step_s


def _preemptor() -> dict[str, Any]:
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "15000"}
    return {
        "metadata": {"name": "train", "namespace": "default", "uid": "train-uid"},
        "spec": {"priority": 1000, "containers": [{"name": "c", "resources": {"limits": limits}}]},
        "status": {"phase": "Pending"},
    }


async def test_a_call_over_many_nodes_gives_the_loop_turns_and_stops_at_its_budget() -> None:
    state = ClusterState(Config(), clock=lambda: 1_000_000.0)
    fleet.feed(state, 100, 1_000_000.0)
    pod = _preemptor()
    state.apply("pods", "ADDED", pod)
    preempter = Preempter(
        config=Config(),
        state=state,
        events=EventRecorder(None, component="test"),  # type: ignore[arg-type]
        clock=lambda: 1_000_000.0,
        work_clock=Ticking(0.001),  # every node judged "takes" a millisecond or more
        pace_clock=Ticking(0.001),  # and each pacing check one more: a turn every other check
        budget_s=0.030,
        deadline_s=3600.0,
        slice_s=0.002,
    )
    turns = 0

    async def other_work() -> None:
        nonlocal turns
        while True:
            turns += 1
            await asyncio.sleep(0)

    other = asyncio.create_task(other_work())
    await asyncio.sleep(0)
    before = turns
    offered = {fleet.node_name(n): {"Pods": [], "NumPDBViolations": 0} for n in range(100)}
    reply = await preempter.preempt({"Pod": pod, "NodeNameToMetaVictims": offered})
    other.cancel()
    answered = reply.body["NodeNameToMetaVictims"]
    assert 5 <= len(answered) < 100, len(answered)  # the budget left the rest out
    assert all(len(v["Pods"]) == 1 for v in answered.values())
    assert turns - before >= 5  # the loop ran other work while the call judged nodes


class Manual:
    """A clock the test moves."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_a_call_stops_at_its_deadline_when_the_calls_beside_it_take_the_loop() -> None:
    # the loop is shared with the calls beside it: when their work in the call's turns makes the
    # loop's time since the call began pass the deadline, the nodes not judged by then are left
    # out, however little the call's own work took
    state = ClusterState(Config(), clock=lambda: 1_000_000.0)
    fleet.feed(state, 100, 1_000_000.0)
    pod = _preemptor()
    state.apply("pods", "ADDED", pod)
    cpu = Manual()  # the loop thread's CPU: only the others' work moves it
    preempter = Preempter(
        config=Config(),
        state=state,
        events=EventRecorder(None, component="test"),  # type: ignore[arg-type]
        clock=lambda: 1_000_000.0,
        work_clock=cpu,
        pace_clock=Ticking(0.001),  # a turn at every other pacing check
        budget_s=3600.0,
        deadline_s=0.030,
        slice_s=0.002,
    )
    turns = 0

    async def others() -> None:  # 5 ms of the loop at each turn
        nonlocal turns
        while True:
            turns += 1
            cpu.now += 0.005
            await asyncio.sleep(0)

    other = asyncio.create_task(others())
    await asyncio.sleep(0)
    offered = {fleet.node_name(n): {"Pods": [], "NumPDBViolations": 0} for n in range(100)}
    reply = await preempter.preempt({"Pod": pod, "NodeNameToMetaVictims": offered})
    other.cancel()
    answered = reply.body["NodeNameToMetaVictims"]
    assert 1 <= len(answered) < 100, len(answered)  # the deadline left the rest out
    assert all(len(v["Pods"]) == 1 for v in answered.values())


async def test_a_machine_busy_with_other_processes_does_not_shrink_the_answer() -> None:
    # wall time the loop thread did not run (the machine ran other processes) is no one's work
    state = ClusterState(Config(), clock=lambda: 1_000_000.0)
    fleet.feed(state, 100, 1_000_000.0)
    pod = _preemptor()
    state.apply("pods", "ADDED", pod)
    preempter = Preempter(
        config=Config(),
        state=state,
        events=EventRecorder(None, component="test"),  # type: ignore[arg-type]
        clock=lambda: 1_000_000.0,
        work_clock=lambda: 0.0,
        pace_clock=Ticking(0.010),  # 10 ms of wall time at every pacing check
        deadline_s=0.030,
    )
    offered = {fleet.node_name(n): {"Pods": [], "NumPDBViolations": 0} for n in range(100)}
    reply = await preempter.preempt({"Pod": pod, "NodeNameToMetaVictims": offered})
    assert len(reply.body["NodeNameToMetaVictims"]) == 100


async def test_a_preemptor_the_watch_has_not_shown_yet_is_read_from_the_api_server() -> None:
    # kube-scheduler calls /preempt at once for a pod short of CPU too, before any /filter: the
    # pod watch may not have delivered it yet
    store = Store()
    body = _preemptor()
    made = store.create("pods", {"metadata": {"name": "train"}, "spec": body["spec"]}, namespace="default")
    pod = {**body, "metadata": {**body["metadata"], "uid": made["metadata"]["uid"]}}
    state = ClusterState(Config(), clock=lambda: 1_000_000.0)
    fleet.feed(state, 2, 1_000_000.0)  # the preemptor is not in the state
    preempter = Preempter(
        config=Config(),
        state=state,
        events=EventRecorder(None, component="test"),  # type: ignore[arg-type]
        clock=lambda: 1_000_000.0,
        api=LocalKubeApi(store),
    )
    offered = {fleet.node_name(n): {"Pods": [], "NumPDBViolations": 0} for n in range(2)}
    reply = await preempter.preempt({"Pod": pod, "NodeNameToMetaVictims": offered})
    assert len(reply.body["NodeNameToMetaVictims"]) == 2, reply.body
    # another pod of that name (another UID) is not it
    stranger = {**pod, "metadata": {**pod["metadata"], "uid": "other-uid"}}
    reply = await preempter.preempt({"Pod": stranger, "NodeNameToMetaVictims": offered})
    assert reply.body["NodeNameToMetaVictims"] == {} and "not a known pod" in reply.body["Error"]
