"""HamiAllocator called directly: pod choice, annotation rewrites, bind phase, node lock, errors."""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
import threading

import pytest
from vgpu.core import allocation, errors
from vgpu.core.device import GpuUuid
from vgpu.localcluster.client import LocalKubeApi
from vgpu.localcluster.store import Store
from vgpu_device_plugin import inventory, writebehind
from vgpu_device_plugin.allocator import HamiAllocator
from vgpu_device_plugin.hostfs import HostFs
from vgpu_device_plugin.passthrough import PassthroughAllocator

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


def make(
    store: Store,
    api,
    tmp_path: pathlib.Path,
    *,
    view=None,
    host: HostFs | None = None,
    offload=asyncio.to_thread,
    clock=None,
    writes: writebehind.Writes | None = None,
    pod_feed=None,
    preferred_wait_s: float = 2.0,
    **cfg,
) -> HamiAllocator:
    c = config(**cfg)
    inv = inventory.build(fake_backend().devices(), c)
    ids = iter(f"cache-{i}" for i in range(100))
    return HamiAllocator(
        api=api,
        view=view or StoreView(store),
        node=NODE,
        config=c,
        keys=KEYS,
        refs=inv.refs,
        host=host or installed_host(tmp_path, hook_path=c.hook_path),
        new_cache_id=lambda: next(ids),
        offload=offload,
        **({"clock": clock} if clock is not None else {}),
        writes=writes if writes is not None else writebehind.Inline(),  # what is written, in order
        pod_feed=pod_feed,
        preferred_wait_s=preferred_wait_s,
    )


async def test_one_gpu_pod_gets_env_mounts_and_success(tmp_path: pathlib.Path) -> None:
    store, api = cluster()
    pod = add_pod(store, "p1", to_allocate=f"{GPU_A},NVIDIA,3000,50:;")
    lock_node(store, "p1")
    alloc = make(store, api, tmp_path)
    (resp,) = await alloc.allocate([[f"{GPU_A}-3"]])
    assert resp.envs["NVIDIA_VISIBLE_DEVICES"] == GPU_A
    assert resp.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "3000m"
    assert resp.envs["CUDA_DEVICE_SM_LIMIT"] == "50"
    assert resp.envs["CUDA_DEVICE_MEMORY_SHARED_CACHE"] == "/usr/local/vgpu/cache-0.cache"
    uid = pod["metadata"]["uid"]
    host_dir = f"/usr/local/vgpu/containers/{uid}_main"
    assert allocation.Mount("/usr/local/vgpu", host_dir, False) in resp.mounts
    assert (tmp_path / host_dir.lstrip("/")).is_dir() and (tmp_path / "usr/local/vgpu/vgpulock").is_dir()
    assert allocation.Mount("/tmp/vgpulock", "/usr/local/vgpu/vgpulock", False) in resp.mounts
    notes = notes_of(store, "pods", "p1", "default")
    assert notes[KEYS.bind_phase] == "success"
    assert notes[KEYS.devices_to_allocate] == ";"
    assert notes[KEYS.devices_allocated] == f"{GPU_A},NVIDIA,3000,50:;"  # never changed by the plugin
    assert KEYS.node_lock not in notes_of(store, "nodes", NODE)
    # the hami.io/vgpu-node label came with the success write
    assert store.get("pods", "p1", namespace="default")["metadata"]["labels"] == {KEYS.assigned_node: NODE}


class ThreadNotingHostFs(HostFs):
    """A HostFs that notes which thread touched the host files."""

    threads: list[threading.Thread]

    def container_dir(self, pod_uid: str, container: str) -> str:
        self.threads.append(threading.current_thread())
        return super().container_dir(pod_uid, container)

    def facts(self) -> allocation.HostFacts:
        self.threads.append(threading.current_thread())
        return super().facts()


async def test_host_files_are_made_off_the_event_loop(tmp_path: pathlib.Path) -> None:
    """mkdir/rmtree/stat block (0.4 ms for a new directory on ext4, more on a busy disk): never on
    the loop that serves kubelet; the host facts are read once per Allocate, not per container."""
    store, api = cluster()
    add_pod(store, "p1", to_allocate=f"{GPU_A},NVIDIA,1000,0:;{GPU_B},NVIDIA,1000,0:;", containers=("a", "b"))
    installed_host(tmp_path)
    host = ThreadNotingHostFs(tmp_path, hook_path=config().hook_path)
    host.threads = []
    hops = []

    def counted(func):
        hops.append(func)
        return asyncio.to_thread(func)

    alloc = make(store, api, tmp_path, host=host, offload=counted)
    await alloc.allocate([[f"{GPU_A}-0"], [f"{GPU_B}-0"]])
    assert len(host.threads) == 3  # facts once, then one directory per container
    assert threading.current_thread() not in host.threads
    assert len(hops) == 1 and len(set(host.threads)) == 1  # one hop to a thread for the whole Allocate


