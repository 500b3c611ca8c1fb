# mypy: disable-error-code="union-attr,no-untyped-call,arg-type,index"
# (the official client's models make every field Optional; these tests read them directly)
"""The emulated API server driven by the official ``kubernetes`` client, unchanged, over real HTTP."""

from __future__ import annotations

import asyncio
import json
import pathlib
import urllib.request
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

import kubernetes
import pytest
from kubernetes.client.exceptions import ApiException
from vgpu.localcluster.apipaths import parse_path
from vgpu.localcluster.apiserver import ApiServer
from vgpu.localcluster.store import Store

T = TypeVar("T")


class Cluster:
    def __init__(self, store: Store, server: ApiServer, client: Any) -> None:
        self.store = store
        self.server = server
        self.client = client
        self.core = kubernetes.client.CoreV1Api(client)
        self.coord = kubernetes.client.CoordinationV1Api(client)

    async def call(self, fn: Callable[..., T], *args: Any, **kw: Any) -> T:
        """Run a blocking client call off the loop that serves it."""
        return await asyncio.to_thread(fn, *args, **kw)

    async def raw(self, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        resp = await asyncio.to_thread(fn, *args, _preload_content=False, **kw)
        return json.loads(resp.data)


@pytest.fixture
async def cluster(tmp_path: pathlib.Path) -> AsyncIterator[Cluster]:
    store = Store(history_size=50)
    server = ApiServer(store)
    await server.start()
    path = server.write_kubeconfig(tmp_path / "kubeconfig")
    client = kubernetes.config.new_client_from_config(config_file=str(path))
    try:
        yield Cluster(store, server, client)
    finally:
        await asyncio.to_thread(client.close)
        await server.stop()


def pod_body(name: str, **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]},
    }


async def test_pod_crud_with_typed_models(cluster: Cluster) -> None:
    core = cluster.core
    created = await cluster.call(core.create_namespaced_pod, "default", pod_body("a", app="web"))
    assert created.metadata.uid and created.metadata.resource_version and created.status.phase == "Pending"
    got = await cluster.call(core.read_namespaced_pod, "a", "default")
    assert got.metadata.labels == {"app": "web"} and got.spec.containers[0].image == "busybox"
    listed = await cluster.call(core.list_namespaced_pod, "default")
    assert [p.metadata.name for p in listed.items] == ["a"]
    assert int(listed.metadata.resource_version) >= int(created.metadata.resource_version)
    got.metadata.labels["tier"] = "front"
    replaced = await cluster.call(core.replace_namespaced_pod, "a", "default", got)
    assert replaced.metadata.labels == {"app": "web", "tier": "front"}
    await cluster.call(core.delete_namespaced_pod, "a", "default")
    with pytest.raises(ApiException) as exc:
        await cluster.call(core.read_namespaced_pod, "a", "default")
    assert exc.value.status == 404
    status = json.loads(exc.value.body)
    assert (
        status["kind"] == "Status"
        and status["reason"] == "NotFound"
        and 'pods "a" not found' in status["message"]
    )


async def test_already_exists_and_stale_update_are_409(cluster: Cluster) -> None:
    core = cluster.core
    await cluster.call(core.create_node, {"metadata": {"name": "n1"}})
    with pytest.raises(ApiException) as exc:
        await cluster.call(core.create_node, {"metadata": {"name": "n1"}})
    assert exc.value.status == 409 and json.loads(exc.value.body)["reason"] == "AlreadyExists"
    node = await cluster.call(core.read_node, "n1")
    await cluster.call(core.patch_node, "n1", {"metadata": {"labels": {"x": "1"}}})
    with pytest.raises(ApiException) as exc:
        await cluster.call(core.replace_node, "n1", node)  # carries the old resourceVersion
    assert exc.value.status == 409 and "the object has been modified" in json.loads(exc.value.body)["message"]


