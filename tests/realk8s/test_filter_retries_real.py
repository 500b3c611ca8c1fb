"""Filter retries against the real kube-scheduler (marked ``realk8s``): a GPU pod that kube-scheduler
parked while the node's only GPU was cordoned runs within seconds of the cordon being lifted.

Lifting a cordon changes one annotation of the Node, and kube-scheduler moves its unschedulable pods
only for node changes it schedules by (v1.20: ``nodeSchedulingPropertiesChange``: unschedulable,
allocatable, labels, taints, conditions), so without the scheduler's nudge the pod would wait for
kube-scheduler's periodic retry (v1.20: unschedulable for 60 s, checked every 30 s)."""

from __future__ import annotations

import asyncio
import datetime
import pathlib
from collections.abc import Awaitable, Callable

import pytest
from vgpu.core import annotations as hami
from vgpu.core.device import Gpu
from vgpu.demo.stack import until_dashboard
from vgpu.kube.port import JsonObj
from vgpu.localcluster import description
from vgpu_scheduler import retries

from tests.realk8s.stack import RealStack, real_stack
from tests.realk8s.test_end_to_end_real import _pod, _scheduled_false, _watching

pytestmark = [pytest.mark.realk8s, pytest.mark.slow, pytest.mark.timeout(300)]

KEYS = hami.Keys("hami.io")
NODES = description.load({"nodes": [{"name": "node-a", "gpus": [{"model": "Tesla T4", "memoryMib": 16384}]}]})
RETRIED_WITHIN_S = 20.0  # well below the 60 s kube-scheduler v1.20 parks an unschedulable pod


def _cordoned(frame: JsonObj, uuid: str) -> bool:
    return any(g["uuid"] == uuid and g["cordoned"] for n in frame["nodes"] for g in n["gpus"])


async def _cordon_the_gpu(
    stack: RealStack, nodes: dict[str, JsonObj], until_nodes: Callable[[Callable[[], bool]], Awaitable[None]]
) -> Gpu:
    """Cordon node-a's only GPU once its device plugin has registered it; returns once the
    scheduler's node cache (its watch) has it cordoned, so a pod created next fails its filter."""
    await until_nodes(
        lambda: (
            KEYS.node_register in ((nodes.get("node-a") or {}).get("metadata") or {}).get("annotations", {})
        )
    )
    (gpu,) = hami.decode_node_register(nodes["node-a"]["metadata"]["annotations"][KEYS.node_register])
    await stack.api.merge_patch(
        "nodes", "node-a", {"metadata": {"annotations": {KEYS.device_cordon: gpu.uuid}}}
    )
    await asyncio.wait_for(
        until_dashboard(stack.scheduler_url, stack.ca_file, lambda f: _cordoned(f, gpu.uuid)), 30
    )
    return gpu


async def _runs_soon(
    pods: dict[str, JsonObj], until_pods: Callable[[Callable[[], bool]], Awaitable[None]], name: str
) -> JsonObj:
    """Pod ``name`` runs within ``RETRIED_WITHIN_S``, on node-a, nudged by the scheduler (not
    retried by kube-scheduler's periodic flush, which would take 60 s at least)."""
    await asyncio.wait_for(
        until_pods(lambda: (pods[name].get("status") or {}).get("phase") == "Running"), RETRIED_WITHIN_S
    )
    pod = pods[name]
    assert pod["spec"]["nodeName"] == "node-a"
    assert retries.RETRY_ANNOTATION in pod["metadata"]["annotations"]
    return pod


