"""The DRA phase of the throughput bench against a real control plane (``throughput_bench --dra``).

A DRA GPU pod asks for one GPU share as the webhook's DRA conversion writes it: a pod-level
``resourceClaims`` entry ``vgpu-0`` from a ResourceClaimTemplate of one request ``gpu`` (our
DeviceClass, exactly one device, ``capacity.requests: {memory: <MiB>Mi}``), and the container's
``resources.claims``; no extended resources, so kube-scheduler never calls the extender for it.
Its way to bound, all of it upstream code:

* **kube-controller-manager** (only its ``resourceclaim-controller``, client unthrottled as the
  bench runs kube-scheduler) creates the pod's ResourceClaim from the template and writes the pod's
  ``status.resourceClaimStatuses``; kube-scheduler keeps the pod out of its queue until then;
* **kube-scheduler's DynamicResources plugin** allocates a device with enough memory left
  (consumable capacity, KEP-5075) in its serial cycle and writes the claim's status (allocation
  and ``reservedFor``) in PreBind, then the Binding.

Every node has a ResourceSlice of its GPUs as the device plugin publishes it in the DRA mode
(``vgpu.core.dra.slices``), the DeviceClass is the chart's, and the pods are the extender phases'
GPU pods converted by the webhook's own code (``vgpu.core.dra.convert``). ``ClaimTracker`` follows every
ResourceClaim from a watch: when each pod's claim first appeared and when it was first seen
allocated, which split a pod's create → bound into the controller's part, the scheduler's part
(queue, cycle, claim status write) and the Binding; and, at every change, that no GPU's consumed
memory or cores exceed its capacity.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import json
import pathlib
import ssl
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from typing import Any

import aiohttp
from vgpu.core import config as configs
from vgpu.core import device, jsonpatch, request
from vgpu.core.dra import allocation, convert, deviceclass, slices
from vgpu.kube import aioapi

from bench import percentile, realk8s

API = "/apis/resource.k8s.io/v1"
NAMESPACE = "default"
CONTROLLER_QPS = 5000  # as the bench's kube-scheduler: the client's default 20/s would be the limit


def node_slice(node: str, *, gpus: int, memory_mib: int) -> dict[str, Any]:
    """The node's ResourceSlice as the device plugin publishes it in the DRA mode (``slices.build``
    of the bench's fake GPUs)."""
    inventory = device.NodeInventory(
        node=device.NodeName(node),
        gpus=tuple(
            device.Gpu(
                uuid=device.GpuUuid(f"GPU-{node}-{i}"),
                index=i,
                count=10,
                memory_mib=memory_mib,
                cores=100,
                type="NVIDIA-A100-SXM4-40GB",
            )
            for i in range(gpus)
        ),
    )
    return slices.build(inventory, driver_version="550.54.15").body