@pytest.mark.parametrize(
    ("content_type", "patch", "labels"),
    [
        (
            "application/merge-patch+json",
            {"metadata": {"labels": {"a": None, "b": "2"}}},
            {"b": "2", "keep": "k"},
        ),
        ("application/strategic-merge-patch+json", {"metadata": {"labels": {"a": None}}}, {"keep": "k"}),
        (
            "application/json-patch+json",
            [
                {"op": "test", "path": "/metadata/labels/a", "value": "1"},
                {"op": "add", "path": "/metadata/labels/hami.io~1x", "value": "y"},
                {"op": "remove", "path": "/metadata/labels/keep"},
            ],
            {"a": "1", "hami.io/x": "y"},
        ),
    ],
    ids=["merge", "strategic", "json"],
)
async def test_patch_kinds(cluster: Cluster, content_type: str, patch: Any, labels: dict[str, str]) -> None:
    core = cluster.core
    await cluster.call(core.create_node, {"metadata": {"name": "n1", "labels": {"a": "1", "keep": "k"}}})
    out = await cluster.raw(core.patch_node, "n1", patch, _content_type=content_type)
    assert out["metadata"]["labels"] == labels


async def test_strategic_merge_merges_containers_by_name(cluster: Cluster) -> None:
    core = cluster.core
    await cluster.call(core.create_namespaced_pod, "default", pod_body("a"))
    patch = {"spec": {"containers": [{"name": "main", "env": [{"name": "X", "value": "1"}]}]}}
    out = await cluster.raw(core.patch_namespaced_pod, "a", "default", patch)  # the client defaults to SMP
    assert out["spec"]["containers"] == [
        {"name": "main", "image": "busybox", "env": [{"name": "X", "value": "1"}]}
    ]


async def test_failed_json_patch_test_op_is_422_and_changes_nothing(cluster: Cluster) -> None:
    core = cluster.core
    await cluster.call(core.create_node, {"metadata": {"name": "n1", "labels": {"a": "1"}}})
    before = cluster.store.get("nodes", "n1")
    with pytest.raises(ApiException) as exc:
        await cluster.call(
            core.patch_node,
            "n1",
            [
                {"op": "test", "path": "/metadata/labels/a", "value": "2"},
                {"op": "remove", "path": "/metadata/labels"},
            ],
            _content_type="application/json-patch+json",
        )
    assert exc.value.status == 422
    assert cluster.store.get("nodes", "n1") == before


async def test_binding_and_status_subresources(cluster: Cluster) -> None:
    core = cluster.core
    await cluster.call(core.create_namespaced_pod, "default", pod_body("a"))
    binding = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": "a"},
        "target": {"kind": "Node", "name": "n1"},
    }
    await cluster.raw(core.create_namespaced_pod_binding, "a", "default", binding)
    pod = await cluster.call(core.read_namespaced_pod, "a", "default")
    assert pod.spec.node_name == "n1" and pod.status.conditions[0].type == "PodScheduled"
    with pytest.raises(ApiException) as exc:
        await cluster.raw(core.create_namespaced_binding, "default", binding)  # the legacy bindings path
    assert exc.value.status == 409
    out = await cluster.raw(
        core.patch_namespaced_pod_status, "a", "default", {"status": {"phase": "Running"}}
    )
    assert out["status"]["phase"] == "Running"
    # the main resource ignores status writes, as upstream
    out = await cluster.raw(
        core.patch_namespaced_pod,
        "a",
        "default",
        {"status": {"phase": "Failed"}},
        _content_type="application/merge-patch+json",
    )
    assert out["status"]["phase"] == "Running"
    await cluster.call(core.create_node, {"metadata": {"name": "n1"}})
    node = await cluster.raw(core.patch_node_status, "n1", {"status": {"capacity": {"nvidia.com/gpu": "4"}}})
    assert node["status"]["capacity"] == {"nvidia.com/gpu": "4"}


