"""Allocate never stalls kubelet: answered from the watch caches while the API server hangs, its
writes made after the answer (and landing once the API server is back), the whole call bounded."""

import asyncio
import pathlib
import time
from typing import Any

from vgpu.core import annotations, errors
from vgpu.kube.port import JsonObj, Kind, ObjectList
from vgpu.localcluster.client import LocalKubeApi
from vgpu.localcluster.store import Store
from vgpu_device_plugin import inventory, podoverlay, writebehind
from vgpu_device_plugin.allocator import HamiAllocator

from tests.device_plugin.builders import (
    GPU_A,
    GPU_B,
    KEYS,
    NODE,
    StoreView,
    add_pod,
    cluster,
    config,
    fake_backend,
    installed_host,
    lock_node,
    notes_of,
)

DEADLINE_S = 0.5


class HungApi(LocalKubeApi):
    """The local cluster's API, hung (every call waits) until ``recover()``: a brownout."""

    def __init__(self, store: Store) -> None:
        super().__init__(store)
        self.up = asyncio.Event()
        self.calls: list[str] = []

    def recover(self) -> None:
        self.up.set()

    async def _wait(self, what: str) -> None:
        self.calls.append(what)
        await self.up.wait()

    async def get(self, kind: Kind, name: str, *, namespace: str | None = None) -> JsonObj:
        await self._wait(f"GET {kind}/{name}")
        return await super().get(kind, name, namespace=namespace)

    async def list(self, kind: Kind, **kwargs: Any) -> ObjectList:
        await self._wait(f"LIST {kind}")
        return await super().list(kind, **kwargs)

    async def merge_patch(
        self, kind: Kind, name: str, patch: Any, *, namespace: str | None = None
    ) -> JsonObj:
        await self._wait(f"PATCH {kind}/{name}")
        return await super().merge_patch(kind, name, patch, namespace=namespace)


class EmptyView(StoreView):
    """Watch caches that have not seen the pod yet."""

    def pods(self) -> list[JsonObj]:
        return []


def make(
    store: Store,
    api: HungApi,
    tmp_path: pathlib.Path,
    *,
    view: Any = None,
    writes: writebehind.WriteQueue | None = None,
    overlay: podoverlay.PodOverlay | None = None,
) -> HamiAllocator:
    cfg = config(allocate_timeout_s=DEADLINE_S)
    return HamiAllocator(
        api=api,
        view=view or StoreView(store),
        node=NODE,
        config=cfg,
        keys=KEYS,
        refs=inventory.build(fake_backend().devices(), cfg).refs,
        host=installed_host(tmp_path, hook_path=cfg.hook_path),
        writes=writes or writebehind.WriteQueue(),
        overlay=overlay,
    )


async def drained(alloc: HamiAllocator) -> None:
    assert isinstance(alloc.writes, writebehind.WriteQueue)
    await asyncio.wait_for(alloc.writes.drain(), 5)


async def test_a_hung_api_server_does_not_hold_the_answer_and_the_writes_land_later(
    tmp_path: pathlib.Path,
) -> None:
    store, _ = cluster()
    api = HungApi(store)
    add_pod(store, "p", to_allocate=f"{GPU_A},NVIDIA,3000,30:;")
    lock_node(store, "p")
    alloc = make(store, api, tmp_path)
    start = time.monotonic()
    (resp,) = await asyncio.wait_for(alloc.allocate([[f"{GPU_A}-0"]]), DEADLINE_S)
    assert time.monotonic() - start < DEADLINE_S
    assert resp.envs["NVIDIA_VISIBLE_DEVICES"] == GPU_A and resp.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "3000m"
    assert api.calls == ["PATCH pods/p"]  # waiting behind the answer, not in front of it
    assert notes_of(store, "pods", "p", "default")[KEYS.bind_phase] == "allocating"
    api.recover()
    await drained(alloc)
    assert notes_of(store, "pods", "p", "default")[KEYS.bind_phase] == "success"
    assert KEYS.node_lock not in notes_of(store, "nodes", NODE)


async def test_containers_and_pods_served_during_the_brownout_each_get_their_own_devices(
    tmp_path: pathlib.Path,
) -> None:
    """Nothing written yet, nothing served twice: the second container gets its own entry, and
    the next pod is not taken for the first one."""
    store, _ = cluster()
    api = HungApi(store)
    add_pod(
        store,
        "two",
        to_allocate=f"{GPU_A},NVIDIA,1000,10:;{GPU_B},NVIDIA,2000,20:;",
        containers=("a", "b"),
        bind_time=100,
    )
    add_pod(store, "next", to_allocate=f"{GPU_B},NVIDIA,4000,40:;", bind_time=200)
    alloc = make(store, api, tmp_path)
    served = []
    for device in (f"{GPU_A}-0", f"{GPU_B}-0", f"{GPU_B}-1"):
        (resp,) = await asyncio.wait_for(alloc.allocate([[device]]), DEADLINE_S)
        served.append((resp.envs["NVIDIA_VISIBLE_DEVICES"], resp.envs["CUDA_DEVICE_MEMORY_LIMIT_0"]))
    assert served == [(GPU_A, "1000m"), (GPU_B, "2000m"), (GPU_B, "4000m")]
    api.recover()
    await drained(alloc)
    for name in ("two", "next"):
        notes = notes_of(store, "pods", name, "default")
        assert notes[KEYS.bind_phase] == "success"
        assert annotations.decode_pod_devices(notes[KEYS.devices_to_allocate]) == tuple(
            () for _ in annotations.decode_pod_devices(notes[KEYS.devices_allocated])
        )