def dra_pod(
    name: str, *, gpu_pod: dict[str, Any], config: configs.Config
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``gpu_pod`` (a GPU pod as a user writes it) as the webhook admits it in the DRA mode
    (``convert.convert``, the webhook's own conversion), and the ResourceClaimTemplates it names."""
    pod = copy.deepcopy(gpu_pod)
    pod["metadata"]["name"] = name
    pod["spec"].pop("schedulerName", None)
    parsed = request.parse_pod(pod, config, default_count=True)
    conversion = convert.convert(
        pod, parsed, namespace=NAMESPACE, resources=config.resources, memory_sizes_mib=()
    )
    converted: dict[str, Any] = jsonpatch.apply(pod, [dict(op) for op in conversion.patch])
    converted["spec"]["schedulerName"] = "default-scheduler"  # kube-scheduler's DRA plugin places it
    return converted, list(conversion.templates)


async def publish(
    api: aioapi.AioKubeApi,
    nodes: Iterable[str],
    *,
    gpus: int,
    memory_mib: int,
    templates: Iterable[dict[str, Any]],
    parallel: int = 64,
) -> None:
    """The chart's DeviceClass, every node's ResourceSlice and the phase's templates (which the
    scheduler service creates on first use)."""
    await api.request("POST", f"{API}/deviceclasses", body=deviceclass.device_class())
    gate = asyncio.Semaphore(parallel)

    async def one(node: str) -> None:
        async with gate:
            body = node_slice(node, gpus=gpus, memory_mib=memory_mib)
            await api.request("POST", f"{API}/resourceslices", body=body)

    await asyncio.gather(*(one(n) for n in nodes))
    for template in templates:
        await api.request("POST", f"{API}/namespaces/{NAMESPACE}/resourceclaimtemplates", body=template)


@dataclasses.dataclass
class ClaimTracker:
    """Per pod (the claim's owner), when its claim was first seen and first seen allocated; and
    the GPUs' consumed capacity summed over every allocated claim, checked at each change."""

    capacity_mib: int
    seen: dict[str, float] = dataclasses.field(default_factory=dict)
    allocated: dict[str, float] = dataclasses.field(default_factory=dict)
    violations: list[str] = dataclasses.field(default_factory=list)
    checks: int = 0
    _claims: dict[str, list[allocation.DeviceShare]] = dataclasses.field(default_factory=dict)
    _memory: dict[tuple[str, str], int] = dataclasses.field(default_factory=dict)
    _cores: dict[tuple[str, str], int] = dataclasses.field(default_factory=dict)

    def on_event(self, kind: str, claim: Mapping[str, Any], now: float) -> None:
        meta = claim.get("metadata") or {}
        key = f"{meta.get('namespace')}/{meta.get('name')}"
        owners = [o.get("name") for o in meta.get("ownerReferences") or [] if o.get("kind") == "Pod"]
        pod = str(owners[0]) if owners else key
        if kind == "DELETED":
            self._set(key, [])
            return
        self.seen.setdefault(pod, now)
        try:
            shares = allocation.shares(claim)
        except allocation.AllocationError as exc:
            self.violations.append(f"{key}: unreadable allocation: {exc}")
            return
        if shares:
            self.allocated.setdefault(pod, now)
        self._set(key, shares)

    def _set(self, key: str, shares: list[allocation.DeviceShare]) -> None:
        for old in self._claims.pop(key, []):
            at = (old.pool, old.device)
            self._memory[at] -= old.memory_mib or 0
            self._cores[at] -= old.cores_percent or 0
        if not shares:
            return
        self._claims[key] = shares
        for share in shares:
            at = (share.pool, share.device)
            self.checks += 1
            self._memory[at] = self._memory.get(at, 0) + (share.memory_mib or 0)
            self._cores[at] = self._cores.get(at, 0) + (share.cores_percent or 0)
            if self._memory[at] > self.capacity_mib or self._cores[at] > 100:
                self.violations.append(
                    f"{share.pool}/{share.device}: {self._memory[at]} MiB, {self._cores[at]} % after {key}"
                )


async def watch_claims(
    url: str, *, token: str, ca_file: pathlib.Path, on_event: Callable[[str, Mapping[str, Any], float], None]
) -> None:
    """Every ResourceClaim's changes to ``on_event`` (type, object, monotonic time seen) until
    cancelled: listed, then watched from the list's resourceVersion (a watch without one asks
    for a watch stream, which kube-apiserver refuses over etcd 3.4), opened again where it ends."""
    trust = ssl.create_default_context(cafile=str(ca_file))
    headers = {"Authorization": f"Bearer {token}"}
    version = ""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_connect=10)) as session:
        while True:
            with contextlib.suppress(aiohttp.ClientError, OSError, ValueError):
                if not version:
                    async with session.get(f"{url}{API}/resourceclaims", headers=headers, ssl=trust) as resp:
                        listed = await resp.json()
                    now = time.monotonic()
                    for item in listed.get("items") or []:
                        on_event("ADDED", item, now)
                    version = str((listed.get("metadata") or {}).get("resourceVersion") or "")
                query = {"watch": "true", "allowWatchBookmarks": "true", "resourceVersion": version}
                async with session.get(
                    f"{url}{API}/resourceclaims", params=query, headers=headers, ssl=trust
                ) as resp:
                    async for line in resp.content:
                        if not line.strip():
                            continue
                        event = json.loads(line)
                        obj = event.get("object") or {}
                        if event.get("type") == "ERROR":  # 410 Gone and the like: list again
                            version = ""
                            break
                        version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                        if event.get("type") in ("ADDED", "MODIFIED", "DELETED"):
                            on_event(event["type"], obj, time.monotonic())
            await asyncio.sleep(0.1)  # the watch ended (its timeout, an error): open it again


def dra_split(
    names_: Iterable[str],
    *,
    created: Mapping[str, float],
    bound: Mapping[str, float],
    claims: ClaimTracker,
) -> dict[str, tuple[float, float, int]]:
    """Per part of a DRA pod's way, (p50 s, p99 s, pods): ``claim created`` (create → its claim
    seen: kube-controller-manager), ``allocated`` (claim seen → seen allocated: kube-scheduler's
    queue, cycle and the claim status write), ``bound`` (allocated → bound: the Binding)."""
    parts: dict[str, list[float]] = {"claim created": [], "allocated": [], "bound": []}
    for name in names_:
        if name not in created or name not in claims.seen:
            continue
        parts["claim created"].append(claims.seen[name] - created[name])
        if name in claims.allocated:
            parts["allocated"].append(claims.allocated[name] - claims.seen[name])
            if name in bound:
                parts["bound"].append(bound[name] - claims.allocated[name])
    return {
        part: (percentile.pct(v, 0.50), percentile.pct(v, 0.99), len(v)) for part, v in parts.items() if v
    }


@contextlib.asynccontextmanager
async def kube_controller_manager(
    bin_dir: pathlib.Path, *, kubeconfig_path: pathlib.Path, log_path: pathlib.Path
) -> AsyncIterator[int]:
    """The real kube-controller-manager running only the resourceclaim controller; yields its pid."""
    proc = await realk8s.start_process(
        [
            realk8s.binary(bin_dir, "kube-controller-manager"),
            "--kubeconfig", str(kubeconfig_path),
            "--controllers", "resourceclaim-controller",
            "--kube-api-qps", str(CONTROLLER_QPS), "--kube-api-burst", str(CONTROLLER_QPS),
            "--leader-elect=false", "--bind-address", "127.0.0.1", "--secure-port", "0",
            "-v", "1",
        ],
        log_path,
    )  # fmt: skip
    try:
        yield proc.pid
    finally:
        await realk8s.stop_process(proc)