async def test_selectors_through_query_strings(cluster: Cluster) -> None:
    core = cluster.core
    await cluster.call(core.create_namespaced_pod, "default", pod_body("a", app="web"))
    await cluster.call(core.create_namespaced_pod, "kube-system", pod_body("b", app="db"))
    await cluster.call(
        core.create_namespaced_pod_binding,
        "a",
        "default",
        {"metadata": {"name": "a"}, "target": {"name": "n1"}},
        _preload_content=False,
    )

    async def names(**kw: Any) -> list[str]:
        out = await cluster.raw(core.list_pod_for_all_namespaces, **kw)
        return [p["metadata"]["name"] for p in out["items"]]

    assert await names(label_selector="app in (web,db)") == ["a", "b"]
    assert await names(label_selector="app!=web") == ["b"]
    assert await names(field_selector="spec.nodeName=n1") == ["a"]
    assert await names(field_selector="metadata.namespace=kube-system,status.phase=Pending") == ["b"]
    with pytest.raises(ApiException) as exc:
        await names(field_selector="spec.bogus=1")
    assert exc.value.status == 400


async def test_leases_events_quotas_namespaces(cluster: Cluster) -> None:
    lease = {
        "metadata": {"name": "vgpu-scheduler"},
        "spec": {"holderIdentity": "me", "leaseDurationSeconds": 15},
    }
    created = await cluster.raw(cluster.coord.create_namespaced_lease, "kube-system", lease)
    assert created["apiVersion"] == "coordination.k8s.io/v1" and created["kind"] == "Lease"
    got = await cluster.call(cluster.coord.read_namespaced_lease, "vgpu-scheduler", "kube-system")
    assert got.spec.holder_identity == "me"
    ns = await cluster.raw(
        cluster.core.create_namespace, {"metadata": {"name": "team-a", "labels": {"gpu": "yes"}}}
    )
    assert ns["metadata"]["labels"]["kubernetes.io/metadata.name"] == "team-a"
    quota = {"metadata": {"name": "q"}, "spec": {"hard": {"limits.nvidia.com/gpu": "4"}}}
    await cluster.raw(cluster.core.create_namespaced_resource_quota, "team-a", quota)
    quotas = await cluster.call(cluster.core.list_resource_quota_for_all_namespaces)
    assert [q.metadata.name for q in quotas.items] == ["q"]
    event = {
        "metadata": {"name": "e1"},
        "involvedObject": {"kind": "Pod", "name": "p"},
        "reason": "X",
        "message": "m",
    }
    await cluster.raw(cluster.core.create_namespaced_event, "team-a", event)
    events = await cluster.call(
        cluster.core.list_namespaced_event, "team-a", field_selector="involvedObject.name=p"
    )
    assert [e.reason for e in events.items] == ["X"]


@pytest.mark.parametrize(
    "case",
    [
        ("POST", "/api/v1/namespaces/default/pods", b"{not json", {}, 400),
        ("POST", "/api/v1/namespaces/default/pods", b"[1,2]", {}, 400),
        ("POST", "/api/v1/namespaces/default/pods", b'{"metadata": {"name": "UPPER"}}', {}, 422),
        ("POST", "/api/v1/namespaces/default/pods", b'{"metadata": 5}', {}, 422),
        ("PATCH", "/api/v1/nodes/n0", b"{}", {"Content-Type": "text/plain"}, 415),
        ("PATCH", "/api/v1/nodes/n0", b'{"op": "add"}', {"Content-Type": "application/json-patch+json"}, 400),
        ("PATCH", "/api/v1/nodes/n0", b"[{}]", {"Content-Type": "application/json-patch+json"}, 400),
        ("PATCH", "/api/v1/nodes/n0", b"\xff\xfe", {"Content-Type": "application/merge-patch+json"}, 400),
        ("PUT", "/api/v1/nodes/n0", b'{"metadata": {"name": "other"}}', {}, 400),
        ("GET", "/api/v1/deployments", b"", {}, 404),
        ("GET", "/api/v1/namespaces/default/nodes/x", b"", {}, 404),
        ("GET", "/api/v1/pods?watch=1&timeoutSeconds=abc", b"", {}, 400),
        ("DELETE", "/api/v1/nodes", b"", {}, 405),
        ("DELETE", "/api/v1/nodes/n0", b'{"gracePeriodSeconds": -1}', {}, 400),
        ("DELETE", "/api/v1/nodes/n0", b'{"gracePeriodSeconds": "soon"}', {}, 400),
        ("POST", "/api/v1/namespaces/default/pods/p/binding", b'{"target": 3}', {}, 422),
    ],
    ids=lambda c: f"{c[0]} {c[1]} {c[2][:20]!r} -> {c[4]}",
)
async def test_garbage_requests_are_client_errors_not_500(
    cluster: Cluster, case: tuple[str, str, bytes, dict[str, str], int]
) -> None:
    method, path, body, headers, status = case
    cluster.store.create("nodes", {"metadata": {"name": "n0"}})

    def send() -> tuple[int, Any]:
        req = urllib.request.Request(
            cluster.server.url + path, data=body or None, method=method, headers=headers
        )
        try:
            with urllib.request.urlopen(req) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as err:
            with err:
                return err.code, json.loads(err.read())

    code, answer = await asyncio.to_thread(send)
    assert code == status, answer
    assert answer["kind"] == "Status" and answer["code"] == status and answer["message"]