async def test_a_pod_parked_while_its_gpu_was_cordoned_runs_once_the_cordon_is_lifted(
    k8s_bin: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    async with real_stack(k8s_bin, tmp_path, nodes=NODES) as stack:
        api = stack.api
        async with (
            _watching(api, "nodes") as (nodes, until_nodes),
            _watching(api, "pods", namespace="default") as (pods, until_pods),
            _watching(api, "events", namespace="default") as (events, until_events),
        ):
            await _cordon_the_gpu(stack, nodes, until_nodes)
            await api.create("pods", _pod("waiting", {"nvidia.com/gpu": "1"}), namespace="default")
            await until_pods(lambda: _scheduled_false(pods.get("waiting") or {}) is not None)

            def filter_failures() -> list[str]:
                return [
                    str(e.get("message"))
                    for e in events.values()
                    if e.get("reason") == "FilteringFailed" and e["involvedObject"]["name"] == "waiting"
                ]

            await until_events(lambda: bool(filter_failures()))  # our Event, sent in the background
            assert all("cordoned" in m for m in filter_failures()), filter_failures()

            uncordon = {"metadata": {"annotations": {KEYS.device_cordon: None}}}
            await api.merge_patch("nodes", "node-a", uncordon)
            await _runs_soon(pods, until_pods, "waiting")


async def test_a_pod_whose_filter_was_refused_while_the_scheduler_was_down_runs_once_it_is_back(
    k8s_bin: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    """kube-scheduler v1.20 parks a pod whose extender call failed with the unschedulable ones (60 s
    at least), and the scheduler's return is no event it moves them for: the restarted scheduler's
    sweep asks for the retry (docs/scheduler.md, "Filter retries", "After a start")."""
    async with real_stack(k8s_bin, tmp_path, nodes=NODES) as stack:
        api = stack.api
        async with (
            _watching(api, "nodes") as (nodes, until_nodes),
            _watching(api, "pods", namespace="default") as (pods, until_pods),
        ):
            # the pod waits (its GPU cordoned) while the scheduler is up: the webhook admits it
            await _cordon_the_gpu(stack, nodes, until_nodes)
            await api.create("pods", _pod("orphan", {"nvidia.com/gpu": "1"}), namespace="default")
            await until_pods(lambda: _scheduled_false(pods.get("orphan") or {}) is not None)
            await stack.scheduler.kill()
            # kube-scheduler tries it again (an update of the pod) and cannot reach the extender
            await api.merge_patch(
                "pods", "orphan", {"metadata": {"annotations": {"touch": "1"}}}, namespace="default"
            )
            await until_pods(lambda: "connection refused" in str(_scheduled_false(pods["orphan"])))
            await api.merge_patch(
                "nodes", "node-a", {"metadata": {"annotations": {KEYS.device_cordon: None}}}
            )
            await stack.scheduler.restart()
            await _runs_soon(pods, until_pods, "orphan")


async def test_a_pod_whose_bind_failed_runs_once_the_cause_is_gone(
    k8s_bin: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    """kube-scheduler v1.20 puts a pod whose extender bind failed among the unschedulable ones
    unless a cluster event came during its cycle (later versions, by their code, back it off
    instead). Its first failure writes the pod's ``PodScheduled`` condition, and that write (its
    managedFields) counts as an update of the pod, so it is retried at once; a second failure with
    the same message writes nothing, and the pod stays parked (60 s at least): a node lock released
    is no event it moves pods for. The scheduler asks for the retry itself (docs/scheduler.md,
    "Filter retries", "After a failed bind")."""
    config = {"scheduler": {"bindLockWaitS": 2}}  # the default `always` lock mode
    async with real_stack(k8s_bin, tmp_path, nodes=NODES, config_raw=config) as stack:
        api = stack.api
        async with (
            _watching(api, "nodes") as (nodes, until_nodes),
            _watching(api, "pods", namespace="default") as (pods, until_pods),
            _watching(api, "events", namespace="default") as (events, until_events),
        ):
            await until_nodes(
                lambda: (
                    KEYS.node_register
                    in (nodes.get("node-a") or {}).get("metadata", {}).get("annotations", {})
                )
            )
            # node-a's lock, held by a pod that is not going anywhere: nothing schedules it
            holder = _pod("holder", {})
            holder["spec"]["schedulerName"] = "nobody"
            await api.create("pods", holder, namespace="default")
            lock = hami.encode_node_lock(
                hami.NodeLock(datetime.datetime.now(datetime.UTC), "default", "holder")
            )
            await api.merge_patch("nodes", "node-a", {"metadata": {"annotations": {KEYS.node_lock: lock}}})
            await api.create("pods", _pod("blocked", {"nvidia.com/gpu": "1"}), namespace="default")

            def bind_failures() -> int:  # each bind waits 2 s for the lock and fails
                return sum(
                    int(e.get("count") or 1)
                    for e in events.values()
                    if e.get("reason") == "BindingFailed" and e["involvedObject"]["name"] == "blocked"
                )

            await until_events(lambda: bind_failures() >= 2)
            # v1.20 says "binding rejected: ...", later versions give the extender's error alone
            assert "is locked by default/holder" in str(_scheduled_false(pods["blocked"]))
            await api.merge_patch("nodes", "node-a", {"metadata": {"annotations": {KEYS.node_lock: None}}})
            await _runs_soon(pods, until_pods, "blocked")