async def test_two_gpus_one_container(tmp_path: pathlib.Path) -> None:
    store, api = cluster()
    add_pod(store, "p2", to_allocate=f"{GPU_A},NVIDIA,4000,30:{GPU_B},NVIDIA,4000,30:;")
    (resp,) = await make(store, api, tmp_path).allocate([[f"{GPU_A}-0", f"{GPU_B}-0"]])
    assert resp.envs["NVIDIA_VISIBLE_DEVICES"] == f"{GPU_A},{GPU_B}"
    assert (resp.envs["CUDA_DEVICE_MEMORY_LIMIT_0"], resp.envs["CUDA_DEVICE_MEMORY_LIMIT_1"]) == (
        "4000m",
        "4000m",
    )
    assert notes_of(store, "pods", "p2", "default")[KEYS.bind_phase] == "success"


async def test_two_containers_in_turn_then_success(tmp_path: pathlib.Path) -> None:
    store, api = cluster()
    pod = add_pod(
        store,
        "p3",
        to_allocate=f";{GPU_A},NVIDIA,1000,30:;{GPU_B},NVIDIA,2000,40:;",
        init=("setup",),
        containers=("train", "sidecar"),
        env={"CUDA_DISABLE_CONTROL": "true"},
    )
    lock_node(store, "p3")
    alloc = make(store, api, tmp_path)
    (first,) = await alloc.allocate([[f"{GPU_A}-1"]])
    notes = notes_of(store, "pods", "p3", "default")
    assert notes[KEYS.bind_phase] == "allocating"
    assert notes[KEYS.devices_to_allocate] == f";;{GPU_B},NVIDIA,2000,40:;"
    assert KEYS.node_lock in notes_of(store, "nodes", NODE)  # still held until the last container
    (second,) = await alloc.allocate([[f"{GPU_B}-1"]])
    assert first.envs["NVIDIA_VISIBLE_DEVICES"] == GPU_A and second.envs["NVIDIA_VISIBLE_DEVICES"] == GPU_B
    assert second.envs["CUDA_DEVICE_SM_LIMIT"] == "40"
    uid = pod["metadata"]["uid"]
    assert any(m.host_path.endswith(f"{uid}_train") for m in first.mounts)
    assert any(m.host_path.endswith(f"{uid}_sidecar") for m in second.mounts)
    # the pod's own CUDA_DISABLE_CONTROL does not leave HAMi-core out (issue 49): every container preloads it
    for resp in (first, second):
        assert [m.host_path for m in resp.mounts if m.container_path == "/etc/ld.so.preload"] == [
            "/usr/local/vgpu/ld.so.preload"
        ]
    assert notes_of(store, "pods", "p3", "default")[KEYS.bind_phase] == "success"
    assert KEYS.node_lock not in notes_of(store, "nodes", NODE)


async def test_a_pod_with_a_sidecar_is_served_container_by_container_in_spec_order(
    tmp_path: pathlib.Path,
) -> None:
    """kubelet calls Allocate for the init containers in spec order, a sidecar (restartable init
    container) among them, then for the app containers; it does not hand a sidecar's devices on to
    a later container. Each call takes the next entry of the pod device string, whose layout (one
    entry per container, init containers first) a sidecar does not change."""
    store, api = cluster()
    pod = add_pod(
        store,
        "p5",
        to_allocate=f"{GPU_A},NVIDIA,8000,0:;{GPU_A},NVIDIA,4000,10:;{GPU_B},NVIDIA,6000,20:;",
        init=("setup", "proxy"),
        sidecars=("proxy",),
        containers=("main",),
    )
    assert pod["spec"]["initContainers"][1]["restartPolicy"] == "Always"
    alloc = make(store, api, tmp_path)
    served = [(await alloc.allocate([[f"{gpu}-{i}"]]))[0] for i, gpu in enumerate((GPU_A, GPU_A, GPU_B))]
    uid = pod["metadata"]["uid"]
    for resp, (name, gpu, limit) in zip(
        served, (("setup", GPU_A, "8000m"), ("proxy", GPU_A, "4000m"), ("main", GPU_B, "6000m")), strict=True
    ):
        assert resp.envs["NVIDIA_VISIBLE_DEVICES"] == gpu
        assert resp.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == limit
        assert any(m.host_path.endswith(f"{uid}_{name}") for m in resp.mounts)
    assert notes_of(store, "pods", "p5", "default")[KEYS.bind_phase] == "success"


