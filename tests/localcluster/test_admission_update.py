# mypy: disable-error-code="no-untyped-call,arg-type"
"""Admission on UPDATE, as kube-apiserver runs it: pod and node PUTs and PATCHes (not status, not
binding) go to mutating then validating webhooks with ``oldObject`` and the bearer token's user;
a write that lands while a webhook decides makes the server admit again."""

from __future__ import annotations

import asyncio
import json
import pathlib
from collections.abc import AsyncIterator
from typing import Any

import kubernetes
import pytest
from kubernetes.client.exceptions import ApiException
from vgpu.localcluster import admission
from vgpu.localcluster.apiserver import ApiServer
from vgpu.localcluster.client import LocalKubeApi
from vgpu.localcluster.store import Store

from tests.localcluster.test_admission import Webhook, allow, ca, config, webhook

__all__ = ["ca", "webhook"]  # fixtures used here

ALICE = {"username": "alice", "groups": ["system:authenticated"]}
PLUGIN = {"username": "system:serviceaccount:kube-vgpu:plugin", "groups": ["system:serviceaccounts"]}
USERS = {"tok-alice": ALICE, "tok-plugin": PLUGIN}
UPDATE_RULES = [
    {"operations": ["UPDATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]},
    {"operations": ["UPDATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["nodes"]},
]


def validating(hook: Webhook, **overrides: Any) -> dict[str, Any]:
    return config(hook, rules=UPDATE_RULES, **overrides)


def deny_alice(review: dict[str, Any]) -> dict[str, Any]:
    answer = allow(review)
    if review["request"]["userInfo"]["username"] == "alice":
        answer["response"].update(allowed=False, status={"code": 403, "message": "not yours"})
    return answer


@pytest.fixture
async def server(tmp_path: pathlib.Path) -> AsyncIterator[ApiServer]:
    store = Store()
    store.create("namespaces", {"metadata": {"name": "team", "labels": {"gpu": "yes"}}})
    store.create("nodes", {"metadata": {"name": "n1", "labels": {"a": "b"}}, "spec": {}})
    store.create(
        "pods", {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c"}]}}, namespace="team"
    )
    s = ApiServer(store, users=USERS)
    await s.start()
    try:
        yield s
    finally:
        await s.stop()


def core(server: ApiServer, tmp_path: pathlib.Path, token: str) -> Any:
    path = server.write_kubeconfig(tmp_path / f"kc-{token}", token=token)
    return kubernetes.client.CoreV1Api(kubernetes.config.new_client_from_config(config_file=str(path)))


async def call(fn: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
    resp = await asyncio.to_thread(fn, *args, _preload_content=False, **kwargs)
    return dict(json.loads(resp.data))


async def test_a_patch_is_reviewed_with_the_old_object_and_the_tokens_user(
    webhook: Webhook, server: ApiServer, tmp_path: pathlib.Path
) -> None:
    server.add_validating_webhooks(validating(webhook))
    before = server.store.get("pods", "p", namespace="team")
    alice = core(server, tmp_path, "tok-alice")
    patched = await call(alice.patch_namespaced_pod, "p", "team", {"metadata": {"labels": {"x": "y"}}})
    assert patched["metadata"]["labels"] == {"x": "y"}
    [review] = webhook.reviews
    req = review["request"]
    assert (req["operation"], req["namespace"], req["name"]) == ("UPDATE", "team", "p")
    assert req["kind"] == {"group": "", "version": "v1", "kind": "Pod"}
    assert req["options"]["kind"] == "UpdateOptions"
    assert req["userInfo"] == ALICE
    assert req["oldObject"] == before
    assert req["object"]["metadata"]["labels"] == {"x": "y"}
    assert req["object"]["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]


async def test_a_denied_update_changes_nothing_and_names_the_webhook(
    webhook: Webhook, server: ApiServer, tmp_path: pathlib.Path
) -> None:
    server.add_validating_webhooks(validating(webhook))
    webhook.reply = deny_alice
    before = server.store.get("pods", "p", namespace="team")
    alice = core(server, tmp_path, "tok-alice")
    for fn, args in (
        (alice.patch_namespaced_pod, ("p", "team", {"metadata": {"annotations": {"k": "v"}}})),
        (
            alice.replace_namespaced_pod,
            ("p", "team", {**before, "metadata": {**before["metadata"], "labels": {}}}),
        ),
        (alice.patch_node, ("n1", {"metadata": {"annotations": {"k": "v"}}})),
    ):
        with pytest.raises(ApiException) as exc:
            await call(fn, *args)
        assert exc.value.status == 403
        assert json.loads(exc.value.body)["message"] == (
            'admission webhook "vgpu.example.io" denied the request: not yours'
        )
    assert server.store.get("pods", "p", namespace="team") == before
    node_review = webhook.reviews[-1]["request"]
    assert node_review["kind"]["kind"] == "Node" and "namespace" not in node_review
    plugin = core(server, tmp_path, "tok-plugin")
    await call(plugin.patch_node, "n1", {"metadata": {"annotations": {"k": "v"}}})
    assert server.store.get("nodes", "n1")["metadata"]["annotations"] == {"k": "v"}


async def test_status_and_binding_subresources_are_not_sent(
    webhook: Webhook, server: ApiServer, tmp_path: pathlib.Path
) -> None:
    """Rules on ``pods`` and ``nodes`` do not match ``pods/status``, ``pods/binding``, ``nodes/status``."""
    server.add_validating_webhooks(validating(webhook))
    webhook.reply = deny_alice
    alice = core(server, tmp_path, "tok-alice")
    await call(alice.patch_namespaced_pod_status, "p", "team", {"status": {"phase": "Running"}})
    await call(alice.patch_node_status, "n1", {"status": {"capacity": {"cpu": "4"}}})
    binding = {"metadata": {"name": "p"}, "target": {"kind": "Node", "name": "n1"}}
    await call(alice.create_namespaced_pod_binding, "p", "team", binding)
    assert webhook.reviews == []
    assert server.store.get("pods", "p", namespace="team")["spec"]["nodeName"] == "n1"


async def test_an_unknown_token_is_401(server: ApiServer, tmp_path: pathlib.Path) -> None:
    with pytest.raises(ApiException) as exc:
        await call(core(server, tmp_path, "tok-mallory").read_node, "n1")
    assert exc.value.status == 401


async def test_a_mutating_webhook_patches_an_update_and_selectors_see_old_or_new(
    webhook: Webhook, server: ApiServer, tmp_path: pathlib.Path
) -> None:
    selector = {"matchLabels": {"watched": "yes"}}
    server.add_mutating_webhooks(config(webhook, rules=UPDATE_RULES, objectSelector=selector))
    webhook.reply = lambda review: allow(
        review, [{"op": "add", "path": "/metadata/annotations", "value": {"m": "1"}}]
    )
    alice = core(server, tmp_path, "tok-alice")
    await call(alice.patch_namespaced_pod, "p", "team", {"metadata": {"labels": {"other": "x"}}})
    assert webhook.reviews == []  # neither old nor new matches
    patched = await call(
        alice.patch_namespaced_pod, "p", "team", {"metadata": {"labels": {"watched": "yes"}}}
    )
    assert patched["metadata"]["annotations"] == {"m": "1"}
    unlabelled = await call(alice.patch_namespaced_pod, "p", "team", {"metadata": {"labels": None}})
    assert "labels" not in unlabelled["metadata"] and len(webhook.reviews) == 2  # the old one matched


async def test_a_write_during_admission_is_not_lost(webhook: Webhook, server: ApiServer) -> None:
    """Another writer lands while the webhook decides: the server admits the patch again on top."""
    server.add_validating_webhooks(validating(webhook))
    store = server.store

    def concurrent_write(review: dict[str, Any]) -> dict[str, Any]:
        if len(webhook.reviews) == 1:
            store.patch("pods", "p", {"metadata": {"annotations": {"other": "1"}}}, namespace="team")
        return allow(review)

    webhook.reply = concurrent_write
    api = LocalKubeApi(store, admission=server.admission, user_info=PLUGIN)
    result = await api.merge_patch(
        "pods", "p", {"metadata": {"annotations": {"mine": "2"}}}, namespace="team"
    )
    assert result["metadata"]["annotations"] == {"other": "1", "mine": "2"}
    assert len(webhook.reviews) == 2
    assert webhook.reviews[1]["request"]["oldObject"]["metadata"]["annotations"] == {"other": "1"}
    assert webhook.reviews[1]["request"]["userInfo"] == PLUGIN
    # a PUT that names its resourceVersion is a precondition: a write in between is a Conflict
    webhook.reviews.clear()
    stale = store.get("pods", "p", namespace="team")
    with pytest.raises(Exception, match="the object has been modified"):
        await api.replace("pods", stale, namespace="team")
    assert len(webhook.reviews) == 1


async def test_without_webhook_configurations_updates_skip_admission(server: ApiServer) -> None:
    assert not server.admission.admits("pods")
    server.add_validating_webhooks({"metadata": {"name": "x"}, "webhooks": []})
    assert server.admission.admits("nodes") and not server.admission.admits("leases")
    assert admission.DEFAULT_USER["username"] == "system:admin"


async def test_a_validating_webhook_may_not_patch(
    webhook: Webhook, server: ApiServer, tmp_path: pathlib.Path
) -> None:
    server.add_validating_webhooks(validating(webhook))
    webhook.reply = lambda review: allow(
        review, [{"op": "add", "path": "/metadata/labels", "value": {"x": "y"}}]
    )
    with pytest.raises(ApiException) as exc:
        await call(
            core(server, tmp_path, "tok-alice").patch_node, "n1", {"metadata": {"annotations": {"k": "v"}}}
        )
    assert exc.value.status == 500
    assert "validating webhook may not return response.patch" in json.loads(exc.value.body)["message"]
    assert "annotations" not in server.store.get("nodes", "n1")["metadata"]
