"""The update guard through POST /webhook: pod and node UPDATEs are decided by core/guard.py with
the request's object, oldObject and userInfo, in the review version asked, never with a patch."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from vgpu.core import config
from vgpu_scheduler import webhook

from tests.scheduler.test_webhook import FakeView

SCHEDULER = "system:serviceaccount:kube-vgpu:gpu-kube-vgpu-scheduler"
POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {
        "name": "p",
        "namespace": "team",
        "annotations": {"hami.io/vgpu-devices-to-allocate": "GPU-a,NVIDIA,1000,10:;"},
        "labels": {"app": "x"},
    },
    "spec": {"containers": [{"name": "c", "image": "cuda"}]},
}
NODE = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "annotations": {}}}


def update(new: Any, old: Any, *, user: Any, kind: str = "Pod", version: str = "admission.k8s.io/v1") -> Any:
    request: dict[str, Any] = {
        "uid": "u-1",
        "kind": {"group": "", "version": "v1", "kind": kind},
        "resource": {"group": "", "version": "v1", "resource": kind.lower() + "s"},
        "name": new["metadata"]["name"] if isinstance(new, dict) else "x",
        "operation": "UPDATE",
        "userInfo": user,
        "object": new,
        "oldObject": old,
    }
    if kind == "Pod":
        request["namespace"] = "team"
    return {"apiVersion": version, "kind": "AdmissionReview", "request": request}


@pytest.fixture
async def client(aiohttp_client: Any) -> TestClient[Any, Any]:
    cfg = config.load({"webhook": {"trustedUsers": [SCHEDULER], "trustedGroups": ["gpu-admins"]}})
    app = web.Application()
    app.router.add_post("/webhook", webhook.Webhook(cfg, FakeView()).handle)
    c: TestClient[Any, Any] = await aiohttp_client(app)
    return c


async def answer(client: TestClient[Any, Any], body: Any) -> dict[str, Any]:
    resp = await client.post("/webhook", json=body)
    assert resp.status == 200, await resp.text()
    out: dict[str, Any] = await resp.json()
    assert out["response"]["uid"] == "u-1"
    assert "patch" not in out["response"]
    return out


@pytest.mark.parametrize("version", ["admission.k8s.io/v1", "admission.k8s.io/v1beta1"])
async def test_a_users_edit_of_to_allocate_is_refused_with_the_key_named(client, version):
    new = copy.deepcopy(POD)
    new["metadata"]["annotations"]["hami.io/vgpu-devices-to-allocate"] = "GPU-b,NVIDIA,40000,100:;"
    out = await answer(client, update(new, POD, user={"username": "alice"}, version=version))
    assert out["apiVersion"] == version
    response = out["response"]
    assert response["allowed"] is False
    status = response["status"]
    assert (status["code"], status["reason"], status["status"]) == (403, "Forbidden", "Failure")
    assert status["message"].startswith(
        "pod team/p: annotation hami.io/vgpu-devices-to-allocate is written by the GPU scheduler"
    )
    assert SCHEDULER in status["message"] and "gpu-admins" in status["message"]


@pytest.mark.parametrize(
    "user", [{"username": SCHEDULER}, {"username": "root", "groups": ["gpu-admins"]}], ids=["sa", "group"]
)
async def test_trusted_identities_pass(client, user):
    new = copy.deepcopy(POD)
    new["metadata"]["annotations"]["hami.io/bind-phase"] = "success"
    assert (await answer(client, update(new, POD, user=user)))["response"] == {"uid": "u-1", "allowed": True}


async def test_a_users_own_label_change_passes(client):
    new = copy.deepcopy(POD)
    new["metadata"]["labels"]["app"] = "y"
    assert (await answer(client, update(new, POD, user={"username": "alice"})))["response"]["allowed"]


async def test_a_node_lock_forged_by_a_user_is_refused(client):
    new = copy.deepcopy(NODE)
    new["metadata"]["annotations"]["hami.io/mutex.lock"] = "2026-01-01T00:00:00Z,team,p"
    out = await answer(client, update(new, NODE, user={"username": "alice"}, kind="Node"))
    assert out["response"]["status"]["message"].startswith(
        "node n1: annotation hami.io/mutex.lock is written"
    )
    status_only = copy.deepcopy(NODE)
    status_only["status"] = {"conditions": [{"type": "Ready", "status": "True"}]}
    out = await answer(client, update(status_only, NODE, user={"username": "system:node:n1"}, kind="Node"))
    assert out["response"] == {"uid": "u-1", "allowed": True}


@pytest.mark.parametrize(
    ("old", "user", "message"),
    [
        (None, {"username": "alice"}, "request.oldObject: required for UPDATE"),
        (
            {"metadata": {"annotations": ["x"]}},
            {"username": "alice"},
            "request.oldObject.metadata.annotations",
        ),
        (NODE, "alice", "request.userInfo: expected an object"),
    ],
    ids=["no-old-object", "old-annotations-list", "user-info-string"],
)
async def test_garbage_gets_400_in_the_review(client, old, user, message):
    new = copy.deepcopy(NODE)
    new["metadata"]["annotations"]["hami.io/node-nvidia-register"] = "[]"
    response = (await answer(client, update(new, old, user=user, kind="Node")))["response"]
    assert response["allowed"] is False
    assert response["status"]["code"] == 400 and response["status"]["message"].startswith(message)


PLUGIN = "system:serviceaccount:kube-vgpu:gpu-kube-vgpu-device-plugin"
NODE_EXTRA = "authentication.kubernetes.io/node-name"


@pytest.mark.parametrize(
    ("kind", "on", "token_node", "allowed"),
    [
        ("Pod", "n1", "n1", True),
        ("Pod", "n2", "n1", False),
        ("Node", "n1", "n1", True),
        ("Node", "n2", "n1", False),
        ("Pod", "n2", None, True),
        ("Node", "n2", None, True),
    ],
    ids=["own-pod", "pod-elsewhere", "own-node", "other-node", "pod-older-cluster", "node-older-cluster"],
)
async def test_the_device_plugin_is_held_to_its_own_node_when_its_token_names_it(
    aiohttp_client, kind, on, token_node, allowed
):
    """issue 49: where the API server puts the node of the plugin's pod-bound token in
    userInfo.extra, the plugin may change owned keys only on that node's pods and Node."""
    cfg = config.load({"webhook": {"trustedUsers": [SCHEDULER], "nodeBoundUsers": [PLUGIN]}})
    app = web.Application()
    app.router.add_post("/webhook", webhook.Webhook(cfg, FakeView()).handle)
    client = await aiohttp_client(app)
    user: dict[str, Any] = {"username": PLUGIN, "groups": ["system:serviceaccounts"]}
    if token_node is not None:
        user["extra"] = {NODE_EXTRA: [token_node]}
    old = copy.deepcopy(POD if kind == "Pod" else NODE)
    if kind == "Pod":
        old["spec"]["nodeName"] = on
    else:
        old["metadata"]["name"] = on
    new = copy.deepcopy(old)
    key = "hami.io/bind-phase" if kind == "Pod" else "hami.io/node-nvidia-register"
    new["metadata"]["annotations"][key] = "forged"
    response = (await answer(client, update(new, old, user=user, kind=kind)))["response"]
    assert response["allowed"] is allowed
    if not allowed:
        assert response["status"]["code"] == 403
        assert f"{PLUGIN} may not change it" in response["status"]["message"]
