"""The whole stack in one process: LocalCluster (API server, kube-scheduler emulation calling our
extender over real HTTP, kubelets), our scheduler service, and one device plugin per node (fake GPUs)."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from vgpu.core import annotations
from vgpu.core.config import Config
from vgpu.demo import hamicore
from vgpu.gpu import fake
from vgpu.localcluster.cluster import LocalCluster
from vgpu_device_plugin import reporter
from vgpu_device_plugin.hostfs import HostFs
from vgpu_device_plugin.manager import Deps, PluginManager
from vgpu_device_plugin.podcache import InformerView
from vgpu_scheduler.app import SchedulerService

from tests.scheduler.scenario import open_views


def kube_scheduler_config(address: str, *, scheduler_name: str) -> dict[str, Any]:
    """HAMi's extender entry (docs/protocol.md#the-extender-entry) pointing at our loopback extender listener."""
    return {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "profiles": [{"schedulerName": scheduler_name}],
        "extenders": [
            {
                "urlPrefix": f"http://{address}",
                "filterVerb": "filter",
                "bindVerb": "bind",
                "nodeCacheCapable": True,
                "weight": 1,
                "httpTimeout": "30s",
                "managedResources": [
                    {"name": n, "ignoredByScheduler": True}
                    for n in (
                        "nvidia.com/gpu",
                        "nvidia.com/gpumem",
                        "nvidia.com/gpucores",
                        "nvidia.com/gpumem-percentage",
                    )
                ],
            }
        ],
    }


@dataclass
class Stack:
    cluster: LocalCluster
    service: SchedulerService
    config: Config
    plugins: list[tuple[PluginManager, asyncio.Task[None], asyncio.Task[None]]] = field(default_factory=list)
    address: str = ""  # the Service port's host:port (webhook, probes, metrics, dashboard)

    def pod_body(self, name: str, *, gpu: int = 1, mem: int = 1000, cores: int = 0) -> dict[str, Any]:
        limits = {
            "nvidia.com/gpu": str(gpu),
            "nvidia.com/gpumem": str(mem),
            "nvidia.com/gpucores": str(cores),
        }
        return {
            "metadata": {"name": name},
            "spec": {
                "schedulerName": self.config.scheduler.scheduler_name,
                "containers": [{"name": "main", "image": "cuda", "resources": {"limits": limits}}],
            },
        }


async def _start_plugin(stack: Stack, node: str, fake_gpus: dict[str, Any]) -> None:
    api = stack.cluster.api
    host_root = stack.cluster.host_roots[node]  # where the emulated runtime starts its containers
    backend = fake.FakeGpuBackend.from_yaml(fake_gpus, seed=node)
    backend.open()
    cfg = stack.config.for_node(node)
    await asyncio.to_thread(hamicore.install_stand_in, host_root, hook_path=cfg.hook_path)
    view = InformerView(api, node=node)
    deps = Deps(
        backend=backend,
        api=api,
        view=view,
        reporter=reporter.NodeReporter(
            api,
            node=node,
            keys=annotations.Keys(stack.config.annotation_prefix),
            lease_namespace=stack.config.scheduler.lease_namespace,
            lease_duration_s=int(stack.config.scheduler.lease_timeout_s),
            register_interval_s=cfg.register_interval_s,
        ),
        config=cfg,
        node=node,
        plugin_dir=stack.cluster.node_dirs[node],
        node_feed=view,
        pod_feed=view,
        host=HostFs(host_root, hook_path=cfg.hook_path),
    )
    manager = PluginManager(deps)
    view_task = asyncio.create_task(view.run(), name=f"plugin-view-{node}")
    await asyncio.wait_for(view.wait_synced(), 10)
    task = asyncio.create_task(manager.run(), name=f"plugin-{node}")
    stack.plugins.append((manager, task, view_task))


async def _until_gpus_allocatable(stack: Stack) -> None:
    """Every node reports GPUs to kubelet (ListAndWatch) before pods are scheduled onto it."""
    api = stack.cluster.api
    resource = stack.config.resources.count
    want = {spec.name for spec in stack.cluster.description.nodes if spec.gpus}

    def ready(node: dict[str, Any]) -> bool:
        return int((node.get("status") or {}).get("allocatable", {}).get(resource, "0")) > 0

    async with asyncio.timeout(10):
        listed = await api.list("nodes")
        done = {n["metadata"]["name"] for n in listed.items if ready(n)}
        rv = listed.resource_version
        while not want <= done:
            async for event in api.watch("nodes", resource_version=rv, timeout_s=10):
                rv = event.object["metadata"]["resourceVersion"]
                if ready(event.object):
                    done.add(event.object["metadata"]["name"])
                if want <= done:
                    break


@contextlib.asynccontextmanager
async def full_stack(
    description: dict[str, Any],
    *,
    admission_delay_s: float = 0.0,
    config: Config | None = None,
    ssl_context: ssl.SSLContext | None = None,
) -> AsyncIterator[Stack]:
    """``ssl_context``: serve the Service port over HTTPS with it (plain HTTP without)."""
    config = config or Config()
    async with LocalCluster(
        description,
        admission_delay_s=admission_delay_s,
        scheduler_name=config.scheduler.scheduler_name,
        scheduler_initial_backoff_s=0.2,
        scheduler_max_backoff_s=1.0,
    ) as cluster:
        service = SchedulerService(open_views(config), cluster.api)
        stack = Stack(cluster, service, config)
        try:
            stack.address = await service.start(host="127.0.0.1", port=0, ssl_context=ssl_context)
            for spec in cluster.description.nodes:
                await _start_plugin(stack, spec.name, spec.fake_gpus)
            await service.wait_ready()
            await _until_gpus_allocatable(stack)
            await cluster.start_scheduler(
                kube_scheduler_config(
                    service.extender_address, scheduler_name=config.scheduler.scheduler_name
                )
            )
            yield stack
        finally:
            await cluster.stop_scheduler()
            for manager, task, view_task in stack.plugins:
                manager.request_stop()
                with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                    await asyncio.wait_for(task, 10)
                view_task.cancel()
                await asyncio.gather(view_task, return_exceptions=True)
            await service.stop()
