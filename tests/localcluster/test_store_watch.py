"""Store watches: replay from a resourceVersion, Gone, selector transitions, bookmarks, closing."""

from __future__ import annotations

from typing import Any

import pytest
from vgpu.core import errors
from vgpu.localcluster.client import LocalKubeApi
from vgpu.localcluster.store import Store
from vgpu.localcluster.watcher import Watcher


def pod(name: str, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels}, "spec": {"containers": [{"name": "c"}]}}


async def drain(w: Watcher) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    while (event := await w.next_event(timeout_s=0)) is not None:
        out.append((event.type, event.object["metadata"].get("name", "")))
    return out


async def test_watch_replays_changes_after_a_resource_version() -> None:
    store = Store()
    store.create("pods", pod("a"), namespace="default")
    rv = store.resource_version
    store.patch("pods", "a", {"metadata": {"labels": {"x": "1"}}}, namespace="default")
    store.create("pods", pod("b"), namespace="default")
    store.delete("pods", "a", namespace="default")
    w = store.watch("pods", resource_version=rv)
    assert await drain(w) == [("MODIFIED", "a"), ("ADDED", "b"), ("MODIFIED", "a"), ("DELETED", "a")]
    store.create("pods", pod("c"), namespace="kube-system")
    assert await drain(w) == [("ADDED", "c")]
    w.close()


async def test_watch_from_zero_starts_with_synthetic_added() -> None:
    store = Store()
    store.create("pods", pod("a"), namespace="default")
    store.create("pods", pod("b"), namespace="kube-system")
    w = store.watch("pods", resource_version="0", namespace="default")
    assert await drain(w) == [("ADDED", "a")]
    w.close()


async def test_too_old_resource_version_is_gone() -> None:
    store = Store(history_size=3)
    rv = store.resource_version
    for i in range(5):
        store.create("pods", pod(f"p{i}"), namespace="default")
    with pytest.raises(errors.Gone) as exc:
        store.watch("pods", resource_version=rv)
    assert exc.value.status == 410 and exc.value.reason == "Expired"
    # the newest three events can still be replayed
    w = store.watch("pods", resource_version=str(int(store.resource_version) - 3))
    assert [n for _, n in await drain(w)] == ["p2", "p3", "p4"]
    w.close()


async def test_selector_watch_sees_objects_enter_and_leave_as_added_and_deleted() -> None:
    store = Store()
    rv = store.resource_version
    w = store.watch("pods", resource_version=rv, field_selector="spec.nodeName=n1")
    store.create("pods", pod("a"), namespace="default")
    store.bind("default", "a", node="n1")
    store.patch("pods", "a", {"metadata": {"labels": {"x": "1"}}}, namespace="default")
    assert await drain(w) == [("ADDED", "a"), ("MODIFIED", "a")]
    lw = store.watch("pods", resource_version=rv, label_selector="x=1")
    # replayed history applies the same transitions
    assert await drain(lw) == [("ADDED", "a")]
    store.patch("pods", "a", {"metadata": {"labels": {"x": None}}}, namespace="default")
    assert await drain(lw) == [("DELETED", "a")]
    w.close()
    lw.close()


async def test_bookmarks_only_for_watchers_that_asked() -> None:
    store = Store()
    with_bm = store.watch("nodes", resource_version=store.resource_version, allow_bookmarks=True)
    without = store.watch("nodes", resource_version=store.resource_version)
    store.create("nodes", {"metadata": {"name": "n1"}})
    store.emit_bookmarks()
    got = await with_bm.next_event(timeout_s=1)
    assert got is not None and got.type == "ADDED"
    bm = await with_bm.next_event(timeout_s=1)
    assert bm is not None and bm.type == "BOOKMARK"
    assert bm.object["metadata"]["resourceVersion"] == store.resource_version
    assert await drain(without) == [("ADDED", "n1")]
    store.close_watchers()
    assert await with_bm.next_event() is None and store.watcher_count == 0


async def test_slow_watcher_is_cut_off_not_unbounded() -> None:
    store = Store(watch_queue_size=2)
    w = store.watch("nodes", resource_version=store.resource_version)
    for i in range(4):
        store.create("nodes", {"metadata": {"name": f"n{i}"}})
    assert await drain(w) == [("ADDED", "n0"), ("ADDED", "n1")]
    assert w.closed and store.watcher_count == 0


async def test_local_api_watch_ends_at_timeout_and_unregisters() -> None:
    store = Store()
    api = LocalKubeApi(store)
    events = [e async for e in api.watch("nodes", resource_version=store.resource_version, timeout_s=0.05)]
    assert events == [] and store.watcher_count == 0


async def test_bad_resource_version_is_400() -> None:
    with pytest.raises(errors.KubeError) as exc:
        Store().watch("pods", resource_version="abc")
    assert exc.value.status == 400


async def test_local_api_create_event_records_a_core_event() -> None:
    store = Store()
    api = LocalKubeApi(store)
    p = await api.create("pods", pod("a"), namespace="default")
    await api.create_event(
        namespace="default", involved=p, reason="FailedScheduling", message="no", type="Warning"
    )
    [ev] = (await api.list("events", namespace="default", field_selector="involvedObject.name=a")).items
    assert ev["reason"] == "FailedScheduling" and ev["type"] == "Warning"
    assert (
        ev["involvedObject"]["uid"] == p["metadata"]["uid"] and ev["source"]["component"] == "vgpu-scheduler"
    )
