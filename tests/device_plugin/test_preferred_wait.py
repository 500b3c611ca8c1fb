"""GetPreferredAllocation with no answer yet: it waits (bounded, woken by the pod watch) for a
pending pod it can answer, so kubelet takes the scheduler's GPU instead of arbitrary IDs."""

from __future__ import annotations

import asyncio
import pathlib

from vgpu.core import allocation, errors
from vgpu.localcluster.client import LocalKubeApi
from vgpu.localcluster.store import Store

from tests.device_plugin.builders import GPU_A, GPU_B, KEYS, StoreView, add_pod, cluster, notes_of
from tests.device_plugin.test_allocator import make

AVAILABLE = (f"{GPU_A}-0", f"{GPU_A}-1", f"{GPU_B}-0", f"{GPU_B}-1")
ONE = allocation.PreferredRequest(available=AVAILABLE, must_include=(), size=1)


class LaggingView(StoreView):
    """The watch caches, behind the store until ``catch_up`` (the watch delivering the pod)."""

    def __init__(self, store: Store) -> None:
        super().__init__(store)
        self.behind = True
        self._event = asyncio.Event()
        self.read = asyncio.Event()  # replaced at each read of the pods

    def pods(self):  # type: ignore[no-untyped-def]
        read, self.read = self.read, asyncio.Event()
        read.set()
        return [] if self.behind else super().pods()

    def pods_changed(self) -> asyncio.Event:
        return self._event

    def catch_up(self) -> None:
        self.behind = False
        event, self._event = self._event, asyncio.Event()
        event.set()


class BrownoutApi(LocalKubeApi):
    """The API server fails every pod list (overloaded); the established watch still delivers."""

    def __init__(self, store: Store) -> None:
        super().__init__(store)
        self.tried = asyncio.Event()

    async def list(self, kind, **kwargs):  # type: ignore[no-untyped-def]
        if kind == "pods":
            self.tried.set()
            raise errors.KubeError("the server is currently unable to handle the request")
        return await super().list(kind, **kwargs)


async def test_the_answer_waits_for_the_watch_to_show_the_pod_and_the_allocate_succeeds(
    tmp_path: pathlib.Path,
) -> None:
    """The pod is bound but neither the watch cache nor the API server's reply shows it when
    GetPreferredAllocation starts; the watch delivers it during the call: the answer names the
    scheduler's GPU B (kubelet would otherwise take the first IDs, on GPU A), and the Allocate of
    those IDs succeeds."""
    store, _ = cluster()
    api = BrownoutApi(store)
    view = LaggingView(store)
    alloc = make(store, api, tmp_path, view=view, pod_feed=view)
    add_pod(store, "p", to_allocate=f"{GPU_B},NVIDIA,1000,10:;")
    asking = asyncio.create_task(alloc.preferred([ONE]))
    await api.tried.wait()  # the call has read the cache and tried the API server
    assert not asking.done()
    view.catch_up()
    async with asyncio.timeout(5):
        (ids,) = await asking
    assert ids == [f"{GPU_B}-0"]
    (resp,) = await alloc.allocate([ids])
    assert resp.envs["NVIDIA_VISIBLE_DEVICES"] == GPU_B
    assert notes_of(store, "pods", "p", "default")[KEYS.bind_phase] == "success"


async def test_with_no_pod_it_answers_no_preference_after_the_bound(tmp_path: pathlib.Path) -> None:
    store, api = cluster()
    view = LaggingView(store)
    alloc = make(store, api, tmp_path, view=view, pod_feed=view, preferred_wait_s=0.05)
    async with asyncio.timeout(5):
        assert await alloc.preferred([ONE]) == [[]]
    other = asyncio.Event()  # the event loop ran on while it waited: it never blocked
    asyncio.get_running_loop().call_soon(other.set)
    await other.wait()


async def test_a_pod_change_that_shows_no_fitting_pod_keeps_it_waiting(tmp_path: pathlib.Path) -> None:
    """A pod change of another kind wakes the call, which reads the cache again and waits on; the
    pod that fits, shown next, is answered."""
    store, _ = cluster()
    api = BrownoutApi(store)
    view = LaggingView(store)
    alloc = make(store, api, tmp_path, view=view, pod_feed=view)
    add_pod(store, "wide", to_allocate=f"{GPU_A},NVIDIA,1,1:{GPU_B},NVIDIA,1,1:;")  # two GPUs
    asking = asyncio.create_task(alloc.preferred([ONE]))
    await api.tried.wait()
    read = view.read
    view.catch_up()  # shows "wide": its entry has 2 devices, the request 1
    await read.wait()  # the call woke and read the cache again
    assert not asking.done()
    store.delete("pods", "wide", namespace="default")
    add_pod(store, "p", to_allocate=f"{GPU_B},NVIDIA,1000,10:;")
    view.catch_up()
    async with asyncio.timeout(5):
        assert await asking == [[f"{GPU_B}-0"]]


async def test_a_known_pod_whose_gpu_kubelet_does_not_offer_is_answered_at_once(
    tmp_path: pathlib.Path,
) -> None:
    """kubelet offers only GPU A's IDs (a NUMA restriction): no preference, and no wait."""
    store, api = cluster()
    view = LaggingView(store)
    view.behind = False
    alloc = make(store, api, tmp_path, view=view, pod_feed=view, preferred_wait_s=60)
    add_pod(store, "p", to_allocate=f"{GPU_B},NVIDIA,1000,10:;")
    only_a = allocation.PreferredRequest(available=(f"{GPU_A}-0",), must_include=(), size=1)
    async with asyncio.timeout(5):
        assert await alloc.preferred([only_a]) == [[]]


async def test_kubelet_re_choosing_answered_ids_is_steered_back_at_once(tmp_path: pathlib.Path) -> None:
    """With the pod watch to wait on: kubelet choosing again for a container already answered (a
    restart that lost its checkpoint) is steered back to the answered IDs without waiting; no
    pending pod will ever show up for it."""
    store, api = cluster()
    view = LaggingView(store)
    view.behind = False
    alloc = make(store, api, tmp_path, view=view, pod_feed=view, preferred_wait_s=60)
    add_pod(store, "p", to_allocate=f"{GPU_B},NVIDIA,1000,10:;")
    (first,) = await alloc.allocate([[f"{GPU_B}-1"]])
    answer = await asyncio.wait_for(alloc.preferred([ONE]), 5)  # not preferred_wait_s
    assert answer == [[f"{GPU_B}-1"]]
    (again,) = await alloc.allocate(answer)
    assert again == first
