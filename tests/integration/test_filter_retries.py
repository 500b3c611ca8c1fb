"""A pending GPU pod is retried as soon as a GPU it fits comes back (docs/scheduler.md, "Filter
retries"), against the real processes of the demo stack.

The node's one GPU is cordoned (``hami.io/device-cordon``), so a GPU pod fails ``/filter`` and the
emulated kube-scheduler parks it with its unschedulable pods. Lifting the cordon changes an
annotation only, which is no reason for kube-scheduler to retry anything (it moves its
unschedulable pods for node changes it schedules by: labels, taints, allocatable, conditions), so
without the scheduler's nudge the pod would wait for the periodic retry of unschedulable pods (5
minutes in the emulation, kube-scheduler's ``podMaxInUnschedulablePodsDuration``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from vgpu.core import annotations
from vgpu.demo.stack import Stack
from vgpu.kube.port import JsonObj
from vgpu.localcluster import schedqueue
from vgpu_scheduler import retries

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

DESCRIPTION = {"nodes": [{"name": "node-a", "gpus": [{"name": "Tesla T4", "memoryMib": 15360}]}]}
RETRIED_WITHIN_S = 15.0  # far below the 300 s the emulated kube-scheduler parks an unschedulable pod


@pytest.fixture
async def stack() -> AsyncIterator[Stack]:
    async with Stack(DESCRIPTION, scheduler_backoff_s=(0.2, 1.0)) as s:
        yield s


def _pod(stack: Stack, name: str = "waiting") -> JsonObj:
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4000"}
    return {
        "metadata": {"name": name},
        "spec": {
            "schedulerName": stack.config.scheduler.scheduler_name,
            "containers": [{"name": "c", "image": "cuda", "resources": {"limits": limits}}],
        },
    }


def _unschedulable(pod: JsonObj) -> bool:
    return any(
        c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable"
        for c in (pod.get("status") or {}).get("conditions") or ()
    )


def _cordoned(frame: JsonObj, uuid: str) -> bool:
    return any(g["uuid"] == uuid and g["cordoned"] for n in frame["nodes"] for g in n["gpus"])


async def test_a_pod_parked_while_its_gpu_was_cordoned_runs_once_the_cordon_is_lifted(stack: Stack) -> None:
    store = stack.cluster.store
    node = store.get("nodes", "node-a")
    (gpu,) = annotations.decode_node_register(node["metadata"]["annotations"][stack.keys.node_register])
    cordon = {"metadata": {"annotations": {stack.keys.device_cordon: gpu.uuid}}}
    store.patch("nodes", "node-a", cordon, patch_type="merge")
    # the scheduler's node cache follows its watch: the pod must come after the cordon reached it
    await stack.until_dashboard(lambda frame: _cordoned(frame, gpu.uuid), "the GPU cordoned")
    await stack.api.create("pods", _pod(stack), namespace="default")

    def get() -> JsonObj:
        return store.get("pods", "waiting", namespace="default")

    await stack.until(lambda: _unschedulable(get()), "kube-scheduler to find the pod unschedulable")

    def failed() -> list[str]:
        return [
            str(e.get("message"))
            for e in store.list("events").items
            if e.get("reason") == "FilteringFailed" and e["involvedObject"]["name"] == "waiting"
        ]

    await stack.until(lambda: bool(failed()), "the scheduler's Event (sent in the background)")
    assert all("cordoned" in m for m in failed()), failed()

    store.patch(
        "nodes", "node-a", {"metadata": {"annotations": {stack.keys.device_cordon: None}}}, patch_type="merge"
    )
    await stack.until(
        lambda: (get().get("status") or {}).get("phase") == "Running",
        "the pod to run once its GPU is back",
        timeout_s=RETRIED_WITHIN_S,
    )
    pod = get()
    assert pod["spec"]["nodeName"] == "node-a"
    assert retries.RETRY_ANNOTATION in pod["metadata"]["annotations"]  # the nudge, not a periodic retry


async def test_a_pod_parked_while_the_scheduler_was_down_runs_once_it_is_back(stack: Stack) -> None:
    """kube-scheduler's ``/filter`` calls fail while the vgpu-scheduler is away (a crash, a rolling
    update): the pod is parked among the unschedulable ones (v1.20 at once; the emulation after five
    errors), and nothing kube-scheduler schedules by changes when the scheduler comes back. The
    restarted scheduler's sweep asks for the retry."""
    store = stack.cluster.store
    await stack.kill("vgpu-scheduler")
    await stack.api.create("pods", _pod(stack, "orphan"), namespace="default")
    assert stack.cluster.scheduler is not None
    queue = stack.cluster.scheduler.queue
    await stack.until(
        lambda: queue.where(("default", "orphan")) is schedqueue.Where.UNSCHEDULABLE,
        "kube-scheduler to park the pod after its failed filters",
    )
    conditions = store.get("pods", "orphan", namespace="default")["status"]["conditions"]
    assert {"type": "PodScheduled", "status": "False", "reason": "SchedulerError"}.items() <= conditions[
        0
    ].items()
    await stack.restart("vgpu-scheduler")
    await stack.until(
        lambda: (
            (store.get("pods", "orphan", namespace="default").get("status") or {}).get("phase") == "Running"
        ),
        "the pod to run once the scheduler is back",
        timeout_s=RETRIED_WITHIN_S,
    )
    assert (
        retries.RETRY_ANNOTATION
        in store.get("pods", "orphan", namespace="default")["metadata"]["annotations"]
    )
