"""Allocate is idempotent: the same container asking again (kubelet restarted before its
checkpoint, or re-allocates) gets the same answer, a multi-container pod's entries never shift, and
a call kubelet cancels finishes whole (its answer recorded, its writes made) or not at all."""

from __future__ import annotations

import asyncio
import pathlib
from collections.abc import Callable
from typing import Any

import pytest
from vgpu.core import errors
from vgpu_device_plugin import inventory, ledger, writebehind
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


def make(
    store: Any, api: Any, root: pathlib.Path, *, answers: ledger.Ledger | None = None, **kw: Any
) -> HamiAllocator:
    cfg = config()
    return HamiAllocator(
        api=api,
        view=StoreView(store),
        node=NODE,
        config=cfg,
        keys=KEYS,
        refs=inventory.build(fake_backend().devices(), cfg).refs,
        host=installed_host(root, hook_path=cfg.hook_path),
        answers=answers,
        writes=writebehind.Inline(),  # what is written, read right after each answer
        **kw,
    )


def _uid_dirs(resp: Any) -> list[str]:
    return [m.host_path for m in resp.mounts if "/containers/" in m.host_path]


async def test_a_container_asking_again_gets_the_same_answer_and_entries_never_shift(
    tmp_path: pathlib.Path,
) -> None:
    store, api = cluster()
    add_pod(
        store, "two", to_allocate=f"{GPU_A},NVIDIA,1000,30:;{GPU_B},NVIDIA,2000,40:;", containers=("a", "b")
    )
    lock_node(store, "two")
    alloc = make(store, api, tmp_path)
    (first,) = await alloc.allocate([[f"{GPU_A}-0"]])
    (again,) = await alloc.allocate([[f"{GPU_A}-0"]])  # kubelet re-allocates container a
    assert again == first
    assert notes_of(store, "pods", "two", "default")[KEYS.devices_to_allocate] == f";{GPU_B},NVIDIA,2000,40:;"
    (second,) = await alloc.allocate([[f"{GPU_B}-0"]])
    assert second.envs["NVIDIA_VISIBLE_DEVICES"] == GPU_B and second.envs["CUDA_DEVICE_SM_LIMIT"] == "40"
    assert _uid_dirs(second)[0].endswith("_b")


async def test_after_success_a_restarted_kubelet_asking_again_gets_the_same_answer(
    tmp_path: pathlib.Path,
) -> None:
    """kubelet restarted before writing its checkpoint and asks for the last container again; the
    pod's bind phase already says success. A new session's allocator shares the process's ledger."""
    store, api = cluster()
    add_pod(store, "one", to_allocate=f"{GPU_A},NVIDIA,3000,50:;")
    lock_node(store, "one")
    answers = ledger.Ledger(clock=lambda: 0.0)
    (first,) = await make(store, api, tmp_path, answers=answers).allocate([[f"{GPU_A}-3"]])
    assert notes_of(store, "pods", "one", "default")[KEYS.bind_phase] == "success"
    container_dir = tmp_path / _uid_dirs(first)[0].lstrip("/")
    (container_dir / "region").write_text("HAMi-core's shared region")  # the running container's
    (again,) = await make(store, api, tmp_path, answers=answers).allocate([[f"{GPU_A}-3"]])
    assert again == first
    assert (container_dir / "region").exists()  # not re-created under the container


async def test_the_same_ids_for_a_later_pod_are_a_new_request(tmp_path: pathlib.Path) -> None:
    """Once a pod is gone its answers are forgotten: kubelet hands its IDs to the next pod."""
    store, api = cluster()
    add_pod(store, "old", to_allocate=f"{GPU_A},NVIDIA,1000,10:;")
    alloc = make(store, api, tmp_path)
    (old,) = await alloc.allocate([[f"{GPU_A}-0"]])
    store.delete("pods", "old", namespace="default")
    new_pod = add_pod(store, "new", to_allocate=f"{GPU_A},NVIDIA,2000,20:;")
    (new,) = await alloc.allocate([[f"{GPU_A}-0"]])
    assert new.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "2000m" and new != old
    assert new_pod["metadata"]["uid"] in _uid_dirs(new)[0]