async def test_stale_cache_does_not_serve_the_same_entry_twice(tmp_path: pathlib.Path) -> None:
    store, api = cluster()
    add_pod(
        store, "p4", to_allocate=f"{GPU_A},NVIDIA,1000,30:;{GPU_B},NVIDIA,2000,40:;", containers=("a", "b")
    )
    snapshot = StoreView(store).pods()

    class FrozenView(StoreView):
        def pods(self):
            return snapshot  # a watch that has not delivered our patch yet

    alloc = make(store, api, tmp_path)
    alloc._view = FrozenView(store)
    (first,) = await alloc.allocate([[f"{GPU_A}-0"]])
    (second,) = await alloc.allocate([[f"{GPU_B}-0"]])
    assert (first.envs["NVIDIA_VISIBLE_DEVICES"], second.envs["NVIDIA_VISIBLE_DEVICES"]) == (GPU_A, GPU_B)


async def test_oldest_pending_pod_wins_without_a_lock(tmp_path: pathlib.Path) -> None:
    store, api = cluster()
    add_pod(store, "young", to_allocate=f"{GPU_B},NVIDIA,1,1:;", bind_time=200)
    add_pod(store, "old", to_allocate=f"{GPU_A},NVIDIA,1,1:;", bind_time=100)
    add_pod(store, "elsewhere", to_allocate=f"{GPU_A},NVIDIA,1,1:;", bind_time=1, node="other")
    (resp,) = await make(store, api, tmp_path).allocate([[f"{GPU_A}-0"]])
    assert resp.envs["NVIDIA_VISIBLE_DEVICES"] == GPU_A
    assert notes_of(store, "pods", "old", "default")[KEYS.bind_phase] == "success"
    assert notes_of(store, "pods", "young", "default")[KEYS.bind_phase] == "allocating"


async def test_lock_of_a_pod_that_is_not_pending_falls_back(tmp_path: pathlib.Path) -> None:
    store, api = cluster()
    add_pod(store, "done", to_allocate=";", phase="success")
    add_pod(store, "waiting", to_allocate=f"{GPU_B},NVIDIA,1,1:;")
    lock_node(store, "done")
    (resp,) = await make(store, api, tmp_path).allocate([[f"{GPU_B}-0"]])
    assert resp.envs["NVIDIA_VISIBLE_DEVICES"] == GPU_B
    assert KEYS.node_lock in notes_of(store, "nodes", NODE)  # someone else's lock: left alone


async def test_no_pending_pod_is_a_clear_error(tmp_path: pathlib.Path) -> None:
    store, api = cluster()
    with pytest.raises(errors.AllocationError, match=f"no binding pod found on node {NODE}"):
        await make(store, api, tmp_path).allocate([[f"{GPU_A}-0"]])


@pytest.mark.parametrize(
    ("to_allocate", "ids", "message"),
    [
        ("GPU-garbage", [f"{GPU_A}-0"], "no container is waiting"),
        (f"{GPU_A},NVIDIA,many,1:;", [f"{GPU_A}-0"], "invalid integer"),
        (f"{GPU_A},NVIDIA,1,1:;", [f"{GPU_A}-0", f"{GPU_B}-0"], "device number not matched"),
        ("GPU-unknown,NVIDIA,1,1:;", ["GPU-unknown-0"], "GPU-unknown is not on this node"),
    ],
    ids=["garbage", "bad-int", "count", "unknown-gpu"],
)
async def test_garbage_annotation_fails_the_pod_and_releases_the_lock(
    tmp_path: pathlib.Path, to_allocate: str, ids: list[str], message: str
) -> None:
    store, api = cluster()
    add_pod(store, "bad", to_allocate=to_allocate)
    lock_node(store, "bad")
    with pytest.raises(errors.AllocationError, match="pod default/bad") as info:
        await make(store, api, tmp_path).allocate([ids])
    assert message in str(info.value)
    assert notes_of(store, "pods", "bad", "default")[KEYS.bind_phase] == "failed"
    assert KEYS.node_lock not in notes_of(store, "nodes", NODE)


