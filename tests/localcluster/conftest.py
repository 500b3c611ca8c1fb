"""Fixtures for the local-cluster tests: a store with its direct API, short socket dirs, waiting."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from vgpu.kube.port import JsonObj, Kind
from vgpu.kubeletapi.v1beta1 import api_pb2, api_pb2_grpc
from vgpu.localcluster.client import LocalKubeApi
from vgpu.localcluster.cluster import LocalCluster
from vgpu.localcluster.statuswriter import StoreStatusWriter
from vgpu.localcluster.store import Store

from tests.localcluster.extenders import ext, start_scheduler  # noqa: F401 (fixtures for the scheduler tests)

RES = "example.com/gpu"  # the resource the test device plugin serves


@pytest.fixture
def store() -> Store:
    return Store()


@pytest.fixture
def api(store: Store) -> LocalKubeApi:
    return LocalKubeApi(store)


@pytest.fixture
def status_writer(store: Store) -> StoreStatusWriter:
    return StoreStatusWriter(store)


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    """A short directory under /tmp (unix socket paths must stay under ~100 characters)."""
    path = Path(tempfile.mkdtemp(prefix="vgpu-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def wait_for(
    api: LocalKubeApi,
    kind: Kind,
    name: str,
    predicate: Callable[[JsonObj], bool],
    *,
    namespace: str | None = "default",
    timeout_s: float = 10.0,
) -> JsonObj:
    """The object once ``predicate`` holds for it, watching (never polling); fails after timeout_s."""
    last: JsonObj | None = None
    async with asyncio.timeout(timeout_s):
        listed = await api.list(kind, namespace=namespace, field_selector=f"metadata.name={name}")
        for obj in listed.items:
            last = obj
            if predicate(obj):
                return obj
        try:
            async for event in api.watch(
                kind,
                resource_version=listed.resource_version,
                namespace=namespace,
                field_selector=f"metadata.name={name}",
            ):
                last = event.object
                if event.type != "DELETED" and predicate(event.object):
                    return event.object
        except TimeoutError:
            pass
    raise AssertionError(f"{kind} {name} never met the condition; last seen: {last}")


async def wait_event(api: LocalKubeApi, name: str, *, reason: str, timeout_s: float = 10.0) -> JsonObj:
    """The first Event with ``reason`` about object ``name`` (watching events)."""
    async with asyncio.timeout(timeout_s):
        listed = await api.list("events", namespace="default")
        for e in listed.items:
            if e["involvedObject"]["name"] == name and e["reason"] == reason:
                return e
        async for event in api.watch("events", resource_version=listed.resource_version, namespace="default"):
            e = event.object
            if e["involvedObject"]["name"] == name and e["reason"] == reason:
                return e
    raise AssertionError(f"no {reason} event for {name}")


def make_pod(
    name: str,
    *,
    scheduler: str = "vgpu-scheduler",
    limits: dict[str, Any] | None = None,
    init_limits: dict[str, Any] | None = None,
    containers: int = 1,
    node_selector: dict[str, str] | None = None,
    requests: dict[str, Any] | None = None,
    node_name: str | None = None,
) -> JsonObj:
    """A pod whose containers c0..cN-1 each have ``limits`` (and an init container with init_limits)."""
    spec: dict[str, Any] = {
        "schedulerName": scheduler,
        "containers": [
            {
                "name": f"c{i}",
                "image": "busybox",
                "resources": {k: v for k, v in (("limits", limits), ("requests", requests)) if v},
            }
            for i in range(containers)
        ],
    }
    if init_limits:
        spec["initContainers"] = [{"name": "init", "image": "busybox", "resources": {"limits": init_limits}}]
    if node_selector:
        spec["nodeSelector"] = node_selector
    if node_name:
        spec["nodeName"] = node_name
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": spec,
    }


def make_node(
    name: str,
    *,
    allocatable: dict[str, str] | None = None,
    ready: bool = True,
    labels: dict[str, str] | None = None,
    unschedulable: bool = False,
) -> JsonObj:
    alloc = {"cpu": "8", "memory": "32Gi", "pods": "110", **(allocatable or {})}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"unschedulable": unschedulable},
        "status": {
            "capacity": dict(alloc),
            "allocatable": alloc,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


@pytest.fixture
async def running() -> AsyncIterator[Callable[[Any], asyncio.Task[Any]]]:
    """Start coroutines as tasks that are cancelled and awaited when the test ends."""
    tasks: list[asyncio.Task[Any]] = []

    def start(coro: Any) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro)
        tasks.append(task)
        return task

    yield start
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


class Env:
    """One test's local API plus the helpers the scheduler and kubelet tests share."""

    def __init__(self, api: LocalKubeApi, status_writer: StoreStatusWriter) -> None:
        self.api = api
        self.status_writer = status_writer
        self.make_pod = make_pod

    async def add_node(self, name: str, **kwargs: Any) -> JsonObj:
        """Create a node and write its status through the status subresource."""
        body = make_node(name, **kwargs)
        await self.api.create("nodes", body)
        return await self.status_writer.merge_patch_status("nodes", name, {"status": body["status"]})

    async def add_pod(self, name: str, **kwargs: Any) -> JsonObj:
        return await self.api.create("pods", make_pod(name, **kwargs), namespace="default")

    async def wait_for(
        self, kind: Kind, name: str, predicate: Callable[[JsonObj], bool], **kwargs: Any
    ) -> JsonObj:
        return await wait_for(self.api, kind, name, predicate, **kwargs)

    async def wait_event(self, name: str, *, reason: str) -> JsonObj:
        return await wait_event(self.api, name, reason=reason)

    async def get_pod(self, name: str) -> JsonObj:
        return await self.api.get("pods", name, namespace="default")


