"""The node lock does not outlive its pod (issue 16, item 5): released when its holder is gone,
finished, Running or done binding; kept while the holder may still Allocate here."""

from __future__ import annotations

import pytest
from vgpu_device_plugin import lockreaper

from tests.device_plugin.builders import KEYS, NODE, StoreView, add_pod, cluster, lock_node, notes_of


async def _reap(store, api) -> bool:  # type: ignore[no-untyped-def]
    return await lockreaper.release_orphaned_lock(api=api, view=StoreView(store), node=NODE, keys=KEYS)


@pytest.mark.parametrize(
    ("phase", "bind_phase", "released"),
    [
        ("Failed", "allocating", True),  # kubelet rejected it (UnexpectedAdmissionError)
        ("Succeeded", "success", True),
        ("Running", "allocating", True),  # admitted: its Allocate is over
        ("Pending", "failed", True),
        ("Pending", "success", True),
        ("Pending", "allocating", False),  # may still Allocate here
    ],
    ids=["failed", "succeeded", "running", "bind-failed", "bind-success", "allocating"],
)
async def test_lock_follows_its_holder(phase: str, bind_phase: str, released: bool) -> None:
    store, api = cluster()
    add_pod(store, "holder", to_allocate=None, phase=bind_phase)
    store.patch("pods", "holder", {"status": {"phase": phase}}, namespace="default", subresource="status")
    lock_node(store, "holder")
    assert await _reap(store, api) is released
    assert (KEYS.node_lock not in notes_of(store, "nodes", NODE)) is released


async def test_lock_of_a_deleted_pod_is_released_and_a_pending_unbound_holder_keeps_it() -> None:
    store, api = cluster()
    lock_node(store, "gone")
    assert await _reap(store, api) is True
    # a holder the scheduler is binding right now: not on this node yet, but it exists
    store.create(
        "pods",
        {"metadata": {"name": "binding"}, "spec": {"containers": [{"name": "c"}]}},
        namespace="default",
    )
    lock_node(store, "binding")
    assert await _reap(store, api) is False
    assert KEYS.node_lock in notes_of(store, "nodes", NODE)


@pytest.mark.parametrize(
    "raw", ["", "not a lock", "2026-11-23T01:00:00Z"], ids=["empty", "garbage", "legacy"]
)
async def test_unreadable_or_legacy_locks_are_left_to_the_scheduler(raw: str) -> None:
    store, api = cluster()
    store.patch("nodes", NODE, {"metadata": {"annotations": {KEYS.node_lock: raw}}})
    assert await _reap(store, api) is False
    assert notes_of(store, "nodes", NODE).get(KEYS.node_lock) == raw


async def test_a_lock_changed_meanwhile_is_never_removed() -> None:
    store, api = cluster()
    lock_node(store, "gone")
    stale = StoreView(store).node()
    lock_node(store, "newcomer")  # another bind took the lock after we read the node
    store.create(
        "pods", {"metadata": {"name": "gone"}, "spec": {"containers": [{"name": "c"}]}}, namespace="default"
    )
    store.patch("pods", "gone", {"status": {"phase": "Failed"}}, namespace="default", subresource="status")

    class Stale(StoreView):
        def node(self):  # type: ignore[no-untyped-def]
            return stale

    assert await lockreaper.release_orphaned_lock(api=api, view=Stale(store), node=NODE, keys=KEYS) is False
    assert notes_of(store, "nodes", NODE)[KEYS.node_lock].endswith(",default,newcomer")
