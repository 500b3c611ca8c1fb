"""The local store's CRUD, concurrency, selectors, binding and status semantics."""

from __future__ import annotations

from typing import Any

import pytest
from vgpu.core import errors
from vgpu.localcluster import selectors
from vgpu.localcluster.store import Store


def pod(name: str, *, labels: dict[str, str] | None = None, node: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"metadata": {"name": name}, "spec": {"containers": [{"name": "c", "image": "x"}]}}
    if labels:
        body["metadata"]["labels"] = labels
    if node:
        body["spec"]["nodeName"] = node
    return body


def test_create_stamps_identity_and_increasing_resource_versions() -> None:
    store = Store()
    a = store.create("pods", pod("a"), namespace="default")
    b = store.create("pods", pod("b"), namespace="default")
    assert a["metadata"]["uid"] != b["metadata"]["uid"]
    assert int(b["metadata"]["resourceVersion"]) > int(a["metadata"]["resourceVersion"])
    assert a["metadata"]["namespace"] == "default" and a["kind"] == "Pod" and a["apiVersion"] == "v1"
    assert a["status"] == {"phase": "Pending"}
    assert a["spec"]["schedulerName"] == "default-scheduler"
    assert a["metadata"]["creationTimestamp"].endswith("Z")
    assert store.resource_version == b["metadata"]["resourceVersion"]


def test_returned_objects_are_copies() -> None:
    store = Store()
    a = store.create("pods", pod("a"), namespace="default")
    a["metadata"]["labels"] = {"hacked": "yes"}
    assert "labels" not in store.get("pods", "a", namespace="default")["metadata"]


def test_generate_name_gets_a_random_suffix() -> None:
    store = Store()
    obj = store.create(
        "pods",
        {"metadata": {"generateName": "job-"}, "spec": {"containers": [{"name": "c"}]}},
        namespace="default",
    )
    assert obj["metadata"]["name"].startswith("job-") and len(obj["metadata"]["name"]) == 9


def test_create_existing_is_already_exists_conflict() -> None:
    store = Store()
    store.create("nodes", {"metadata": {"name": "n1"}})
    with pytest.raises(errors.Conflict) as exc:
        store.create("nodes", {"metadata": {"name": "n1"}})
    assert exc.value.status == 409 and exc.value.reason == "AlreadyExists"
    assert 'nodes "n1" already exists' in str(exc.value)


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({"metadata": {}}, 422),
        ({"metadata": {"name": "Bad_Name"}}, 422),
        ({"metadata": {"name": "x", "labels": {"a": 1}}}, 422),
        ({"metadata": "nope"}, 422),
        ({"metadata": {"name": "x"}, "kind": "Node"}, 400),
        ({"metadata": {"name": "x", "namespace": "other"}}, 400),
        ([1, 2], 400),
        ({"metadata": {"name": "x"}, "spec": {"containers": []}}, 422),
        ({"metadata": {"name": "x"}, "spec": {"containers": [{"image": "i"}]}}, 422),
    ],
    ids=[
        "no-name",
        "bad-name",
        "label-not-string",
        "metadata-not-object",
        "wrong-kind",
        "ns-mismatch",
        "list",
        "no-containers",
        "container-without-name",
    ],
)
def test_garbage_bodies_are_client_errors(body: object, status: int) -> None:
    store = Store()
    with pytest.raises(errors.KubeError) as exc:
        store.create("pods", body, namespace="default")  # type: ignore[arg-type]
    assert exc.value.status == status


def test_stale_resource_version_is_conflict_on_update_and_patch() -> None:
    store = Store()
    created = store.create("nodes", {"metadata": {"name": "n1"}})
    store.patch("nodes", "n1", {"metadata": {"labels": {"a": "1"}}})
    stale = created
    stale["metadata"]["labels"] = {"b": "2"}
    with pytest.raises(errors.Conflict, match="the object has been modified"):
        store.update("nodes", stale)
    with pytest.raises(errors.Conflict):
        store.patch("nodes", "n1", {"metadata": {"resourceVersion": created["metadata"]["resourceVersion"]}})
    # an update without a resourceVersion is unconditional, as for pods and nodes upstream
    del stale["metadata"]["resourceVersion"]
    assert store.update("nodes", stale)["metadata"]["labels"] == {"b": "2"}


def test_update_keeps_status_and_status_subresource_changes_only_status() -> None:
    store = Store()
    store.create("nodes", {"metadata": {"name": "n1"}, "status": {"capacity": {"cpu": "4"}}})
    node = store.get("nodes", "n1")
    node["status"] = {"capacity": {"cpu": "99"}}
    node["metadata"]["labels"] = {"x": "y"}
    after = store.update("nodes", node)
    assert after["status"] == {"capacity": {"cpu": "4"}} and after["metadata"]["labels"] == {"x": "y"}
    node = store.get("nodes", "n1")
    node["status"] = {"capacity": {"cpu": "8"}}
    node["metadata"]["labels"] = {"ignored": "yes"}
    after = store.update("nodes", node, subresource="status")
    assert after["status"] == {"capacity": {"cpu": "8"}} and after["metadata"]["labels"] == {"x": "y"}
    patched = store.patch("nodes", "n1", {"status": {"allocatable": {"cpu": "2"}}}, subresource="status")
    assert patched["status"] == {"capacity": {"cpu": "8"}, "allocatable": {"cpu": "2"}}


