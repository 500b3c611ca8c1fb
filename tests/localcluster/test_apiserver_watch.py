# mypy: disable-error-code="union-attr,no-untyped-call,arg-type,index"
# (the official client's models make every field Optional; these tests read them directly)
"""Watches through the official client's ``watch.Watch``; TLS, bearer tokens and kubeconfig."""

from __future__ import annotations

import asyncio
import json
import pathlib
import ssl
import urllib.request
from collections.abc import AsyncIterator, Callable
from typing import Any

import kubernetes
import pytest
import trustme
from kubernetes.client.exceptions import ApiException
from vgpu.localcluster.apiserver import ApiServer
from vgpu.localcluster.store import Store


@pytest.fixture
async def served(tmp_path: pathlib.Path) -> AsyncIterator[tuple[Store, ApiServer, Any]]:
    store = Store(history_size=10)
    server = ApiServer(store, bookmark_interval_s=0.05)
    await server.start()
    client = kubernetes.config.new_client_from_config(
        config_file=str(server.write_kubeconfig(tmp_path / "kc"))
    )
    try:
        yield store, server, client
    finally:
        await asyncio.to_thread(client.close)
        await server.stop()


def collect(fn: Callable[..., Any], n: int, **kw: Any) -> list[dict[str, Any]]:
    """Stream with the official Watch until ``n`` events (or the stream ends); raw events."""
    w = kubernetes.watch.Watch()
    out: list[dict[str, Any]] = []
    for event in w.stream(fn, **kw):
        out.append({"type": event["type"], "object": event["raw_object"]})
        if len(out) >= n:
            w.stop()
    return out


def names(events: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(e["type"], e["object"]["metadata"].get("name", "")) for e in events]


async def test_watch_from_list_version_and_resume(served: tuple[Store, ApiServer, Any]) -> None:
    store, _, client = served
    core = kubernetes.client.CoreV1Api(client)
    store.create("nodes", {"metadata": {"name": "n1"}})
    listed = await asyncio.to_thread(core.list_node)
    rv = listed.metadata.resource_version
    store.patch("nodes", "n1", {"metadata": {"labels": {"a": "1"}}})
    store.create("nodes", {"metadata": {"name": "n2"}})
    store.delete("nodes", "n1")
    first = await asyncio.to_thread(collect, core.list_node, 1, resource_version=rv)
    assert names(first) == [("MODIFIED", "n1")]
    # resume from the last event seen: nothing is lost or repeated
    resumed_from = first[-1]["object"]["metadata"]["resourceVersion"]
    rest = await asyncio.to_thread(collect, core.list_node, 2, resource_version=resumed_from)
    assert names(rest) == [("ADDED", "n2"), ("DELETED", "n1")]


