"""GPU preemption against the real kube-apiserver and kube-scheduler (marked ``realk8s``; issue 50).

* **GPU-only shortfall, CPU to spare**: one 16,384 MiB GPU holds ``low`` slices of 4,000, 4,000
  and 6,000 MiB; a ``high`` pod asks for 8,000 MiB. Released kube-scheduler versions never call
  ``/preempt`` for it (their dry run drops the node); the scheduler's own path evicts. The cheapest
  set (``low-c`` alone) is blocked by a PodDisruptionBudget that allows no disruption, so the next
  one (``low-a`` and ``low-b``) goes, through the Eviction API: the budget selecting those two has
  its ``disruptionsAllowed`` used up by the API server, which a plain delete would not do. The
  high pod runs within 30 s; no GPU holds more than it has on any pod event.
* **CPU short too**: the node's CPU is taken by the ``low`` pods as well; kube-scheduler's dry run
  finds a CPU victim and calls ``/preempt``, which adds a GPU victim when that one frees too little,
  and the high pod runs through the verb (the victims deleted by kube-scheduler, which nominated
  it), the own path staying out.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import pathlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from vgpu.core import annotations as hami
from vgpu.kube import informer
from vgpu.kube.port import JsonObj
from vgpu.localcluster import description

from bench import realk8s
from tests.realk8s.stack import RealStack, real_stack

pytestmark = [pytest.mark.realk8s, pytest.mark.slow, pytest.mark.timeout(300)]

KEYS = hami.Keys("hami.io")
GPU_MIB = 16384
BINDS_WITHIN_S = 30.0


def _nodes(cpu: str) -> description.ClusterDescription:
    return description.load(
        {"nodes": [{"name": "node-a", "cpu": cpu, "gpus": [{"model": "Tesla T4", "memoryMib": GPU_MIB}]}]}
    )


def _pod(name: str, mib: int, cls: str, *, cpu: str | None = None, app: str | None = None) -> JsonObj:
    resources: dict[str, Any] = {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": str(mib)}}
    if cpu:
        resources["requests"] = {"cpu": cpu}
    return {
        "metadata": {"name": name, "labels": {"app": app} if app else {}},
        "spec": {
            "priorityClassName": cls,
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": "busybox", "resources": resources}],
        },
    }


@contextlib.asynccontextmanager
async def _pods(
    api: Any,
) -> AsyncIterator[tuple[dict[str, JsonObj], set[str], list[int], Callable[..., Any]]]:
    """The pods of ``default`` by name, the names deleted, the most MiB any GPU held at any event,
    and ``until(done)`` woken by each event."""
    seen: dict[str, JsonObj] = {}
    gone: set[str] = set()
    worst = [0]
    changed = asyncio.Event()

    def held() -> int:
        per_gpu: dict[str, int] = collections.defaultdict(int)
        for pod in seen.values():
            raw = (pod["metadata"].get("annotations") or {}).get(KEYS.devices_allocated)
            if (
                not raw
                or not pod["spec"].get("nodeName")
                or (pod.get("status") or {}).get("phase")
                in (
                    "Succeeded",
                    "Failed",
                )
            ):
                continue
            for container in hami.decode_pod_devices(raw):
                for device in container:
                    per_gpu[device.uuid] += device.memory_mib
        return max(per_gpu.values(), default=0)

    def on_event(change: informer.Change) -> None:
        name = change.object["metadata"]["name"]
        if change.type == "DELETED":
            seen.pop(name, None)
            gone.add(name)
        else:
            seen[name] = change.object
        worst[0] = max(worst[0], held())
        changed.set()

    async def until(done: Callable[[], bool], timeout_s: float = 120.0) -> None:
        async with asyncio.timeout(timeout_s):
            while not done():
                changed.clear()
                await changed.wait()

    task = asyncio.create_task(informer.Informer(api, "pods", namespace="default", on_event=on_event).run())
    try:
        yield seen, gone, worst, until
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def _running(seen: dict[str, JsonObj], name: str) -> bool:
    return (seen.get(name, {}).get("status") or {}).get("phase") == "Running"


async def _classes(stack: RealStack) -> None:
    for name, value in (("low", 100), ("high", 1000)):
        await stack.api.create("priorityclasses", {"metadata": {"name": name}, "value": value})


async def _policy(stack: RealStack) -> str:
    """The PodDisruptionBudget API the server has: policy/v1 from v1.21, policy/v1beta1 before."""
    groups = await stack.api.request("GET", "/apis/policy")
    served = {v["groupVersion"] for v in groups.get("versions", [])}
    return "policy/v1" if "policy/v1" in served else "policy/v1beta1"


async def _budget(stack: RealStack, name: str, app: str, allowed: int) -> None:
    """A budget whose status says ``allowed`` (no controller-manager runs here to compute it)."""
    base = f"/apis/{await _policy(stack)}/namespaces/default/poddisruptionbudgets"
    body = {
        "metadata": {"name": name},
        "spec": {"selector": {"matchLabels": {"app": app}}, "maxUnavailable": 0},
    }
    made = await stack.api.request("POST", base, body=body)
    status = {
        "observedGeneration": made["metadata"].get("generation", 1),
        "disruptionsAllowed": allowed,
        "currentHealthy": 2,
        "desiredHealthy": 2,
        "expectedPods": 2,
    }
    await stack.api.request(
        "PATCH",
        f"{base}/{name}/status",
        body={"status": status},
        content_type="application/merge-patch+json",
    )


async def _events(stack: RealStack, reason: str) -> list[JsonObj]:
    listed = await stack.api.list("events", namespace="default")
    return [e for e in listed.items if e.get("reason") == reason]


async def test_a_gpu_only_shortfall_is_preempted_by_the_scheduler_through_eviction(
    k8s_bin: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    async with real_stack(k8s_bin, tmp_path, nodes=_nodes("32")) as stack:
        api = stack.api
        await _classes(stack)
        await _budget(stack, "pair", "ab", 2)
        await _budget(stack, "single", "c", 0)
        async with _pods(api) as (seen, gone, worst, until):
            for name, mib, app in (("low-a", 4000, "ab"), ("low-b", 4000, "ab"), ("low-c", 6000, "c")):
                await api.create("pods", _pod(name, mib, "low", app=app), namespace="default")
            await until(lambda: all(_running(seen, n) for n in ("low-a", "low-b", "low-c")))
            await api.create("pods", _pod("high", 8000, "high"), namespace="default")
            await until(lambda: _running(seen, "high"), BINDS_WITHIN_S)
            assert seen["high"]["spec"]["nodeName"] == "node-a"
            await until(lambda: {"low-a", "low-b"} <= gone)
            assert _running(seen, "low-c")  # the cheapest set, blocked by its budget, was left
            assert 0 < worst[0] <= GPU_MIB  # never overcommitted, on any pod event
        pair = await api.request(
            "GET", f"/apis/{await _policy(stack)}/namespaces/default/poddisruptionbudgets/pair"
        )
        assert pair["status"]["disruptionsAllowed"] == 0  # used up by the API server's Eviction
        assert sorted(pair["status"].get("disruptedPods") or {}) == ["low-a", "low-b"]
        (preempting,) = await _events(stack, "Preempting")
        assert preempting["involvedObject"]["name"] == "high"
        assert "default/low-a, default/low-b" in preempting["message"]


async def test_with_cpu_short_too_kube_scheduler_calls_the_verb(
    k8s_bin: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    minor = await realk8s.kube_scheduler_minor(k8s_bin)
    if minor is not None and minor < 22:
        pytest.skip(f"kube-scheduler v1.{minor} never calls the preempt verb (kubernetes #102971)")
    async with real_stack(k8s_bin, tmp_path, nodes=_nodes("3")) as stack:
        api = stack.api
        await _classes(stack)
        async with _pods(api) as (seen, gone, worst, until):
            for name, mib in (("low-a", 4000), ("low-b", 4000), ("low-c", 6000)):
                await api.create("pods", _pod(name, mib, "low", cpu="1"), namespace="default")
            await until(lambda: all(_running(seen, n) for n in ("low-a", "low-b", "low-c")))
            await api.create("pods", _pod("high", 8000, "high", cpu="1"), namespace="default")
            await until(lambda: _running(seen, "high"), BINDS_WITHIN_S)
            assert 0 < worst[0] <= GPU_MIB
            preempted = await _events(stack, "Preempted")
            # kube-scheduler deleted them (its own event) after our /preempt named them (ours, on
            # the nomination): the verb, not the own path. Its CPU victim depends on its reprieve
            # order; ours are added only when that one frees too little GPU memory
            by_kube_scheduler = {
                e["involvedObject"]["name"] for e in preempted if "to free GPU" not in e["message"]
            }
            by_verb = {e["involvedObject"]["name"] for e in preempted if "to free GPU" in e["message"]}
            assert by_kube_scheduler == by_verb and by_verb, preempted
            await until(lambda: by_verb <= gone)
            assert by_verb in ({"low-c"}, {"low-a", "low-b"})
            assert all(_running(seen, n) for n in {"low-a", "low-b", "low-c"} - by_verb)
        assert await _events(stack, "Preempting") == []  # the own path stayed out