@pytest.fixture
def env(api: LocalKubeApi, status_writer: StoreStatusWriter) -> Env:
    return Env(api, status_writer)


@pytest.fixture
def env_for() -> Callable[[Store], Env]:
    """An ``Env`` over a store the test built itself (e.g. with its own clock)."""
    return lambda store: Env(LocalKubeApi(store), StoreStatusWriter(store))


class Plugin(api_pb2_grpc.DevicePluginServicer):
    """A device plugin with scripted answers; records every call."""

    def __init__(self, devices: list[tuple[str, str]], **options: bool) -> None:
        self.devices = devices
        self.options = api_pb2.DevicePluginOptions(**options)
        self.updates: asyncio.Queue[list[tuple[str, str]] | None] = asyncio.Queue()
        self.allocate_calls: list[list[list[str]]] = []
        self.preferred_calls: list[tuple[list[str], list[str], int]] = []
        self.prestart_calls: list[list[str]] = []
        self.preferred: list[str] = []
        self.allocate_error: str | None = None
        self.prestart_error: str | None = None
        self.gate: asyncio.Event | None = None  # when set, Allocate waits for it
        self.in_allocate = 0
        self.max_in_allocate = 0
        self.stream_ended = asyncio.Event()
        self.allocate_started = asyncio.Event()
        self.server: grpc.aio.Server | None = None
        self.socket: Path | None = None

    def _message(self, devices: list[tuple[str, str]]) -> api_pb2.ListAndWatchResponse:
        return api_pb2.ListAndWatchResponse(devices=[api_pb2.Device(ID=i, health=h) for i, h in devices])

    async def GetDevicePluginOptions(self, request, context):
        return self.options

    async def ListAndWatch(self, request, context):
        try:
            yield self._message(self.devices)
            while (devices := await self.updates.get()) is not None:
                yield self._message(devices)
        finally:
            self.stream_ended.set()

    async def GetPreferredAllocation(self, request, context):
        (req,) = request.container_requests
        self.preferred_calls.append(
            (list(req.available_deviceIDs), list(req.must_include_deviceIDs), req.allocation_size)
        )
        return api_pb2.PreferredAllocationResponse(
            container_responses=[api_pb2.ContainerPreferredAllocationResponse(deviceIDs=self.preferred)]
        )

    async def Allocate(self, request, context):
        self.allocate_calls.append([list(c.devices_ids) for c in request.container_requests])
        self.allocate_started.set()
        self.in_allocate += 1
        self.max_in_allocate = max(self.max_in_allocate, self.in_allocate)
        try:
            if self.gate is not None:
                await self.gate.wait()
            if self.allocate_error:
                await context.abort(grpc.StatusCode.UNKNOWN, self.allocate_error)
            return api_pb2.AllocateResponse(
                container_responses=[
                    api_pb2.ContainerAllocateResponse(
                        envs={"VISIBLE": ",".join(c.devices_ids)},
                        mounts=[
                            api_pb2.Mount(
                                container_path="/usr/lib/x.so", host_path="/opt/x.so", read_only=True
                            )
                        ],
                        devices=[
                            api_pb2.DeviceSpec(
                                container_path="/dev/x0", host_path="/dev/x0", permissions="rw"
                            )
                        ],
                        annotations={"a": "b"},
                        cdi_devices=[api_pb2.CDIDevice(name="example.com/gpu=0")],
                    )
                    for c in request.container_requests
                ]
            )
        finally:
            self.in_allocate -= 1

    async def PreStartContainer(self, request, context):
        self.prestart_calls.append(list(request.devices_ids))
        if self.prestart_error:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, self.prestart_error)
        return api_pb2.PreStartContainerResponse()

    async def serve(self, socket_dir: Path, name: str = "plugin.sock") -> None:
        self.socket = socket_dir / name
        self.server = grpc.aio.server()
        api_pb2_grpc.add_DevicePluginServicer_to_server(self, self.server)  # type: ignore[no-untyped-call]
        self.server.add_insecure_port(f"unix://{self.socket}")
        await self.server.start()

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop(None)
            self.server = None

    async def register(
        self,
        socket_dir: Path,
        *,
        endpoint: str = "plugin.sock",
        resource: str = RES,
        version: str = "v1beta1",
        options: api_pb2.DevicePluginOptions | None = None,
    ) -> None:
        """Call kubelet's Register as a plugin does (over ``socket_dir/kubelet.sock``)."""
        async with grpc.aio.insecure_channel(f"unix://{socket_dir / 'kubelet.sock'}") as channel:
            stub = api_pb2_grpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]
            await stub.Register(
                api_pb2.RegisterRequest(
                    version=version, endpoint=endpoint, resource_name=resource, options=options
                ),
                timeout=10,
            )