async def test_watch_sees_live_changes_with_selectors(served: tuple[Store, ApiServer, Any]) -> None:
    store, _, client = served
    core = kubernetes.client.CoreV1Api(client)
    rv = store.resource_version
    task = asyncio.create_task(
        asyncio.to_thread(
            collect,
            core.list_pod_for_all_namespaces,
            3,
            resource_version=rv,
            field_selector="spec.nodeName=n1",
        )
    )
    store.create(
        "pods", {"metadata": {"name": "other"}, "spec": {"containers": [{"name": "c"}]}}, namespace="default"
    )
    store.create(
        "pods", {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c"}]}}, namespace="default"
    )
    store.bind("default", "p", node="n1")
    store.delete("pods", "p", namespace="default")
    events = await asyncio.wait_for(task, 10)
    assert names(events) == [("ADDED", "p"), ("MODIFIED", "p"), ("DELETED", "p")]  # marked, then gone


async def test_watch_ends_at_timeout_seconds(served: tuple[Store, ApiServer, Any]) -> None:
    store, _, client = served
    core = kubernetes.client.CoreV1Api(client)
    events = await asyncio.to_thread(
        collect, core.list_node, 5, resource_version=store.resource_version, timeout_seconds=1
    )
    assert events == []


@pytest.mark.parametrize("gone_as_http", [False, True], ids=["error-event", "http-410"])
async def test_too_old_version_is_410_for_the_official_watch(
    tmp_path: pathlib.Path, gone_as_http: bool
) -> None:
    store = Store(history_size=2)
    old = store.resource_version
    for i in range(5):
        store.create("nodes", {"metadata": {"name": f"n{i}"}})
    async with ApiServer(store, watch_gone_as_http=gone_as_http) as server:
        client = kubernetes.config.new_client_from_config(
            config_file=str(server.write_kubeconfig(tmp_path / "kc"))
        )
        core = kubernetes.client.CoreV1Api(client)
        try:
            for kw in ({"timeout_seconds": 5}, {}):  # without a timeout the client retries once, then raises
                with pytest.raises(ApiException) as exc:
                    await asyncio.to_thread(collect, core.list_node, 1, resource_version=old, **kw)
                assert exc.value.status == 410
        finally:
            await asyncio.to_thread(client.close)


async def test_error_event_is_a_status_object(served: tuple[Store, ApiServer, Any]) -> None:
    store, server, _ = served
    old = store.resource_version
    for i in range(12):
        store.create("nodes", {"metadata": {"name": f"n{i}"}})

    def fetch() -> dict[str, Any]:
        with urllib.request.urlopen(f"{server.url}/api/v1/nodes?watch=true&resourceVersion={old}") as resp:
            return dict(json.loads(resp.readline()))

    event = await asyncio.to_thread(fetch)
    assert event["type"] == "ERROR"
    assert event["object"]["kind"] == "Status" and event["object"]["code"] == 410
    assert event["object"]["reason"] == "Expired" and "too old resource version" in event["object"]["message"]


async def test_bookmarks_when_allowed(served: tuple[Store, ApiServer, Any]) -> None:
    store, _, client = served
    core = kubernetes.client.CoreV1Api(client)
    store.create("nodes", {"metadata": {"name": "n1"}})
    events = await asyncio.to_thread(
        collect, core.list_node, 1, resource_version=store.resource_version, allow_watch_bookmarks=True
    )
    assert events[0]["type"] == "BOOKMARK"
    assert events[0]["object"]["metadata"]["resourceVersion"] == store.resource_version


async def test_client_disconnect_frees_the_server_watch(served: tuple[Store, ApiServer, Any]) -> None:
    store, _, client = served
    core = kubernetes.client.CoreV1Api(client)
    store.create("nodes", {"metadata": {"name": "n1"}})
    await asyncio.to_thread(collect, core.list_node, 1, resource_version="0")
    # the server notices the closed connection and ends its side of the watch
    await asyncio.wait_for(asyncio.gather(*(w.ended.wait() for w in store.watchers)), 5)
    assert store.watcher_count == 0


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


async def test_tls_and_bearer_token(tmp_path: pathlib.Path, ca: trustme.CA) -> None:
    cert = ca.issue_cert("127.0.0.1")
    cert_file, key_file, ca_file = tmp_path / "tls.crt", tmp_path / "tls.key", tmp_path / "ca.crt"
    cert.cert_chain_pems[0].write_to_path(str(cert_file))
    cert.private_key_pem.write_to_path(str(key_file))
    ca.cert_pem.write_to_path(str(ca_file))
    store = Store()
    server = ApiServer(
        store, tls_cert=str(cert_file), tls_key=str(key_file), tls_ca=str(ca_file), token="s3cret"
    )
    async with server:
        assert server.url.startswith("https://127.0.0.1:")
        client = kubernetes.config.new_client_from_config(
            config_file=str(server.write_kubeconfig(tmp_path / "kc"))
        )
        try:
            core = kubernetes.client.CoreV1Api(client)
            await asyncio.to_thread(core.create_node, {"metadata": {"name": "n1"}})
            nodes = await asyncio.to_thread(core.list_node)
            assert [n.metadata.name for n in nodes.items] == ["n1"]
        finally:
            await asyncio.to_thread(client.close)

        def without_token() -> int:
            ctx = ssl.create_default_context(cafile=str(ca_file))
            try:
                urllib.request.urlopen(f"{server.url}/api/v1/nodes", context=ctx)
            except urllib.error.HTTPError as err:
                with err:
                    assert json.loads(err.read())["reason"] == "Unauthorized"
                    return err.code
            return 200

        assert await asyncio.to_thread(without_token) == 401

        def untrusted() -> None:
            urllib.request.urlopen(f"{server.url}/version", context=ssl.create_default_context())

        with pytest.raises(urllib.error.URLError):
            await asyncio.to_thread(untrusted)


async def test_events_queued_together_arrive_whole_and_in_order_for_every_watcher(
    tmp_path: pathlib.Path,
) -> None:
    """A burst stored before two watches open: each watch gets every event, in order, although the
    server writes all queued events in one chunk and serialises each event once for both."""
    store = Store(history_size=1000)
    server = ApiServer(store)
    await server.start()
    client = kubernetes.config.new_client_from_config(
        config_file=str(server.write_kubeconfig(tmp_path / "kc"))
    )
    try:
        v1 = kubernetes.client.CoreV1Api(client)
        rv = store.list("nodes").resource_version
        for i in range(50):  # replayed into each watch's queue at once: they leave in one write
            store.create("nodes", {"metadata": {"name": f"n-{i}", "labels": {"i": str(i)}}})
        watches = [asyncio.to_thread(collect, v1.list_node, 50, resource_version=rv) for _ in range(2)]
        first, second = await asyncio.gather(*watches)
    finally:
        await asyncio.to_thread(client.close)
        await server.stop()
    assert names(first) == names(second) == [("ADDED", f"n-{i}") for i in range(50)]
    assert [e["object"]["metadata"]["labels"]["i"] for e in first] == [str(i) for i in range(50)]
    assert len(server.watches._lines) == 50  # one encoding per store event, shared by both watches