async def test_a_finished_pods_answer_is_not_replayed(tmp_path: pathlib.Path) -> None:
    store, api = cluster()
    add_pod(store, "done", to_allocate=f"{GPU_A},NVIDIA,1000,10:;")
    alloc = make(store, api, tmp_path)
    await alloc.allocate([[f"{GPU_A}-0"]])
    store.patch("pods", "done", {"status": {"phase": "Succeeded"}}, namespace="default", subresource="status")
    with pytest.raises(errors.AllocationError, match="no binding pod"):
        await alloc.allocate([[f"{GPU_A}-0"]])


async def test_a_cancelled_call_finishes_whole_and_the_retry_gets_its_answer(tmp_path: pathlib.Path) -> None:
    """kubelet cancels the call while its work waits (here on the host's files): the work still
    ends whole, its entry consumed and its answer recorded, and kubelet's retry is answered from
    the record without consuming another entry."""
    store, api = cluster()
    add_pod(
        store, "slow", to_allocate=f"{GPU_A},NVIDIA,1000,30:;{GPU_B},NVIDIA,2000,40:;", containers=("a", "b")
    )
    lock_node(store, "slow")
    entered, release = asyncio.Event(), asyncio.Event()

    async def gated(func: Callable[[], Any]) -> Any:
        entered.set()
        await release.wait()
        return func()

    alloc = make(store, api, tmp_path, offload=gated)
    call = asyncio.ensure_future(alloc.allocate([[f"{GPU_A}-0"]]))
    await asyncio.wait_for(entered.wait(), 10)
    call.cancel()  # kubelet's deadline, or kubelet restarting
    with pytest.raises(asyncio.CancelledError):
        await call
    release.set()
    await asyncio.wait_for(alloc.settle(), 10)
    notes = notes_of(store, "pods", "slow", "default")
    assert notes[KEYS.bind_phase] == "allocating"  # not failed: the cancelled call's work went on
    assert notes[KEYS.devices_to_allocate] == f";{GPU_B},NVIDIA,2000,40:;"
    (retry,) = await alloc.allocate([[f"{GPU_A}-0"]])  # kubelet asks again
    assert retry.envs["NVIDIA_VISIBLE_DEVICES"] == GPU_A and _uid_dirs(retry)[0].endswith("_a")
    assert (
        notes_of(store, "pods", "slow", "default")[KEYS.devices_to_allocate] == f";{GPU_B},NVIDIA,2000,40:;"
    )
    (second,) = await alloc.allocate([[f"{GPU_B}-0"]])
    assert second.envs["NVIDIA_VISIBLE_DEVICES"] == GPU_B


def _served(uid: str, ids: set[str], at_s: float = 0.0) -> ledger.Served:
    from vgpu.core import allocation

    return ledger.Served(
        uid, f"default/{uid}", "main", frozenset(ids), allocation.ContainerAllocation(), at_s
    )


def _pod(uid: str, **status: Any) -> dict[str, Any]:
    return {"metadata": {"uid": uid}, "status": status}


@pytest.mark.parametrize(
    ("pods", "now", "kept"),
    [
        ([_pod("u1", phase="Running")], 1000.0, True),
        ([_pod("u1", phase="Succeeded")], 0.0, False),
        ([{"metadata": {"uid": "u1", "deletionTimestamp": "x"}, "status": {"phase": "Running"}}], 0.0, False),
        ([], 10.0, True),  # not in the cache yet: kept a while
        ([], 61.0, False),
        ([_pod("other", phase="Pending")], 0.0, True),
        (["garbage-is-not-a-pod"][:0], 0.0, True),
    ],
    ids=["running", "finished", "deleting", "unseen-young", "unseen-old", "others-only", "empty"],
)
def test_ledger_keeps_records_while_their_pod_lives(pods: list[Any], now: float, kept: bool) -> None:
    clock = [0.0]
    answers = ledger.Ledger(clock=lambda: clock[0])
    answers.record(_served("u1", {"d-0"}), seen=False)
    clock[0] = now
    assert (answers.replay([["d-0"]], pods=pods) is not None) is kept


def test_ledger_forgets_a_seen_pod_once_the_cache_drops_it() -> None:
    answers = ledger.Ledger(clock=lambda: 0.0)
    answers.record(_served("u1", {"d-0"}), seen=False)
    assert answers.replay([["d-0"]], pods=[_pod("u1", phase="Running")]) is not None
    assert answers.replay([["d-0"]], pods=[]) is None  # deleted: a later pod's request is new
    assert len(answers) == 0