async def test_unsafe_pod_uid_never_escapes_the_host_root(tmp_path: pathlib.Path) -> None:
    store, api = cluster()
    add_pod(store, "p", to_allocate=f"{GPU_A},NVIDIA,1,1:;", containers=("..",))
    with pytest.raises(errors.AllocationError, match="unsafe container name"):
        await make(store, api, tmp_path).allocate([[f"{GPU_A}-0"]])
    assert notes_of(store, "pods", "p", "default")[KEYS.bind_phase] == "failed"


async def test_lock_release_retries_on_conflict(tmp_path: pathlib.Path) -> None:
    store, api = cluster()
    add_pod(store, "p", to_allocate=f"{GPU_A},NVIDIA,1,1:;")
    lock_node(store, "p")
    stale = store.get("nodes", NODE)
    store.patch("nodes", NODE, {"metadata": {"labels": {"touched": "yes"}}})  # bumps resourceVersion

    class StaleNodeView(StoreView):
        def node(self):
            return stale

    alloc = make(store, api, tmp_path)
    alloc._view = StaleNodeView(store)
    await alloc.allocate([[f"{GPU_A}-0"]])
    assert KEYS.node_lock not in notes_of(store, "nodes", NODE)


async def test_preferred_allocation_follows_the_annotation(tmp_path: pathlib.Path) -> None:
    store, api = cluster()
    add_pod(store, "p", to_allocate=f"{GPU_B},NVIDIA,1,1:{GPU_A},NVIDIA,1,1:;")
    alloc = make(store, api, tmp_path)
    req = allocation.PreferredRequest(
        available=(f"{GPU_A}-0", f"{GPU_A}-1", f"{GPU_B}-0", f"{GPU_B}-1"), must_include=(), size=2
    )
    assert await alloc.preferred([req]) == [[f"{GPU_B}-0", f"{GPU_A}-0"]]
    store.delete("pods", "p", namespace="default")
    assert await alloc.preferred([req]) == [[]]


async def test_a_failing_api_write_is_retried_after_the_answer(tmp_path: pathlib.Path) -> None:
    """The writes follow the answer: a failing PATCH does not fail the Allocate, it is retried."""
    store, api = cluster()
    add_pod(store, "p", to_allocate=f"{GPU_A},NVIDIA,1,1:;")
    lock_node(store, "p")

    class Flaky(type(api)):  # type: ignore[misc]
        calls = 0

        async def merge_patch(self, kind, name, patch, *, namespace=None):
            Flaky.calls += 1
            if Flaky.calls == 1:
                raise errors.KubeError("etcdserver: request timed out", status=500)
            return await super().merge_patch(kind, name, patch, namespace=namespace)

    pauses: list[float] = []

    async def no_wait(seconds: float) -> None:
        pauses.append(seconds)

    writes = writebehind.WriteQueue(sleep=no_wait)
    alloc = make(store, Flaky(store), tmp_path, writes=writes)
    (resp,) = await alloc.allocate([[f"{GPU_A}-0"]])
    assert resp.envs["NVIDIA_VISIBLE_DEVICES"] == GPU_A
    await asyncio.wait_for(writes.drain(), 5)
    assert pauses == [1.0] and writes.landed == 1
    assert notes_of(store, "pods", "p", "default")[KEYS.bind_phase] == "success"
    assert KEYS.node_lock not in notes_of(store, "nodes", NODE)


async def test_an_unexpected_bug_still_fails_the_pod(tmp_path: pathlib.Path) -> None:
    store, api = cluster()
    add_pod(store, "p", to_allocate=f"{GPU_A},NVIDIA,1,1:;")
    lock_node(store, "p")
    alloc = make(store, api, tmp_path)

    def broken_facts():
        raise RuntimeError("boom")

    alloc._host.facts = broken_facts  # type: ignore[method-assign]
    with pytest.raises(errors.VgpuError, match="pod default/p: internal error"):
        await alloc.allocate([[f"{GPU_A}-0"]])
    assert notes_of(store, "pods", "p", "default")[KEYS.bind_phase] == "failed"
    assert KEYS.node_lock not in notes_of(store, "nodes", NODE)