def test_patch_cannot_change_identity() -> None:
    store = Store()
    store.create("nodes", {"metadata": {"name": "n1"}})
    with pytest.raises(errors.KubeError) as exc:
        store.patch(
            "nodes", "n1", [{"op": "replace", "path": "/metadata/uid", "value": "x"}], patch_type="json"
        )
    assert exc.value.status == 422


def test_delete_is_immediate_and_then_not_found() -> None:
    store = Store()
    store.create("pods", pod("a"), namespace="default")
    gone = store.delete("pods", "a", namespace="default")
    assert int(gone["metadata"]["resourceVersion"]) == int(store.resource_version)
    with pytest.raises(errors.NotFound, match='pods "a" not found'):
        store.get("pods", "a", namespace="default")
    with pytest.raises(errors.NotFound):
        store.delete("pods", "a", namespace="default")


def test_bind_sets_node_and_condition_and_conflicts_when_bound() -> None:
    store = Store()
    uid = store.create("pods", pod("a"), namespace="default")["metadata"]["uid"]
    with pytest.raises(errors.Conflict):
        store.bind("default", "a", node="n1", uid="other-uid")
    bound = store.bind("default", "a", node="n1", uid=uid)
    assert bound["spec"]["nodeName"] == "n1"
    assert [c["type"] for c in bound["status"]["conditions"]] == ["PodScheduled"]
    with pytest.raises(errors.Conflict, match='already assigned to node "n1"'):
        store.bind("default", "a", node="n2")
    moved = store.get("pods", "a", namespace="default")
    moved["spec"]["nodeName"] = "n2"
    with pytest.raises(errors.KubeError, match="immutable"):
        store.update("pods", moved, namespace="default")


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("app=web", ["a", "b"]),
        ("app==web", ["a", "b"]),
        ("app!=web", ["c", "d"]),
        ("tier in (front, back)", ["a", "c"]),
        ("tier notin (front)", ["b", "c", "d"]),
        ("tier", ["a", "c"]),
        ("!tier", ["b", "d"]),
        ("app=web,tier=front", ["a"]),
        ("", ["a", "b", "c", "d"]),
    ],
)
def test_label_selectors(selector: str, expected: list[str]) -> None:
    store = Store()
    store.create("pods", pod("a", labels={"app": "web", "tier": "front"}), namespace="default")
    store.create("pods", pod("b", labels={"app": "web"}), namespace="default")
    store.create("pods", pod("c", labels={"app": "db", "tier": "back"}), namespace="default")
    store.create("pods", pod("d"), namespace="default")
    items = store.list("pods", namespace="default", label_selector=selector).items
    assert [p["metadata"]["name"] for p in items] == expected


def test_field_selectors_on_node_name_phase_name_and_namespace() -> None:
    store = Store()
    store.create("pods", pod("a", node="n1"), namespace="default")
    store.create("pods", pod("b"), namespace="default")
    store.create("pods", pod("c", node="n1"), namespace="kube-system")

    def names(**kw: str) -> list[str]:
        return [p["metadata"]["name"] for p in store.list("pods", **kw).items]

    assert names(field_selector="spec.nodeName=n1") == ["a", "c"]
    assert names(field_selector="spec.nodeName=") == ["b"]
    assert names(field_selector="spec.nodeName!=n1,metadata.namespace=default") == ["b"]
    assert names(field_selector="metadata.name==c") == ["c"]
    assert names(field_selector="status.phase=Pending", namespace="default") == ["a", "b"]


@pytest.mark.parametrize(
    "selector", ["a in (b", "a in b)", "=x", "a=b=c!", "bad key=1", "a=" + "x" * 70], ids=str
)
def test_bad_label_selectors_are_400(selector: str) -> None:
    with pytest.raises(errors.KubeError) as exc:
        Store().list("pods", label_selector=selector)
    assert exc.value.status == 400


def test_unknown_field_selector_is_400() -> None:
    with pytest.raises(errors.KubeError, match="field label not supported"):
        Store().list("pods", field_selector="spec.hostname=x")
    with pytest.raises(errors.KubeError):
        Store().list("pods", field_selector="garbage")


def test_label_selector_objects_match_like_webhook_selectors() -> None:
    sel = {
        "matchLabels": {"team": "a"},
        "matchExpressions": [
            {"key": "env", "operator": "In", "values": ["prod", "dev"]},
            {"key": "skip", "operator": "DoesNotExist"},
        ],
    }
    assert selectors.match_label_selector(sel, {"team": "a", "env": "dev"})
    assert not selectors.match_label_selector(sel, {"team": "a", "env": "qa"})
    assert not selectors.match_label_selector(sel, {"team": "a", "env": "dev", "skip": ""})
    assert selectors.match_label_selector({}, {})
    with pytest.raises(errors.KubeError):
        selectors.match_label_selector({"matchExpressions": [{"key": "a", "operator": "Bogus"}]}, {})


def test_namespaces_exist_by_default_and_carry_their_name_label() -> None:
    ns = Store().get("namespaces", "kube-system")
    assert ns["metadata"]["labels"]["kubernetes.io/metadata.name"] == "kube-system"


def test_unknown_kind_is_not_found() -> None:
    with pytest.raises(errors.NotFound):
        Store().list("deployments")