def test_ledger_replays_only_when_every_container_repeats() -> None:
    answers = ledger.Ledger(clock=lambda: 0.0)
    answers.record(_served("u1", {"d-0"}), seen=True)
    assert answers.replay([["d-0"], ["d-1"]], pods=[_pod("u1")]) is None
    assert answers.replay([["d-0", "d-1"]], pods=[_pod("u1")]) is None  # a different set
    assert answers.replay([["d-0"]], pods=[_pod("u1")]) is not None


async def test_a_finished_pods_ids_asked_for_by_the_next_pod_before_the_cache_shows_it_finished(
    tmp_path: pathlib.Path,
) -> None:
    """kubelet frees a finished pod's IDs at once and gives them to the next pod, while our pod
    cache still shows the first one running: the pending pod waiting on that GPU is the one asking,
    and must get its own answer, not the finished pod's."""
    store, api = cluster()
    add_pod(store, "first", to_allocate=f"{GPU_A},NVIDIA,1000,10:;")
    alloc = make(store, api, tmp_path)
    (first,) = await alloc.allocate([[f"{GPU_A}-0"]])
    store.patch("pods", "first", {"status": {"phase": "Running"}}, namespace="default", subresource="status")
    nxt = add_pod(store, "next", to_allocate=f"{GPU_A},NVIDIA,3000,30:;")
    (second,) = await alloc.allocate([[f"{GPU_A}-0"]])
    assert second.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "3000m"
    assert nxt["metadata"]["uid"] in _uid_dirs(second)[0]
    assert notes_of(store, "pods", "next", "default")[KEYS.bind_phase] == "success"
    assert first != second


def _ask(ids: list[str], size: int = 1, must: tuple[str, ...] = ()) -> Any:
    from vgpu.core import allocation

    return allocation.PreferredRequest(available=tuple(ids), must_include=must, size=size)


async def test_kubelet_re_choosing_ids_is_steered_back_to_the_answered_ones(tmp_path: pathlib.Path) -> None:
    """After a restart that lost its checkpoint kubelet chooses IDs again through
    GetPreferredAllocation: the plugin prefers the IDs it answered, so the Allocate repeats them and
    is replayed. A pending pod with no answer yet gets its own entry's preference."""
    store, api = cluster()
    add_pod(store, "one", to_allocate=f"{GPU_B},NVIDIA,3000,50:;")
    alloc = make(store, api, tmp_path)
    (first,) = await alloc.allocate([[f"{GPU_B}-3"]])
    free = [f"{g}-{i}" for g in (GPU_A, GPU_B) for i in range(4)]
    assert await alloc.preferred([_ask(free)]) == [[f"{GPU_B}-3"]]
    (again,) = await alloc.allocate([[f"{GPU_B}-3"]])
    assert again == first
    add_pod(store, "two", to_allocate=f"{GPU_A},NVIDIA,1000,10:;")
    assert await alloc.preferred([_ask(free)]) == [[f"{GPU_A}-0"]]  # its own entry, not one's IDs
    assert await alloc.preferred([_ask([f"{GPU_B}-0"], size=1)]) == [[]]  # nothing fits: no preference


async def test_an_init_containers_ids_reused_by_the_app_container_are_a_new_request(
    tmp_path: pathlib.Path,
) -> None:
    """kubelet gives the app container the devices its init container had (same IDs): that is the
    app container's own Allocate, which takes its own entry. A sidecar keeps its devices."""
    store, api = cluster()
    add_pod(
        store,
        "init",
        to_allocate=f"{GPU_A},NVIDIA,8000,0:;{GPU_A},NVIDIA,2000,20:;",
        init=("setup",),
        containers=("main",),
    )
    alloc = make(store, api, tmp_path)
    (setup,) = await alloc.allocate([[f"{GPU_A}-0"]])
    (main,) = await alloc.allocate([[f"{GPU_A}-0"]])  # reused
    assert (
        setup.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "8000m"
        and main.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "2000m"
    )
    assert _uid_dirs(main)[0].endswith("_main")
    assert notes_of(store, "pods", "init", "default")[KEYS.bind_phase] == "success"
    (again,) = await alloc.allocate([[f"{GPU_A}-0"]])  # kubelet asks again for main
    assert again == main
