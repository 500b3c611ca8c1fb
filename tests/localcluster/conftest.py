"""Fixtures for the local-cluster tests: a store with its direct API, short socket dirs, waiting."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from vgpu.kube.port import JsonObj, Kind
from vgpu.localcluster.client import LocalKubeApi
from vgpu.localcluster.statuswriter import StoreStatusWriter
from vgpu.localcluster.store import Store


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
