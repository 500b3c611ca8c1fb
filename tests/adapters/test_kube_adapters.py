"""The production adapters against the emulated API server over real HTTP(S): ``OfficialKubeApi``
(the official client on threads), ``AioKubeApi`` configured by the official client's loader
(``aio_from_kubeconfig``) and ``OffloadedKubeApi`` (its writes and watches made by a child process
that loads the same kubeconfig), through the same contract."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import pathlib
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest
import trustme
from vgpu.core import errors
from vgpu.kube import aioapi, offload
from vgpu.kube.client import OfficialKubeApi, aio_from_kubeconfig
from vgpu.kube.informer import Change, Informer
from vgpu.kube.port import WatchEvent
from vgpu.localcluster.apiserver import ApiServer
from vgpu.localcluster.store import Store

from tests.adapters import offload_factories
from tests.scheduler.gated import GatedApiServer


def pod(name: str, **labels: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": labels},
        "spec": {"containers": [{"name": "c", "image": "i"}]},
    }


Api = OfficialKubeApi | aioapi.AioKubeApi | offload.OffloadedKubeApi
ADAPTERS = ["threads", "asyncio", "offloaded"]


def connect(adapter: str, kubeconfig: pathlib.Path, *, request_timeout_s: float = 30.0) -> Api:
    if adapter == "threads":
        return OfficialKubeApi.from_kubeconfig(str(kubeconfig), request_timeout_s=request_timeout_s)
    aio = functools.partial(
        aio_from_kubeconfig, str(kubeconfig), user_agent="test/1", request_timeout_s=request_timeout_s
    )
    if adapter == "offloaded":  # its writes and watches in the child (scheduler.apiWatches: process)
        return offload.OffloadedKubeApi(aio(), aio, watches=True)
    return aio()


@pytest.fixture(params=ADAPTERS)
async def env(
    tmp_path: pathlib.Path, request: pytest.FixtureRequest
) -> AsyncIterator[tuple[Store, ApiServer, Api]]:
    store = Store(history_size=20)
    server = ApiServer(store)
    await server.start()
    api = connect(request.param, server.write_kubeconfig(tmp_path / "kc"))
    try:
        if isinstance(api, offload.OffloadedKubeApi):
            # its child first: a fresh interpreter's imports (seconds on a loaded machine) are not
            # what the tests' waits measure (test_offload.py tests the start)
            await api.start()
        yield store, server, api
    finally:
        await api.close()
        await server.stop()


async def test_crud_round_trip_as_wire_dicts(env: tuple[Store, ApiServer, Api]) -> None:
    _, _, api = env
    created = await api.create("pods", pod("a", app="web"), namespace="default")
    assert created["metadata"]["labels"] == {"app": "web"} and created["kind"] == "Pod"
    got = await api.get("pods", "a", namespace="default")
    assert got["metadata"]["uid"] == created["metadata"]["uid"]
    listed = await api.list("pods", namespace="default", label_selector="app=web")
    assert [p["metadata"]["name"] for p in listed.items] == ["a"]
    assert listed.items[0]["kind"] == "Pod" and listed.resource_version
    patched = await api.merge_patch(
        "pods", "a", {"metadata": {"annotations": {"hami.io/x": "1"}}}, namespace="default"
    )
    assert patched["metadata"]["annotations"] == {"hami.io/x": "1"}
    with pytest.raises(errors.Conflict):
        await api.replace("pods", got, namespace="default")  # stale resourceVersion
    with pytest.raises(errors.Conflict):
        await api.create("pods", pod("a"), namespace="default")
    with pytest.raises(errors.Conflict):
        await api.merge_patch(
            "pods",
            "a",
            {"metadata": {"resourceVersion": got["metadata"]["resourceVersion"]}},
            namespace="default",
        )
    await api.delete("pods", "a", namespace="default")
    with pytest.raises(errors.NotFound) as exc:
        await api.get("pods", "a", namespace="default")
    assert exc.value.status == 404 and exc.value.reason == "NotFound"
    with pytest.raises(errors.KubeError) as bad:
        await api.create("pods", {"metadata": {"name": "NO"}}, namespace="default")
    assert bad.value.status == 422


async def test_graceful_delete_and_disruption_budgets(env: tuple[Store, ApiServer, Api]) -> None:
    store, _, api = env
    body = pod("g")
    body["spec"]["nodeName"] = "n1"
    await api.create("pods", body, namespace="default")
    await api.delete("pods", "g", namespace="default", grace_period_s=20)
    marked = await api.get("pods", "g", namespace="default")
    assert marked["metadata"]["deletionGracePeriodSeconds"] == 20
    await api.delete("pods", "g", namespace="default", grace_period_s=0)
    with pytest.raises(errors.NotFound):
        await api.get("pods", "g", namespace="default")
    budget = {"metadata": {"name": "web"}, "spec": {"selector": {"matchLabels": {"app": "web"}}}}
    store.create("poddisruptionbudgets", budget, namespace="default")
    listed = await api.list("poddisruptionbudgets", namespace="default")
    assert [b["metadata"]["name"] for b in listed.items] == ["web"]


async def test_bind_lease_and_event(env: tuple[Store, ApiServer, Api]) -> None:
    store, _, api = env
    p = await api.create("pods", pod("a"), namespace="default")
    with pytest.raises(errors.Conflict):
        await api.bind_pod("default", "a", node="n1", uid="not-the-uid")
    await api.bind_pod("default", "a", node="n1", uid=p["metadata"]["uid"])
    assert store.get("pods", "a", namespace="default")["spec"]["nodeName"] == "n1"
    with pytest.raises(errors.Conflict):
        await api.bind_pod("default", "a", node="n2")
    await api.create_event(namespace="default", involved=p, reason="Bound", message="to n1")
    [ev] = (await api.list("events", namespace="default")).items
    assert ev["involvedObject"]["name"] == "a" and ev["message"] == "to n1"
    lease = await api.create(
        "leases", {"metadata": {"name": "l"}, "spec": {"holderIdentity": "me"}}, namespace="kube-system"
    )
    assert lease["apiVersion"] == "coordination.k8s.io/v1"
    lease["spec"]["holderIdentity"] = "you"
    assert (await api.replace("leases", lease, namespace="kube-system"))["spec"]["holderIdentity"] == "you"


async def test_binding_annotations_land_on_the_pod_in_the_same_write(
    env: tuple[Store, ApiServer, Api],
) -> None:
    store, _, api = env
    created = await api.create(
        "pods", {**pod("a"), "metadata": {"name": "a", "annotations": {"mine": "kept"}}}, namespace="default"
    )
    await api.bind_pod("default", "a", node="n1", annotations={"hami.io/vgpu-node": "n1", "mine": "theirs"})
    got = store.get("pods", "a", namespace="default")
    assert got["spec"]["nodeName"] == "n1"
    assert got["metadata"]["annotations"] == {"mine": "theirs", "hami.io/vgpu-node": "n1"}
    assert int(got["metadata"]["resourceVersion"]) == int(created["metadata"]["resourceVersion"]) + 1
    await api.create("pods", pod("b"), namespace="default")
    with pytest.raises(errors.KubeError) as bad:  # garbage annotations: refused, nothing written
        await api.bind_pod("default", "b", node="n1", annotations={"k": 5})  # type: ignore[dict-item]
    assert bad.value.status in (400, 422)
    assert "nodeName" not in store.get("pods", "b", namespace="default")["spec"]


async def test_watch_streams_events_and_ends_at_timeout(
    env: tuple[Store, ApiServer, Api],
) -> None:
    store, _, api = env
    rv = store.resource_version
    store.create("nodes", {"metadata": {"name": "n1"}})
    store.delete("nodes", "n1")
    got: list[WatchEvent] = [e async for e in api.watch("nodes", resource_version=rv, timeout_s=1)]
    assert [(e.type, e.object["metadata"]["name"]) for e in got] == [("ADDED", "n1"), ("DELETED", "n1")]


async def test_watch_applies_the_transform_where_it_decodes(env: tuple[Store, ApiServer, Api]) -> None:
    """Each event's object comes out transformed; with the offloaded adapter the transform ran in
    its child, which decodes the stream (the transform says which process ran it)."""
    store, _, api = env
    rv = store.resource_version
    store.create("nodes", {"metadata": {"name": "n1", "annotations": {"a": "1"}}})
    store.delete("nodes", "n1")
    got = [
        e
        async for e in api.watch(
            "nodes", resource_version=rv, timeout_s=1, transform=offload_factories.tag_pid
        )
    ]
    assert [e.type for e in got] == ["ADDED", "DELETED"]
    ran_in = {e.object["metadata"]["annotations"]["pid"] for e in got}
    child = api.writer_pid if isinstance(api, offload.OffloadedKubeApi) else None
    assert ran_in == {str(child or os.getpid())}
    assert all(e.object["metadata"]["annotations"]["a"] == "1" for e in got)


@pytest.mark.parametrize("adapter", ADAPTERS)
@pytest.mark.parametrize("gone_as_http", [False, True], ids=["error-event", "http-410"])
async def test_watch_too_old_raises_gone(tmp_path: pathlib.Path, gone_as_http: bool, adapter: str) -> None:
    store = Store(history_size=1)
    old = store.resource_version
    for i in range(3):
        store.create("nodes", {"metadata": {"name": f"n{i}"}})
    async with ApiServer(store, watch_gone_as_http=gone_as_http) as server:
        api = connect(adapter, server.write_kubeconfig(tmp_path / "kc"))
        try:
            with pytest.raises(errors.Gone):
                async for _ in api.watch("nodes", resource_version=old):
                    pass
        finally:
            await api.close()


async def test_cancelling_a_watch_is_prompt_and_frees_the_server_side(
    env: tuple[Store, ApiServer, Api],
) -> None:
    store, _, api = env
    first = asyncio.Event()

    async def consume() -> None:
        async for _ in api.watch("nodes", resource_version="0"):
            first.set()

    store.create("nodes", {"metadata": {"name": "n1"}})
    task = asyncio.create_task(consume())
    await asyncio.wait_for(first.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 5)
    await asyncio.wait_for(asyncio.gather(*(w.ended.wait() for w in store.watchers)), 5)
    assert store.watcher_count == 0


@pytest.mark.parametrize("adapter", ADAPTERS)
async def test_unreachable_server_is_kube_error_status_0(tmp_path: pathlib.Path, adapter: str) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = ApiServer(Store())
    server.url = f"http://127.0.0.1:{port}"  # nothing listens there
    api = connect(adapter, server.write_kubeconfig(tmp_path / "kc"), request_timeout_s=2)
    if isinstance(api, OfficialKubeApi):
        api._client.configuration.retries = 0
    try:
        with pytest.raises(errors.KubeError) as exc:
            await api.get("nodes", "n1")
        assert exc.value.status == 0
    finally:
        await api.close()


async def test_informer_over_http_relists_after_gone_and_resumes(
    env: tuple[Store, ApiServer, Api],
) -> None:
    store, _, api = env
    store.create("nodes", {"metadata": {"name": "n1"}})
    seen: list[tuple[str, str]] = []
    cond = asyncio.Condition()

    async def record(change: Change) -> None:
        async with cond:
            seen.append((change.type, change.object["metadata"]["name"]))
            cond.notify_all()

    async def wait_len(n: int) -> None:
        async with asyncio.timeout(10), cond:
            await cond.wait_for(lambda: len(seen) >= n)

    inf = Informer(api, "nodes", on_event=record, backoff_initial_s=0.01)
    task = asyncio.create_task(inf.run())
    try:
        await asyncio.wait_for(inf.synced.wait(), 10)
        await wait_len(1)
        # the server drops every watch; a change made meanwhile arrives through the resumed watch
        await asyncio.wait_for(asyncio.gather(*(w.ended.wait() for w in _close_all(store))), 5)
        store.create("nodes", {"metadata": {"name": "n2"}})
        await wait_len(2)
        assert inf.relists == 1
        # drop again and let the history forget a deletion: the relist reports it
        await asyncio.wait_for(asyncio.gather(*(w.ended.wait() for w in _close_all(store))), 5)
        store.delete("nodes", "n1")
        for i in range(25):
            store.create("nodes", {"metadata": {"name": f"m{i}"}})
        await wait_len(2 + 1 + 25)
        assert ("DELETED", "n1") in seen and inf.relists == 2 and inf.get(None, "n1") is None
        assert len(inf) == 26
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


def _close_all(store: Store) -> tuple[Any, ...]:
    watchers = store.watchers
    store.close_watchers()
    return watchers


@pytest.mark.parametrize("adapter", ADAPTERS)
async def test_tls_and_token_through_kubeconfig(tmp_path: pathlib.Path, adapter: str) -> None:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    cert.cert_chain_pems[0].write_to_path(str(tmp_path / "c.pem"))
    cert.private_key_pem.write_to_path(str(tmp_path / "k.pem"))
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    server = ApiServer(
        Store(),
        tls_cert=str(tmp_path / "c.pem"),
        tls_key=str(tmp_path / "k.pem"),
        tls_ca=str(tmp_path / "ca.pem"),
        token="t0k",
    )
    async with server:
        api = connect(adapter, server.write_kubeconfig(tmp_path / "kc"))
        try:
            await api.create("nodes", {"metadata": {"name": "n1"}})
            assert [n["metadata"]["name"] for n in (await api.list("nodes")).items] == ["n1"]
        finally:
            await api.close()
        server.auth.token = "rotated"  # the old token is now refused
        api = connect(adapter, tmp_path / "kc")
        try:
            with pytest.raises(errors.KubeError) as exc:
                await api.list("nodes")
            assert exc.value.status == 401
        finally:
            await api.close()


async def test_watches_never_take_a_worker_from_the_api_calls(tmp_path: pathlib.Path) -> None:
    # one API worker and five open watches (the scheduler's informers): calls still go through
    store = Store()
    server = ApiServer(store)
    await server.start()
    api = OfficialKubeApi.from_kubeconfig(str(server.write_kubeconfig(tmp_path / "kc")), api_workers=1)
    streams = [
        api.watch(kind, resource_version="") for kind in ("pods", "nodes", "leases", "namespaces", "events")
    ]
    try:
        firsts = [asyncio.ensure_future(anext(aiter(s))) for s in streams]
        store.create("pods", pod("a"), namespace="default")
        event = await asyncio.wait_for(firsts[0], 20)  # the pods watch is open and streaming
        assert event.object["metadata"]["name"] == "a"
        got = await asyncio.wait_for(api.get("pods", "a", namespace="default"), 20)
        assert got["metadata"]["name"] == "a"
        assert api.pool.busy == 0 and api.pool.queued == 0
        for pending in firsts[1:]:
            pending.cancel()
        await asyncio.gather(*firsts[1:], return_exceptions=True)
    finally:
        for stream in streams:
            await stream.aclose()  # type: ignore[attr-defined]
        await api.close()
        await server.stop()


async def test_asyncio_adapter_reads_a_rotated_token_again_after_a_401() -> None:
    # the token source stands for the official client's refresh hook (an in-cluster token file
    # that kubelet rotates): read at most every refresh_s, and at once after a 401
    store = Store()
    reads: list[str] = []
    token = {"now": "t0k"}

    def source() -> str:
        reads.append(token["now"])
        return f"Bearer {token['now']}"

    async with ApiServer(store, token="t0k") as server:
        creds = aioapi.Credentials(source=source, refresh_s=3600)
        async with aioapi.AioKubeApi(server.url, credentials=creds) as api:
            await api.create("nodes", {"metadata": {"name": "n1"}})
            await api.get("nodes", "n1")
            assert reads == ["t0k"]  # cached within refresh_s
            server.auth.token = token["now"] = "rotated"
            got = await api.get("nodes", "n1")  # 401 with the old one, then again with the new
            assert got["metadata"]["name"] == "n1" and reads == ["t0k", "rotated"]
            server.auth.token = "revoked"  # the source has nothing newer: the 401 stands, after one retry
            with pytest.raises(errors.KubeError) as exc:
                await api.get("nodes", "n1")
            assert exc.value.status == 401 and reads == ["t0k", "rotated", "rotated"]


async def test_asyncio_adapter_credentials_refresh_on_schedule_and_report_a_failing_source() -> None:
    now = [0.0]
    calls: list[float] = []

    def source() -> str | None:
        calls.append(now[0])
        if now[0] >= 30:
            raise RuntimeError("exec plugin exited with 1")
        return None if now[0] >= 20 else "Bearer a"

    creds = aioapi.Credentials(source=source, refresh_s=10, clock=lambda: now[0])
    assert await creds.header() == "Bearer a"
    now[0] = 9.9
    assert await creds.header() == "Bearer a" and calls == [0.0]
    now[0] = 20
    assert await creds.header() is None and calls == [0.0, 20]  # no token any more: no header
    now[0] = 30
    with pytest.raises(errors.KubeError, match="exec plugin exited with 1"):
        await creds.header()
    assert not aioapi.Credentials(header="Bearer x").refreshable


async def test_asyncio_adapter_caps_and_counts_the_requests_in_flight_for_readiness_and_metrics() -> None:
    store = Store()
    server = GatedApiServer(store, hold=lambda method, path, query: method == "GET" and path.endswith("/n1"))
    await server.start()
    now = [100.0]
    try:
        store.create("nodes", {"metadata": {"name": "n1"}})
        async with aioapi.AioKubeApi(server.url, max_in_flight=2, clock=lambda: now[0]) as api:
            held = [asyncio.ensure_future(api.get("nodes", "n1")) for _ in range(3)]
            while server.held < 2:  # woken by each held arrival, never by time
                server.another.clear()
                await asyncio.wait_for(server.another.wait(), 10)
            now[0] = 107.5  # the third reached the cap on its first step, long before two arrived
            assert (api.busy, api.queued, api.oldest_wait_s()) == (2, 1, 7.5)
            assert server.held == 2  # the cap held the third back: two connections, not three
            server.gate.set()
            assert [n["metadata"]["name"] for n in await asyncio.gather(*held)] == ["n1"] * 3
            assert (api.busy, api.queued, api.oldest_wait_s()) == (0, 0, 0.0)
        async with aioapi.AioKubeApi(server.url) as uncapped:  # no cap: nothing ever waits
            server.gate.clear()
            held = [asyncio.ensure_future(uncapped.get("nodes", "n1")) for _ in range(3)]
            while server.held < 3:
                server.another.clear()
                await asyncio.wait_for(server.another.wait(), 10)
            assert (uncapped.busy, uncapped.queued, uncapped.oldest_wait_s()) == (3, 0, 0.0)
            server.gate.set()
            await asyncio.gather(*held)
    finally:
        await server.stop()


async def test_a_list_answer_over_a_mib_comes_back_whole(env: tuple[Store, ApiServer, Api]) -> None:
    # the asyncio adapter decodes such an answer in a thread (DECODE_OFF_LOOP_BYTES), off the loop
    store, _, api = env
    filler = "x" * 8192
    for i in range(200):
        store.create(
            "pods",
            {**pod(f"p{i:03d}"), "metadata": {"name": f"p{i:03d}", "annotations": {"a": filler}}},
            namespace="default",
        )
    listed = await api.list("pods", namespace="default")
    assert len(json.dumps(listed.items)) > aioapi.DECODE_OFF_LOOP_BYTES
    assert [p["metadata"]["name"] for p in listed.items] == [f"p{i:03d}" for i in range(200)]
    assert all(p["metadata"]["annotations"]["a"] == filler and p["kind"] == "Pod" for p in listed.items)