@pytest.fixture
async def plugins():
    started: list[Plugin] = []

    def make(devices: list[tuple[str, str]], **options: bool) -> Plugin:
        plugin = Plugin(devices, **options)
        started.append(plugin)
        return plugin

    yield make
    for plugin in started:
        plugin.updates.put_nowait(None)
        await plugin.stop()


TWO_NODES: dict[str, Any] = {
    "nodes": [
        {
            "name": "gpu-a",
            "labels": {"zone": "a"},
            "gpus": [{"model": "NVIDIA A100-SXM4-40GB", "memoryMib": 40960}],
        },
        {
            "name": "gpu-b",
            "labels": {"zone": "b"},
            "gpus": [{"model": "NVIDIA T4", "memoryMib": 15360, "count": 2}],
        },
    ]
}


@pytest.fixture
async def local_cluster() -> AsyncIterator[Callable[..., Any]]:
    """Start ``LocalCluster``s (default: TWO_NODES); each is torn down when the test ends."""
    started: list[LocalCluster] = []

    async def start(description: Any = None, **kwargs: Any) -> LocalCluster:
        cluster = LocalCluster(description or TWO_NODES, **kwargs)
        await cluster.__aenter__()
        started.append(cluster)
        return cluster

    yield start
    for cluster in reversed(started):
        await cluster.__aexit__(None, None, None)
