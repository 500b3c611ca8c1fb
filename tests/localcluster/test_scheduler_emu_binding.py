"""The kube-scheduler emulation's binding cycle: concurrent with the next pod's scheduling cycle,
assumed before it starts, forgotten and backed off when it fails, cancelled cleanly at stop."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from typing import Any

import pytest
from vgpu.localcluster import schedqueue

from tests.localcluster.extenders import bound, config

GPU = {"example.com/gpu": 1}


async def wait_message(env: Any, name: str, message: str) -> None:
    """Until an Event about ``name`` says ``message`` (several events may exist; watch, never poll)."""
    async with asyncio.timeout(10):
        listed = await env.api.list("events", namespace="default")
        if any(e["involvedObject"]["name"] == name and e["message"] == message for e in listed.items):
            return
        async for event in env.api.watch(
            "events", resource_version=listed.resource_version, namespace="default"
        ):
            if event.object["involvedObject"]["name"] == name and event.object["message"] == message:
                return


def counted_config(url: str) -> dict[str, Any]:
    """An extender that binds, managing example.com/gpu without hiding it from NodeResourcesFit."""
    cfg = config(url, bindVerb="bind")
    cfg["extenders"][0]["managedResources"] = [{"name": "example.com/gpu", "ignoredByScheduler": False}]
    return cfg


async def test_a_slow_bind_does_not_hold_the_next_pods_scheduling_cycle(env, ext, start_scheduler):
    await env.add_node("n1", allocatable={"example.com/gpu": "4"})
    release = asyncio.Event()
    slow_started = asyncio.Event()

    async def bind(args: dict[str, Any]) -> Any:
        if args["PodName"] == "slow":
            slow_started.set()
            await release.wait()
        return await ext.bind_for_real(args)

    ext.bind_reply = bind
    sched = start_scheduler(counted_config(ext.url))
    await env.add_pod("slow", limits=GPU)
    await asyncio.wait_for(slow_started.wait(), 10)
    assert sched.binding == 1
    await env.add_pod("fast", limits=GPU)
    fast = await env.wait_for("pods", "fast", bound)  # scheduled and bound while "slow" still binds
    assert fast["spec"]["nodeName"] == "n1"
    assert not (await env.get_pod("slow"))["spec"].get("nodeName")
    release.set()
    assert (await env.wait_for("pods", "slow", bound))["spec"]["nodeName"] == "n1"


async def test_a_failed_bind_forgets_the_assumed_pod_and_backs_off(env, ext, start_scheduler):
    await env.add_node("n1", allocatable={"example.com/gpu": "1"})
    release = asyncio.Event()
    first_started = asyncio.Event()

    async def bind(args: dict[str, Any]) -> Any:
        if args["PodName"] == "first" and not first_started.is_set():
            first_started.set()
            await release.wait()
            return {"Error": "node lock held"}
        return await ext.bind_for_real(args)

    ext.bind_reply = bind
    sched = start_scheduler(counted_config(ext.url))
    await env.add_pod("first", limits=GPU)
    await asyncio.wait_for(first_started.wait(), 10)
    # "first" is assumed on n1: it holds the only example.com/gpu, so "second" does not fit
    await env.add_pod("second", limits=GPU)
    event = await env.wait_event("second", reason="FailedScheduling")
    assert event["message"] == "0/1 nodes are available: 1 Insufficient example.com/gpu."
    assert sched.queue.where(("default", "second")) is schedqueue.Where.UNSCHEDULABLE
    release.set()  # the bind fails: "first" is forgotten, which frees the GPU and moves "second"
    second = await env.wait_for("pods", "second", bound)
    assert second["spec"]["nodeName"] == "n1"
    await wait_message(env, "first", "binding rejected: node lock held")
    assert sched.queue.attempts(("default", "first")) >= 1  # back in the queue, not lost
    assert not (await env.get_pod("first"))["spec"].get("nodeName")


async def test_stop_cancels_binds_in_flight(env, ext, start_scheduler):
    await env.add_node("n1", allocatable={"example.com/gpu": "1"})
    started = asyncio.Event()

    async def bind(args: dict[str, Any]) -> Any:
        started.set()
        await ext.hang.wait()  # never answers

    ext.bind_reply = bind
    sched = start_scheduler(counted_config(ext.url))
    await env.add_pod("p1", limits=GPU)
    await asyncio.wait_for(started.wait(), 10)
    assert sched.binding == 1
    await asyncio.wait_for(sched.stop(), 10)
    assert sched.binding == 0  # the autouse leak check also sees no task left


@pytest.mark.parametrize("nodes", [150])
async def test_successive_pods_see_different_nodes_first(env, ext, start_scheduler, nodes):
    """Above 100 nodes only numFeasibleNodesToFind nodes go to the extender, from a rotating start."""
    for i in range(nodes):
        await env.add_node(f"n{i:03d}")
    start_scheduler(config(ext.url))
    for name in ("a", "b"):
        await env.add_pod(name, limits={"nvidia.com/gpu": 1})
        await env.wait_for("pods", name, bound)
    first, second = (c["NodeNames"] for c in ext.filter_calls)
    assert len(first) == len(second) == 100  # max(100, 150 * (50 - 150 // 125) %) = 100
    assert first[0] == "n000" and second[0] == "n100"  # the start index moved by the 100 looked at


async def test_a_bound_pods_log_line_says_where_its_scheduling_time_went(env, ext, start_scheduler, caplog):
    """Its wait in the active queue, its scheduling cycle and its binding cycle, which here lasts at
    least as long as the extender held the bind: until the next pod reached its own bind
    (bench/throughput_bench.py reads these lines)."""
    caplog.set_level(logging.INFO, logger="vgpu.localcluster.scheduler")
    await env.add_node("n1", allocatable={"example.com/gpu": "4"})
    held = asyncio.Event()
    release = asyncio.Event()
    released_at: list[float] = []

    async def bind(args: dict[str, Any]) -> Any:
        if args["PodName"] == "p":
            held.set()
            await release.wait()
        else:
            released_at.append(time.perf_counter())
            release.set()
        return await ext.bind_for_real(args)

    ext.bind_reply = bind
    start_scheduler(counted_config(ext.url))
    await env.add_pod("p", limits=GPU)
    await asyncio.wait_for(held.wait(), 10)
    held_from = time.perf_counter()
    await env.add_pod("q", limits=GPU)
    await wait_message(env, "p", "Successfully assigned default/p to n1")  # logged just before it
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("scheduled pod default/p ")]
    assert len(lines) == 1
    got = re.fullmatch(
        r"scheduled pod default/p to node n1 \(queued ([\d.]+) ms, cycle ([\d.]+) ms, binding ([\d.]+) ms\)",
        lines[0],
    )
    assert got is not None, lines[0]
    queued, cycle, binding = (float(x) for x in got.groups())
    assert queued >= 0 and cycle > 0
    assert binding >= (released_at[0] - held_from) * 1000 > 0