@pytest.mark.parametrize(
    "lock",
    ["garbage,,", "2026-11-23T01:00:00Z", "2026-11-23T01:00:00Z,default,ghost", "not-a-time,default,p"],
    ids=["malformed", "legacy-time-only", "holder-gone", "bad-time"],
)
async def test_unusable_node_lock_falls_back_to_the_oldest_pending_pod(
    tmp_path: pathlib.Path, lock: str
) -> None:
    store, api = cluster()
    add_pod(store, "p", to_allocate=f"{GPU_A},NVIDIA,1,1:;")
    store.patch("nodes", NODE, {"metadata": {"annotations": {KEYS.node_lock: lock}}})
    (resp,) = await make(store, api, tmp_path).allocate([[f"{GPU_A}-0"]])
    assert resp.envs["NVIDIA_VISIBLE_DEVICES"] == GPU_A
    assert notes_of(store, "pods", "p", "default")[KEYS.bind_phase] == "success"
    assert notes_of(store, "nodes", NODE)[KEYS.node_lock] == lock  # not ours: left for the scheduler


class _LaggingView:
    """A ClusterView whose watches have not delivered anything yet (kubelet saw the Binding first)."""

    def pods(self) -> list:
        return []

    def pod(self, namespace: str, name: str) -> None:
        return None

    def node(self) -> None:
        return None


@pytest.mark.parametrize("locked", [True, False], ids=["lock-holder", "oldest-pending"])
async def test_caches_behind_the_binding_are_read_through_from_the_api(
    tmp_path: pathlib.Path, locked: bool
) -> None:
    store, api = cluster()
    add_pod(store, "p1", to_allocate=f"{GPU_A},NVIDIA,3000,50:;")
    if locked:
        lock_node(store, "p1")
    alloc = make(store, api, tmp_path, view=_LaggingView())
    (resp,) = await alloc.allocate([[f"{GPU_A}-3"]])
    assert resp.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "3000m"
    assert notes_of(store, "pods", "p1", "default")[KEYS.bind_phase] == "success"
    # the node read from the API shows the lock the cache had not: released now, not by the reaper
    assert KEYS.node_lock not in notes_of(store, "nodes", NODE)


async def test_no_pending_pod_in_caches_or_api_is_still_refused(tmp_path: pathlib.Path) -> None:
    store, api = cluster()
    alloc = make(store, api, tmp_path, view=_LaggingView())
    with pytest.raises(errors.AllocationError, match="no binding pod found"):
        await alloc.allocate([[f"{GPU_A}-3"]])


async def test_passthrough_reads_the_host_facts_off_the_event_loop_and_refuses_unknown_ids(
    tmp_path: pathlib.Path,
) -> None:
    """A whole-GPU resource (no HAMi-core): kubelet's IDs are the GPUs; the host facts are file
    checks, made in a worker thread once per Allocate. An ID the plugin never offered is refused."""
    host = ThreadNotingHostFs(tmp_path, hook_path=config().hook_path)
    host.threads = []
    resource = inventory.Resource(
        "nvidia.com/gpu",
        tuple(inventory.VirtualDevice(u, GpuUuid(u)) for u in (GPU_A, GPU_B)),
        shared=False,
    )
    refs = {GpuUuid(u): allocation.GpuRef(GpuUuid(u), i, i) for i, u in enumerate((GPU_A, GPU_B))}
    alloc = PassthroughAllocator(resource=resource, config=config(), refs=refs, host=host)
    (first, second) = await alloc.allocate([[GPU_A], [GPU_B]])
    assert first.envs["NVIDIA_VISIBLE_DEVICES"] == GPU_A and second.envs["NVIDIA_VISIBLE_DEVICES"] == GPU_B
    assert len(host.threads) == 1 and threading.current_thread() not in host.threads
    with pytest.raises(errors.AllocationError, match="unknown device IDs"):
        await alloc.allocate([["GPU-never-offered"]])


class _NodeBehindView(StoreView):
    """Pods current, the node as the watch last delivered it (before the scheduler's lock)."""

    def __init__(self, store: Store) -> None:
        super().__init__(store)
        self.stale = store.get("nodes", NODE)

    def node(self):  # type: ignore[no-untyped-def]
        return self.stale


class _CountingApi(LocalKubeApi):
    """Counts the node reads (the common path of Allocate must read no node from the API)."""

    node_gets = 0

    async def get(self, kind, name, *, namespace=None):  # type: ignore[no-untyped-def]
        if kind == "nodes":
            self.node_gets += 1
        return await super().get(kind, name, namespace=namespace)


