"""The demo's preemption act: a ``high`` PriorityClass training pod evicts two ``low`` inference slices.

After the sample workload, on the GPU with the most free memory: two ``low`` (priority 100)
inference pods take half of its free memory each, then a ``high`` (priority 100000) training pod
asks for almost all of it. Only GPU memory is short (the node has CPU to spare), the case that
kube-scheduler as released (emulated v1.36) never calls ``/preempt`` for: its dry run drops the
node ("expected at least one victim pod"). The scheduler's own preemption path picks the two
slices (one alone frees too little), evicts them through the Eviction API with their grace
period, holds the GPU for the training pod, and the training pod runs on it. The act prints which
pods were evicted and the reasons recorded in their ``Preempted`` events and the training pod's
``Preempting`` event.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any, TextIO

from vgpu.core import annotations as hami
from vgpu.core import errors
from vgpu.demo.stack import Stack
from vgpu.kube.client import OfficialKubeApi

LOW, HIGH = 100, 100_000
LOW_PODS = ("low-infer-1", "low-infer-2")
HIGH_POD = "high-train"


def _pod(name: str, priority_class: str, gpu: str, memory_mib: int) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": str(memory_mib)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "annotations": {"nvidia.com/use-gpuuuid": gpu}},
        "spec": {
            "priorityClassName": priority_class,
            "terminationGracePeriodSeconds": 5,
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "main",
                    "image": "nvidia/cuda:12.4.1-base-ubuntu22.04",
                    "resources": {"limits": limits},
                }
            ],
        },
    }


def _roomiest_gpu(stack: Stack) -> tuple[str, str, int]:
    """(node, GPU UUID, free MiB) of the GPU with the most memory not handed out."""
    store, keys = stack.cluster.store, stack.keys
    used: dict[str, int] = {}
    for pod in store.list("pods").items:
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(keys.devices_allocated)
        for container in hami.decode_pod_devices(raw) if raw else ():
            for device in container:
                used[device.uuid] = used.get(device.uuid, 0) + device.memory_mib
    best = ("", "", -1)
    for node in store.list("nodes").items:
        raw = ((node.get("metadata") or {}).get("annotations") or {}).get(keys.node_register)
        for gpu in hami.decode_node_register(raw) if raw else ():
            free = gpu.memory_mib - used.get(gpu.uuid, 0)
            if free > best[2]:
                best = (node["metadata"]["name"], gpu.uuid, free)
    return best


async def _until(done: Callable[[], bool], *, timeout_s: float) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not done():
        if loop.time() > deadline:
            return False
        await asyncio.sleep(0.1)  # polling the in-process store for the demo's progress line
    return True


def _phase(stack: Stack, name: str) -> str:
    try:
        pod = stack.cluster.store.get("pods", name, namespace="default")
    except errors.NotFound:
        return "Deleted"
    return str((pod.get("status") or {}).get("phase") or "Pending")


async def run_act(stack: Stack, *, out: TextIO, timeout_s: float = 60.0) -> bool:
    """Run the act and print it; True when both slices were evicted and the training pod runs."""
    store = stack.cluster.store
    for name, value in (("low", LOW), ("high", HIGH)):
        store.create(
            "priorityclasses", {"metadata": {"name": name}, "value": value, "description": f"demo {name}"}
        )
    node, gpu, free = _roomiest_gpu(stack)
    slice_mib, train_mib = free // 2, free - 256
    w = out.write
    w(
        f"\nPreemption: {len(LOW_PODS)} 'low' inference slices of {slice_mib} MiB fill {gpu} on {node}, "
        f"then a 'high' training pod asks for {train_mib} MiB there\n"
    )
    api = OfficialKubeApi.from_kubeconfig(str(stack.kubeconfig_path))
    try:
        for name in LOW_PODS:
            await api.create("pods", _pod(name, "low", gpu, slice_mib), namespace="default")
        if not await _until(
            lambda: all(_phase(stack, n) == "Running" for n in LOW_PODS), timeout_s=timeout_s
        ):
            w(f"  the low slices did not start: {[_phase(stack, n) for n in LOW_PODS]}\n")
            return False
        await api.create("pods", _pod(HIGH_POD, "high", gpu, train_mib), namespace="default")
        done = await _until(
            lambda: (
                _phase(stack, HIGH_POD) == "Running" and all(_phase(stack, n) == "Deleted" for n in LOW_PODS)
            ),
            timeout_s=timeout_s,
        )
    finally:
        await api.close()
    w(f"  why: one slice frees {slice_mib} MiB, the training pod needs {train_mib}: both must go\n")
    for event in store.list("events").items:
        involved = event.get("involvedObject") or {}
        message = str(event.get("message", ""))
        if event.get("reason") == "Preempted" and involved.get("name") in LOW_PODS and "GPU" in message:
            w(f"  evicted {involved['name']:<12} {message}\n")
        if event.get("reason") == "Preempting" and involved.get("name") == HIGH_POD:
            w(f"  {HIGH_POD:<20} {message}\n")
    pod = store.get("pods", HIGH_POD, namespace="default")
    raw = (pod["metadata"].get("annotations") or {}).get(stack.keys.devices_allocated, "")
    devices = json.dumps([[d.uuid for d in c] for c in hami.decode_pod_devices(raw)]) if raw else "[]"
    w(f"  {HIGH_POD:<20} {_phase(stack, HIGH_POD)} → {pod['spec'].get('nodeName') or '-'} on {devices}\n")
    if not done:
        w(
            f"  not as expected: low slices {[_phase(stack, n) for n in LOW_PODS]}, {HIGH_POD} {_phase(stack, HIGH_POD)}\n"
        )
    return done
