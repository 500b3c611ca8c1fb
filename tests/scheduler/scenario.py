"""Scenario builder for scheduler tests: a LocalKubeApi cluster, a fake clock, a running extender."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
from collections.abc import Callable
from typing import Any

import aiohttp
from vgpu.core import annotations
from vgpu.core.config import Config, ViewsAuth
from vgpu.core.device import Gpu, GpuUuid
from vgpu.localcluster.client import LocalKubeApi
from vgpu.localcluster.store import Store
from vgpu_scheduler.app import SchedulerService

T0 = 1_800_000_000.0
EXTENDER_VERBS = ("filter", "bind", "preempt")  # served on the loopback extender listener


def open_views(config: Config) -> Config:
    """``config`` with ``scheduler.viewsAuth: none``, as the demo runs: the harnesses' clients read
    /metrics and /ui without a token (tests/scheduler/test_viewaccess.py tests the other mode)."""
    scheduler = dataclasses.replace(config.scheduler, views_auth=ViewsAuth.NONE)
    return dataclasses.replace(config, scheduler=scheduler)


class FakeClock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def wall(self) -> datetime.datetime:
        return datetime.datetime.fromtimestamp(self.now, datetime.UTC)


def gpus(
    node: str, n: int = 2, *, memory: int = 16000, count: int = 10, type: str = "NVIDIA-Tesla-T4"
) -> list[Gpu]:
    return [Gpu(GpuUuid(f"GPU-{node}-{i}"), i, count, memory, 100, type, numa=i % 2) for i in range(n)]


def gpu_container(
    name: str = "c", *, gpu: int = 1, mem: int | None = None, cores: int | None = None
) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": str(gpu)}
    if mem is not None:
        limits["nvidia.com/gpumem"] = str(mem)
    if cores is not None:
        limits["nvidia.com/gpucores"] = str(cores)
    return {"name": name, "image": "cuda", "resources": {"limits": limits}}


class Cluster:
    """A store, the API over it, and a scheduler service answering on 127.0.0.1:<port 0>."""

    def __init__(self, config: Config | None = None, *, api: Any = None, history_size: int = 10_000) -> None:
        self.config = config or Config()
        self.clock = FakeClock()
        self.store = Store(clock=self.clock.wall, history_size=history_size)
        self.api = api or LocalKubeApi(self.store, clock=self.clock.wall)
        self.service: SchedulerService | None = None
        self.url = ""
        self.extender_url = ""
        self.session: aiohttp.ClientSession | None = None

    # --- objects ---
    def add_node(
        self,
        name: str,
        node_gpus: list[Gpu] | None = None,
        *,
        lease: bool = True,
        register: str | None = None,
        extra: dict[str, str] | None = None,
    ) -> None:
        ann = {
            "hami.io/node-nvidia-register": register
            if register is not None
            else annotations.encode_node_register(node_gpus or gpus(name))
        }
        ann.update(extra or {})
        self.store.create("nodes", {"metadata": {"name": name, "annotations": ann}})
        if lease:
            self.renew_lease(name)

    def renew_lease(self, node: str) -> None:
        name = f"vgpu-device-plugin-{node}"
        ns = self.config.scheduler.lease_namespace
        stamp = self.clock.wall().strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        body = {
            "metadata": {"name": name},
            "spec": {"holderIdentity": node, "renewTime": stamp, "leaseDurationSeconds": 40},
        }
        try:
            current = self.store.get("leases", name, namespace=ns)
        except Exception:
            self.store.create("leases", body, namespace=ns)
            return
        self.store.patch("leases", name, {"spec": {"renewTime": stamp}}, patch_type="merge", namespace=ns)
        del current

    def add_pod(
        self,
        name: str,
        *containers: dict[str, Any],
        ns: str = "default",
        annotations: dict[str, str] | None = None,
        init: list[dict[str, Any]] | None = None,
    ) -> dict[str, Any]:
        spec: dict[str, Any] = {"schedulerName": "vgpu-scheduler", "containers": list(containers)}
        if init:
            spec["initContainers"] = init
        return self.store.create(
            "pods", {"metadata": {"name": name, "annotations": annotations or {}}, "spec": spec}, namespace=ns
        )

    def pod(self, name: str, ns: str = "default") -> dict[str, Any]:
        return self.store.get("pods", name, namespace=ns)

    def node(self, name: str) -> dict[str, Any]:
        return self.store.get("nodes", name)

    # --- the service ---
    async def start(self, *, wait_ready: bool = True, **service_options: Any) -> None:
        """Start the service (and wait until it has synced, unless ``wait_ready`` is false);
        ``service_options`` go to ``SchedulerService`` as they are."""
        self.service = SchedulerService(
            open_views(self.config), self.api, clock=self.clock, wall_clock=self.clock.wall, **service_options
        )
        address = await self.service.start(host="127.0.0.1", port=0)
        self.url = f"http://{address}"  # the Service port: webhook, probes, metrics
        self.extender_url = f"http://{self.service.extender_address}"  # loopback: filter, bind
        self.session = aiohttp.ClientSession()
        if wait_ready:
            await self.service.wait_ready()

    async def stop(self) -> None:
        if self.session is not None:
            await self.session.close()
            self.session = None
        if self.service is not None:
            await self.service.stop()
            self.service = None

    @property
    def state(self):
        assert self.service is not None
        return self.service.state

    async def until(self, predicate: Callable[[], bool], *, timeout_s: float = 5.0) -> None:
        """Yield to the loop until ``predicate`` holds (watch events are delivered by the loop)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not predicate():
            if loop.time() > deadline:
                raise AssertionError("condition not reached in time")
            await asyncio.sleep(0.001)

    async def synced(self) -> None:
        """Until the service's informers have seen everything in the store."""
        assert self.service is not None
        rv = int(self.store.resource_version)
        infs = [i for i in self.service.informers if i.kind in ("nodes", "pods")]
        await self.until(lambda: all(int(i.resource_version or 0) >= rv for i in infs) or self._seen_all())

    def _seen_all(self) -> bool:
        assert self.service is not None
        for inf in self.service.informers:
            if inf.kind not in ("nodes", "pods"):
                continue
            for obj in self.store.list(inf.kind).items:
                meta = obj["metadata"]
                got = inf.get(meta.get("namespace"), meta["name"])
                if got is None or got["metadata"]["resourceVersion"] != meta["resourceVersion"]:
                    return False
            if len(inf) != len(self.store.list(inf.kind).items):
                return False
        return True

    async def post(self, verb: str, body: Any) -> tuple[int, Any]:
        assert self.session is not None
        data = body if isinstance(body, bytes | str) else None
        kwargs: dict[str, Any] = {"data": data} if data is not None else {"json": body}
        base = self.extender_url if verb in EXTENDER_VERBS else self.url
        async with self.session.post(f"{base}/{verb}", **kwargs) as resp:
            text = await resp.text()
            try:
                import json

                return resp.status, json.loads(text)
            except ValueError:
                return resp.status, text

    async def filter(
        self, pod_name: str, nodes: list[str] | None = None, ns: str = "default"
    ) -> dict[str, Any]:
        pod = self.pod(pod_name, ns)
        names = (
            nodes if nodes is not None else [n["metadata"]["name"] for n in self.store.list("nodes").items]
        )
        status, body = await self.post("filter", {"Pod": pod, "Nodes": None, "NodeNames": names})
        assert status == 200, body
        return body

    async def bind(self, pod_name: str, node: str, ns: str = "default") -> str:
        pod = self.pod(pod_name, ns)
        status, body = await self.post(
            "bind", {"PodName": pod_name, "PodNamespace": ns, "PodUID": pod["metadata"]["uid"], "Node": node}
        )
        assert status == 200, body
        return body["Error"]

    def decision(self, pod_name: str, ns: str = "default") -> str | None:
        """The devices the scheduler holds for the pod (its reservation or its charge), if any."""
        charge = self.state.decision(self.pod(pod_name, ns)["metadata"]["uid"])
        return None if charge is None else charge.devices_raw

    def plugin_allocates(self, pod: str, node: str, ns: str = "default") -> None:
        """What the device plugin does after Allocate: bind phase success, node lock deleted."""
        self.store.patch(
            "pods", pod, {"metadata": {"annotations": {annotations.KEYS.bind_phase: "success"}}}, namespace=ns
        )
        self.store.patch("nodes", node, {"metadata": {"annotations": {annotations.KEYS.node_lock: None}}})

    def events(self, reason: str) -> list[dict[str, Any]]:
        return [e for e in self.store.list("events").items if e.get("reason") == reason]