async def test_delete_preconditions(cluster: Cluster) -> None:
    core = cluster.core
    await cluster.call(core.create_node, {"metadata": {"name": "n1"}})
    with pytest.raises(ApiException) as exc:
        await cluster.call(core.delete_node, "n1", body={"preconditions": {"uid": "wrong"}})
    assert exc.value.status == 409
    await cluster.call(core.delete_node, "n1")
    assert cluster.store.list("nodes").items == []


async def test_graceful_pod_delete_marks_then_grace_zero_removes(cluster: Cluster) -> None:
    core = cluster.core
    cluster.store.create("nodes", {"metadata": {"name": "n1"}})
    body = pod_body("p")
    body["spec"]["nodeName"] = "n1"
    await cluster.call(core.create_namespaced_pod, "default", body)
    options = kubernetes.client.V1DeleteOptions(grace_period_seconds=5)
    await cluster.call(core.delete_namespaced_pod, "p", "default", body=options)
    marked = cluster.store.get("pods", "p", namespace="default")
    assert marked["metadata"]["deletionGracePeriodSeconds"] == 5 and marked["metadata"]["deletionTimestamp"]
    zero = kubernetes.client.V1DeleteOptions(grace_period_seconds=0)
    await cluster.call(core.delete_namespaced_pod, "p", "default", body=zero)
    assert cluster.store.list("pods").items == []


async def test_discovery_and_version(cluster: Cluster) -> None:
    version = await cluster.call(kubernetes.client.VersionApi(cluster.client).get_code)
    assert version.major == "1"
    groups = await cluster.call(kubernetes.client.ApisApi(cluster.client).get_api_versions)
    assert "coordination.k8s.io" in [g.name for g in groups.groups]
    resources = await cluster.call(core_resources := cluster.core.get_api_resources)
    assert core_resources is not None
    assert {"pods", "pods/status", "nodes"} <= {r.name for r in resources.resources}


def test_parse_path_table() -> None:
    assert parse_path("/api/v1/nodes") is not None
    t = parse_path("/api/v1/namespaces/ns1/status")
    assert t is not None and t.info.plural == "namespaces" and t.name == "ns1" and t.subresource == "status"
    t = parse_path("/api/v1/namespaces/ns1/pods/p/binding")
    assert t is not None and (t.namespace, t.name, t.subresource) == ("ns1", "p", "binding")
    t = parse_path("/apis/coordination.k8s.io/v1/namespaces/x/leases/l")
    assert t is not None and t.info.plural == "leases"
    assert parse_path("/api/v1/pods/p") is None  # a namespaced object needs its namespace
    assert parse_path("/apis/apps/v1/namespaces/x/leases") is None  # wrong group
    assert parse_path("/api/v1/namespaces/x/nodes") is None  # nodes are cluster-scoped