async def test_a_container_asking_again_during_the_brownout_gets_its_answer_and_consumes_nothing(
    tmp_path: pathlib.Path,
) -> None:
    """Idempotency with the writes behind the answer: kubelet asks again for the first container
    while nothing is written yet; it gets the recorded answer from memory (no API call), and the
    second container still gets its own entry."""
    store, _ = cluster()
    api = HungApi(store)
    add_pod(
        store, "two", to_allocate=f"{GPU_A},NVIDIA,1000,10:;{GPU_B},NVIDIA,2000,20:;", containers=("a", "b")
    )
    alloc = make(store, api, tmp_path)
    (first,) = await asyncio.wait_for(alloc.allocate([[f"{GPU_A}-0"]]), DEADLINE_S)
    (again,) = await asyncio.wait_for(alloc.allocate([[f"{GPU_A}-0"]]), DEADLINE_S)
    assert again == first
    (second,) = await asyncio.wait_for(alloc.allocate([[f"{GPU_B}-0"]]), DEADLINE_S)
    assert (
        second.envs["NVIDIA_VISIBLE_DEVICES"] == GPU_B
        and second.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "2000m"
    )
    assert api.calls == ["PATCH pods/two"]  # the first write, waiting; nothing read
    api.recover()
    await drained(alloc)
    notes = notes_of(store, "pods", "two", "default")
    assert notes[KEYS.bind_phase] == "success" and notes[KEYS.devices_to_allocate] == ";;"


async def test_with_nothing_cached_and_the_api_server_hung_the_call_fails_in_time_and_says_why(
    tmp_path: pathlib.Path,
) -> None:
    store, _ = cluster()
    api = HungApi(store)
    add_pod(store, "p", to_allocate=f"{GPU_A},NVIDIA,3000,30:;")
    alloc = make(store, api, tmp_path, view=EmptyView(store))
    start = time.monotonic()
    try:
        await asyncio.wait_for(alloc.allocate([[f"{GPU_A}-0"]]), 5)
    except errors.AllocationError as exc:
        message = str(exc)
    else:
        raise AssertionError("Allocate answered without a pod")
    assert DEADLINE_S <= time.monotonic() - start < 5
    assert message == (
        f"Allocate on node {NODE} took longer than {DEADLINE_S:g} s (allocateTimeoutS) waiting for the "
        f"API server (no pending pod in the watch caches yet); devices [['{GPU_A}-0']]"
    )


async def test_a_lock_holder_missing_from_the_cache_fails_in_time_without_serving_another_pod(
    tmp_path: pathlib.Path,
) -> None:
    """The lock names a pod the cache lacks: its GET hangs; past the deadline the call fails, the
    oldest pending pod is not served instead, and no write was made in front of the answer."""
    store, _ = cluster()
    api = HungApi(store)
    lock_node(store, "elsewhere")
    add_pod(store, "p", to_allocate=f"{GPU_A},NVIDIA,3000,30:;")
    alloc = make(store, api, tmp_path)
    try:
        await asyncio.wait_for(alloc.allocate([[f"{GPU_A}-0"]]), 5)
    except errors.AllocationError as exc:
        assert "waiting for the API server (reading lock holder default/elsewhere)" in str(exc)
    else:
        raise AssertionError("served although the lock holder could not be read")
    assert api.calls == ["GET pods/elsewhere"]
    assert notes_of(store, "pods", "p", "default")[KEYS.bind_phase] == "allocating"


async def test_a_new_session_during_the_brownout_sees_what_the_last_one_has_not_written(
    tmp_path: pathlib.Path,
) -> None:
    """SIGHUP between two containers' Allocates: the manager hands its queue and overlay to the
    next session's allocator, so the second container still gets the second entry."""
    store, _ = cluster()
    api = HungApi(store)
    add_pod(
        store, "two", to_allocate=f"{GPU_A},NVIDIA,1000,10:;{GPU_B},NVIDIA,2000,20:;", containers=("a", "b")
    )
    writes, overlay = writebehind.WriteQueue(), podoverlay.PodOverlay()
    first = make(store, api, tmp_path, writes=writes, overlay=overlay)
    (a,) = await asyncio.wait_for(first.allocate([[f"{GPU_A}-0"]]), DEADLINE_S)
    second = make(store, api, tmp_path, writes=writes, overlay=overlay)
    (b,) = await asyncio.wait_for(second.allocate([[f"{GPU_B}-0"]]), DEADLINE_S)
    assert (a.envs["NVIDIA_VISIBLE_DEVICES"], b.envs["NVIDIA_VISIBLE_DEVICES"]) == (GPU_A, GPU_B)
    api.recover()
    await asyncio.wait_for(writes.drain(), 5)
    assert notes_of(store, "pods", "two", "default")[KEYS.bind_phase] == "success"