@pytest.mark.parametrize(
    ("to_allocate", "phase"),
    [(f"{GPU_A},NVIDIA,1,1:;", "success"), ("GPU-garbage", "failed")],
    ids=["success", "failed"],
)
async def test_a_lock_the_node_cache_had_not_shown_is_released_when_the_watch_delivers_it(
    tmp_path: pathlib.Path, to_allocate: str, phase: str
) -> None:
    """The scheduler wrote the lock, then the Binding; kubelet's Allocate came before the node
    watch showed the lock. No node read per Allocate; the lock goes when the watch delivers it."""
    store, _ = cluster()
    api = _CountingApi(store)
    add_pod(store, "p1", to_allocate=to_allocate)
    view = _NodeBehindView(store)
    lock_node(store, "p1")
    alloc = make(store, api, tmp_path, view=view)
    with contextlib.suppress(errors.AllocationError):
        await alloc.allocate([[f"{GPU_A}-0"]])
    assert notes_of(store, "pods", "p1", "default")[KEYS.bind_phase] == phase
    assert api.node_gets == 0 and KEYS.node_lock in notes_of(store, "nodes", NODE)
    await alloc.node_changed(store.get("nodes", NODE))  # the watch catches up
    assert KEYS.node_lock not in notes_of(store, "nodes", NODE)


async def test_a_late_lock_of_another_pod_or_a_forgotten_one_is_kept(tmp_path: pathlib.Path) -> None:
    """Only a lock naming a pod this allocator finished, within the memory's time, is released;
    a pod pending again under that name (re-created) keeps it (the reaper's judgement)."""
    store, api = cluster()
    add_pod(store, "p1", to_allocate=f"{GPU_A},NVIDIA,1,1:;")
    now = [0.0]
    alloc = make(store, api, tmp_path, view=_NodeBehindView(store), clock=lambda: now[0])
    await alloc.allocate([[f"{GPU_A}-0"]])
    add_pod(store, "p2", to_allocate=f"{GPU_B},NVIDIA,1,1:;", bind_time=200)
    lock_node(store, "p2")
    await alloc.node_changed(store.get("nodes", NODE))  # p2 is being bound: its lock stays
    assert notes_of(store, "nodes", NODE)[KEYS.node_lock].endswith(",default,p2")

    store.delete("pods", "p1", namespace="default")  # p1 re-created, bound again, allocating
    add_pod(store, "p1", to_allocate=f"{GPU_A},NVIDIA,1,1:;", bind_time=300)
    lock_node(store, "p1")
    await alloc.node_changed(store.get("nodes", NODE))
    assert notes_of(store, "nodes", NODE)[KEYS.node_lock].endswith(",default,p1")

    store.patch(
        "pods", "p1", {"metadata": {"annotations": {KEYS.bind_phase: "success"}}}, namespace="default"
    )
    await alloc.node_changed(store.get("nodes", NODE))  # judged once: p1 is no longer remembered
    assert KEYS.node_lock in notes_of(store, "nodes", NODE)

    alloc2 = make(store, api, tmp_path, view=_NodeBehindView(store), clock=lambda: now[0])
    add_pod(store, "p3", to_allocate=f"{GPU_B},NVIDIA,1,1:;", bind_time=50)
    await alloc2.allocate([[f"{GPU_B}-0"]])
    lock_node(store, "p3")
    now[0] += 3600  # far past the memory's time: the lock reaper's business
    await alloc2.node_changed(store.get("nodes", NODE))
    assert notes_of(store, "nodes", NODE)[KEYS.node_lock].endswith(",default,p3")


@pytest.mark.parametrize(
    "requests", [[], [[]], [[f"{GPU_A}-0"], []]], ids=["no-container", "no-ids", "one-container-no-ids"]
)
async def test_a_request_without_containers_or_ids_is_refused_and_changes_nothing(
    tmp_path: pathlib.Path, requests: list[list[str]]
) -> None:
    store, api = cluster()
    add_pod(store, "p1", to_allocate=f"{GPU_A},NVIDIA,3000,50:;")
    lock_node(store, "p1")
    before = (store.get("pods", "p1", namespace="default"), store.get("nodes", NODE))
    with pytest.raises(errors.AllocationError, match="must name one or more devices"):
        await make(store, api, tmp_path).allocate(requests)
    assert (store.get("pods", "p1", namespace="default"), store.get("nodes", NODE)) == before
