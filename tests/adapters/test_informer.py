"""The Informer against the local store: sync, live events, resume, re-list on Gone, back-off."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest
from vgpu.core import errors
from vgpu.kube.informer import Change, Informer
from vgpu.kube.port import Kind, ObjectList, WatchEvent
from vgpu.localcluster.client import LocalKubeApi
from vgpu.localcluster.store import Store


class Recorder:
    """Collects changes and lets a test wait for a count, bounded in time."""

    def __init__(self) -> None:
        self.changes: list[Change] = []
        self._cond = asyncio.Condition()

    async def __call__(self, change: Change) -> None:
        async with self._cond:
            self.changes.append(change)
            self._cond.notify_all()

    async def wait_for(self, n: int, timeout_s: float = 5.0) -> list[tuple[str, str]]:
        async with asyncio.timeout(timeout_s), self._cond:
            await self._cond.wait_for(lambda: len(self.changes) >= n)
        return [(c.type, c.object["metadata"]["name"]) for c in self.changes]


def node(name: str, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels}}


@pytest.fixture
async def running() -> AsyncIterator[tuple[Store, Recorder, Informer]]:
    store = Store(history_size=5)
    store.create("nodes", node("n1"))
    rec = Recorder()
    inf = Informer(LocalKubeApi(store), "nodes", on_event=rec, backoff_initial_s=0.01)
    task = asyncio.create_task(inf.run())
    await asyncio.wait_for(inf.synced.wait(), 5)
    yield store, rec, inf
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_first_list_fills_cache_and_sets_synced(running: tuple[Store, Recorder, Informer]) -> None:
    _store, rec, inf = running
    assert await rec.wait_for(1) == [("ADDED", "n1")]
    assert inf.get(None, "n1") is not None and len(inf) == 1 and inf.relists == 1


async def test_live_events_in_order_with_old_objects(running: tuple[Store, Recorder, Informer]) -> None:
    store, rec, inf = running
    store.create("nodes", node("n2"))
    store.patch("nodes", "n2", {"metadata": {"labels": {"a": "1"}}})
    store.delete("nodes", "n1")
    got = await rec.wait_for(4)
    assert got == [("ADDED", "n1"), ("ADDED", "n2"), ("MODIFIED", "n2"), ("DELETED", "n1")]
    assert rec.changes[2].old is not None and rec.changes[2].old["metadata"]["labels"] == {}
    assert [o["metadata"]["name"] for o in inf.items()] == ["n2"]
    assert inf.resource_version == store.resource_version


async def test_resume_after_a_dropped_watch_without_relisting(
    running: tuple[Store, Recorder, Informer],
) -> None:
    store, rec, inf = running
    await rec.wait_for(1)
    store.close_watchers()
    store.create("nodes", node("n2"))  # happens while the informer is disconnected
    assert await rec.wait_for(2) == [("ADDED", "n1"), ("ADDED", "n2")]
    assert inf.relists == 1


async def test_relist_after_gone_reproduces_missed_deletions(
    running: tuple[Store, Recorder, Informer],
) -> None:
    store, rec, inf = running
    await rec.wait_for(1)
    store.close_watchers()
    # while disconnected: n1 goes away and enough happens that the history forgets it
    store.delete("nodes", "n1")
    for i in range(6):
        store.create("nodes", node(f"m{i}"))
    store.patch("nodes", "m0", {"metadata": {"labels": {"x": "y"}}})
    got = await rec.wait_for(8)
    assert got[1] == ("DELETED", "n1")
    assert sorted(got[2:]) == [("ADDED", f"m{i}") for i in range(6)]
    assert inf.relists == 2 and inf.get(None, "n1") is None
    assert inf.get(None, "m0")["metadata"]["labels"] == {"x": "y"}  # type: ignore[index]


class FlakyApi(LocalKubeApi):
    """Fails the first ``failures`` list calls with ``error``: by default like an API server that
    is not up yet."""

    def __init__(
        self,
        store: Store,
        failures: int,
        error: errors.KubeError | None = None,
    ) -> None:
        super().__init__(store)
        self.failures = failures
        self.error = error or errors.KubeError("connection refused", status=0)
        self.calls = 0

    async def list(self, kind: Kind, **kw: Any) -> ObjectList:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error
        return await super().list(kind, **kw)


async def test_errors_are_retried_with_backoff_until_synced() -> None:
    store = Store()
    store.create("nodes", node("n1"))
    api = FlakyApi(store, failures=3)
    inf = Informer(api, "nodes", backoff_initial_s=0.001, backoff_max_s=0.002)
    task = asyncio.create_task(inf.run())
    try:
        await asyncio.wait_for(inf.synced.wait(), 5)
        assert api.calls == 4 and inf.get("", "n1") is not None
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def _optional_kind(error: Exception, **allowed: bool) -> Informer:
    """An informer of nodes whose first four lists fail with ``error`` (``allowed``: the
    Informer's option that lets it count as synced then): synced with nothing after the first
    failure where allowed, and filled at the fifth list either way (only then the strict one syncs)."""
    store = Store()
    store.create("nodes", node("n1"))
    api = FlakyApi(store, 4, error)
    rec = Recorder()
    inf = Informer(api, "nodes", on_event=rec, backoff_initial_s=0.001, backoff_max_s=0.002, **allowed)
    task = asyncio.create_task(inf.run())
    try:
        if any(allowed.values()):
            await asyncio.wait_for(inf.synced.wait(), 5)
            assert api.calls == 1 and len(inf) == 0
        assert await rec.wait_for(1) == [("ADDED", "n1")]
        assert inf.synced.is_set() and api.calls == 5
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    return inf


@pytest.mark.parametrize("unserved_ok", [True, False])
async def test_a_kind_the_server_does_not_serve_counts_as_synced_only_where_allowed(
    unserved_ok: bool, caplog: pytest.LogCaptureFixture
) -> None:
    # as an API server older than the kind's version
    await _optional_kind(
        errors.NotFound("the server could not find the requested resource", status=404),
        unserved_ok=unserved_ok,
    )
    unserved_lines = [r for r in caplog.records if "not served by this API server" in r.getMessage()]
    assert len(unserved_lines) == (1 if unserved_ok else 0)


@pytest.mark.parametrize("forbidden_ok", [True, False])
async def test_a_kind_the_role_does_not_grant_counts_as_synced_only_where_allowed(
    forbidden_ok: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """A chart whose role lacks an optional kind's rules: readiness does not wait for it where the
    kind is optional, and the cache fills once the role grants it."""
    denied = errors.KubeError(
        'nodes is forbidden: User "system:serviceaccount:x:y" cannot list resource "nodes"',
        status=403,
        reason="Forbidden",
    )
    await _optional_kind(denied, forbidden_ok=forbidden_ok)
    said = [r for r in caplog.records if "may not list it" in r.getMessage()]
    assert len(said) == (1 if forbidden_ok else 0)
    assert all(r.levelno == logging.WARNING for r in said)


async def test_the_unserved_line_takes_the_level_asked_for(caplog: pytest.LogCaptureFixture) -> None:
    """Where a kind's absence is normal (the DRA views on a cluster without resource.k8s.io) the
    one line is INFO, so a start without it warns of nothing."""
    api = FlakyApi(
        Store(), 1, errors.NotFound("the server could not find the requested resource", status=404)
    )
    inf = Informer(api, "nodes", unserved_ok=True, unserved_log_level=logging.INFO, backoff_max_s=0.002)
    caplog.set_level(logging.INFO, logger="vgpu.kube.informer")
    task = asyncio.create_task(inf.run())
    try:
        await asyncio.wait_for(inf.synced.wait(), 5)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    [line] = [r for r in caplog.records if "not served by this API server" in r.getMessage()]
    assert line.levelno == logging.INFO


async def test_callback_errors_do_not_stop_the_informer() -> None:
    store = Store()
    seen: list[str] = []
    team_seen = asyncio.Event()

    def bad(change: Change) -> None:
        seen.append(change.object["metadata"]["name"])
        if seen[-1] == "team-b":
            team_seen.set()
        raise RuntimeError("boom")

    inf = Informer(LocalKubeApi(store), "namespaces", on_event=bad)
    task = asyncio.create_task(inf.run())
    try:
        await asyncio.wait_for(inf.synced.wait(), 5)
        store.create("namespaces", {"metadata": {"name": "team-a"}})
        store.create("namespaces", {"metadata": {"name": "team-b"}})
        await asyncio.wait_for(team_seen.wait(), 5)
        assert seen[-2:] == ["team-a", "team-b"] and inf.get(None, "team-b") is not None
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_selector_informer_sees_objects_leave() -> None:
    store = Store()
    store.create(
        "pods", {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c"}]}}, namespace="default"
    )
    rec = Recorder()
    inf = Informer(LocalKubeApi(store), "pods", field_selector="spec.nodeName=n1", on_event=rec)
    task = asyncio.create_task(inf.run())
    try:
        await asyncio.wait_for(inf.synced.wait(), 5)
        store.bind("default", "p", node="n1")
        assert await rec.wait_for(1) == [("ADDED", "p")]
        assert inf.get("default", "p")["spec"]["nodeName"] == "n1"  # type: ignore[index]
        store.delete("pods", "p", namespace="default")
        # marked with grace 0 (deletionTimestamp), then gone, as kube-apiserver deletes a pod
        assert await rec.wait_for(3) == [("ADDED", "p"), ("MODIFIED", "p"), ("DELETED", "p")]
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


class QuietApi(LocalKubeApi):
    """Counts watches; with nothing changing, each one ends quietly at its ``timeout_s``."""

    def __init__(self, store: Store) -> None:
        super().__init__(store)
        self.watches = 0
        self.enough = asyncio.Event()

    async def watch(self, kind: Kind, **kw: Any) -> AsyncIterator[Any]:
        self.watches += 1
        if self.watches >= 4:
            self.enough.set()
        async for event in super().watch(kind, **kw):
            yield event


async def test_quiet_watches_that_time_out_do_not_grow_the_backoff() -> None:
    api = QuietApi(Store())
    # back-off would be 10 s per round if quiet ends counted as failures; 4 rounds finish at once
    inf = Informer(
        api, "nodes", watch_timeout_s=0.02, quiet_watch_s=0.01, backoff_initial_s=10.0, backoff_max_s=10.0
    )
    task = asyncio.create_task(inf.run())
    try:
        await asyncio.wait_for(api.enough.wait(), 5)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_transform_applies_to_listed_and_watched_objects_before_caching() -> None:
    store = Store()
    store.create("nodes", {"metadata": {"name": "n1", "labels": {"big": "x" * 1000}}})

    def strip(obj: dict[str, Any]) -> dict[str, Any]:
        meta = obj["metadata"]
        return {"metadata": {"name": meta["name"], "resourceVersion": meta["resourceVersion"]}}

    rec = Recorder()
    inf = Informer(LocalKubeApi(store), "nodes", on_event=rec, transform=strip)
    task = asyncio.create_task(inf.run())
    try:
        await asyncio.wait_for(inf.synced.wait(), 5)
        store.create("nodes", {"metadata": {"name": "n2", "labels": {"big": "y"}}})
        store.delete("nodes", "n1")
        assert await rec.wait_for(3) == [("ADDED", "n1"), ("ADDED", "n2"), ("DELETED", "n1")]
        assert all("labels" not in c.object["metadata"] for c in rec.changes)
        assert inf.get(None, "n2") == {
            "metadata": {
                "name": "n2",
                "resourceVersion": store.get("nodes", "n2")["metadata"]["resourceVersion"],
            }
        }
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_relist_after_gone_splits_a_recreated_name_into_delete_and_add(
    running: tuple[Store, Recorder, Informer],
) -> None:
    store, rec, inf = running
    await rec.wait_for(1)
    old_uid = inf.get(None, "n1")["metadata"]["uid"]  # type: ignore[index]
    store.close_watchers()
    # while disconnected: n1 is deleted and re-created (a new uid), and the history forgets both
    store.delete("nodes", "n1")
    store.create("nodes", node("n1"))
    for i in range(6):
        store.create("nodes", node(f"m{i}"))
    await rec.wait_for(9)
    n1_changes = [
        (c.type, c.object["metadata"]["uid"]) for c in rec.changes[1:] if c.object["metadata"]["name"] == "n1"
    ]
    new_uid = inf.get(None, "n1")["metadata"]["uid"]  # type: ignore[index]
    assert inf.relists == 2 and new_uid != old_uid
    assert n1_changes == [("DELETED", old_uid), ("ADDED", new_uid)]


class BurstApi(LocalKubeApi):
    """Its watch hands over ``burst`` events already read (no wait between them), then goes quiet."""

    def __init__(self, store: Store, burst: int) -> None:
        super().__init__(store)
        self.burst = burst

    async def watch(self, kind: Kind, **kw: Any) -> AsyncIterator[Any]:
        for i in range(self.burst):
            yield WatchEvent("ADDED", {"metadata": {"name": f"b{i}", "resourceVersion": str(100 + i)}})
        await asyncio.Event().wait()


@pytest.mark.parametrize(("yield_after_s", "applied_first"), [(0.0, 1), (3600.0, 50)])
async def test_a_burst_of_watch_events_gives_the_loop_a_turn_every_yield_after_s(
    yield_after_s: float, applied_first: int
) -> None:
    """A /filter that arrives while a watch applies a burst of buffered events waits for at most
    ``yield_after_s`` of it: the loop gets a turn. A turn given only at the burst's end is the
    behaviour without it (the second case)."""
    loop = asyncio.get_running_loop()
    applied: list[str] = []
    seen_by_other: list[int] = []
    done = asyncio.Event()

    def check() -> None:
        if len(applied) == 50 and seen_by_other:
            done.set()

    def other() -> None:
        seen_by_other.append(len(applied))
        check()

    def on_event(change: Change) -> None:
        applied.append(change.object["metadata"]["name"])
        if len(applied) == 1:  # something else becomes ready as the burst starts
            loop.call_soon(other)
        check()

    inf = Informer(BurstApi(Store(), 50), "nodes", on_event=on_event, yield_after_s=yield_after_s)
    task = asyncio.create_task(inf.run())
    try:
        await asyncio.wait_for(done.wait(), 5)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert seen_by_other == [applied_first]
    assert applied == [f"b{i}" for i in range(50)]  # in order, none lost
    assert inf.resource_version == "149"
