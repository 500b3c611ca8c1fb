# mypy: disable-error-code="union-attr,no-untyped-call,arg-type,index"
# (the official client's models make every field Optional; these tests read them directly)
"""Mutating admission: the official client creates pods; a real HTTPS test webhook answers."""

from __future__ import annotations

import asyncio
import base64
import json
import pathlib
import ssl
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import kubernetes
import pytest
import trustme
from aiohttp import web
from kubernetes.client.exceptions import ApiException
from vgpu.localcluster.apiserver import ApiServer
from vgpu.localcluster.client import LocalKubeApi
from vgpu.localcluster.store import Store

Reply = Callable[[dict[str, Any]], Any]


def allow(review: dict[str, Any], patch: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    response: dict[str, Any] = {"uid": review["request"]["uid"], "allowed": True}
    if patch is not None:
        response["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
        response["patchType"] = "JSONPatch"
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}


@dataclass
class Webhook:
    url: str
    ca_bundle: str
    reviews: list[dict[str, Any]] = field(default_factory=list)
    reply: Reply = allow
    never: asyncio.Event = field(default_factory=asyncio.Event)


WEBHOOK = web.AppKey("webhook", Webhook)


async def handle(request: web.Request) -> web.StreamResponse:
    hook = request.app[WEBHOOK]
    review = await request.json()
    hook.reviews.append(review)
    answer = hook.reply(review)
    if answer == "hang":
        await hook.never.wait()
    if isinstance(answer, web.StreamResponse):
        return answer
    return web.json_response(answer)


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
async def webhook(ca: trustme.CA) -> AsyncIterator[Webhook]:
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_ctx)
    app = web.Application()
    app.router.add_post("/mutate", handle)
    hook = Webhook(url="", ca_bundle=base64.b64encode(ca.cert_pem.bytes()).decode())
    app[WEBHOOK] = hook
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_ctx)
    await site.start()
    port = runner.addresses[0][1]
    hook.url = f"https://127.0.0.1:{port}/mutate"
    try:
        yield hook
    finally:
        await runner.cleanup()


@pytest.fixture
async def api(tmp_path: pathlib.Path) -> AsyncIterator[tuple[ApiServer, Any]]:
    store = Store()
    store.create("namespaces", {"metadata": {"name": "gpu-team", "labels": {"gpu": "yes"}}})
    server = ApiServer(store)
    await server.start()
    client = kubernetes.config.new_client_from_config(
        config_file=str(server.write_kubeconfig(tmp_path / "kc"))
    )
    try:
        yield server, kubernetes.client.CoreV1Api(client)
    finally:
        await asyncio.to_thread(client.close)
        await server.stop()


def config(hook: Webhook, **overrides: Any) -> dict[str, Any]:
    item = {
        "name": "vgpu.example.io",
        "clientConfig": {"url": hook.url, "caBundle": hook.ca_bundle},
        "rules": [
            {"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}
        ],
        "failurePolicy": "Fail",
        "sideEffects": "None",
        "admissionReviewVersions": ["v1"],
        "timeoutSeconds": 5,
    }
    item.update(overrides)
    return {"metadata": {"name": "vgpu"}, "webhooks": [item]}


def pod(name: str, **labels: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": labels},
        "spec": {"containers": [{"name": "c", "image": "i"}]},
    }


async def create(core: Any, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
    resp = await asyncio.to_thread(core.create_namespaced_pod, namespace, body, _preload_content=False)
    return dict(json.loads(resp.data))


async def test_allowed_with_patch_sends_a_real_review_and_applies_the_patch(
    webhook: Webhook, api: tuple[ApiServer, Any]
) -> None:
    server, core = api
    server.add_mutating_webhooks(config(webhook))
    webhook.reply = lambda review: allow(
        review,
        [
            {"op": "add", "path": "/metadata/annotations", "value": {"hami.io/vgpu-node": "n1"}},
            {"op": "replace", "path": "/spec/schedulerName", "value": "vgpu-scheduler"},
        ],
    )
    created = await create(core, "gpu-team", pod("p1", app="train"))
    assert created["metadata"]["annotations"] == {"hami.io/vgpu-node": "n1"}
    assert created["spec"]["schedulerName"] == "vgpu-scheduler"
    [review] = webhook.reviews
    assert review["apiVersion"] == "admission.k8s.io/v1" and review["kind"] == "AdmissionReview"
    req = review["request"]
    assert req["uid"] and req["operation"] == "CREATE" and req["dryRun"] is False
    assert req["kind"] == {"group": "", "version": "v1", "kind": "Pod"}
    assert req["resource"] == {"group": "", "version": "v1", "resource": "pods"}
    assert req["namespace"] == "gpu-team" and req["name"] == "p1"
    assert req["object"]["metadata"]["labels"] == {"app": "train"} and req["userInfo"]["username"]


async def test_generate_name_review_has_an_empty_name(webhook: Webhook, api: tuple[ApiServer, Any]) -> None:
    server, core = api
    server.add_mutating_webhooks(config(webhook))
    body = pod("x")
    body["metadata"] = {"generateName": "job-"}
    created = await create(core, "default", body)
    assert created["metadata"]["name"].startswith("job-")
    assert webhook.reviews[0]["request"]["name"] == ""


@pytest.mark.parametrize(
    ("status", "code", "reason"),
    [
        ({"code": 403, "message": "no GPUs for you", "reason": "Forbidden"}, 403, "Forbidden"),
        ({"code": 200}, 400, "BadRequest"),
    ],
    ids=["403-with-message", "code-below-400-raised-to-400"],
)
async def test_denial_is_a_client_error_with_the_upstream_message(
    webhook: Webhook, api: tuple[ApiServer, Any], status: dict[str, Any], code: int, reason: str
) -> None:
    server, core = api
    server.add_mutating_webhooks(config(webhook))

    def deny(review: dict[str, Any]) -> dict[str, Any]:
        answer = allow(review)
        answer["response"].update(allowed=False, status=status)
        return answer

    webhook.reply = deny
    with pytest.raises(ApiException) as exc:
        await create(core, "default", pod("p1"))
    assert exc.value.status == code
    body = json.loads(exc.value.body)
    assert body["reason"] == reason
    assert body["message"].startswith('admission webhook "vgpu.example.io" denied the request: ')
    assert server.store.list("pods").items == []


def wrong_uid(review: dict[str, Any]) -> Any:
    answer = allow(review)
    answer["response"]["uid"] = "not-the-uid"
    return answer


def patch_without_type(review: dict[str, Any]) -> Any:
    answer = allow(review, [{"op": "add", "path": "/metadata/labels/x", "value": "y"}])
    del answer["response"]["patchType"]
    return answer


def merge_patch_type(review: dict[str, Any]) -> Any:
    answer = allow(review, [])
    answer["response"]["patchType"] = "MergePatch"
    return answer


def wrong_kind(review: dict[str, Any]) -> Any:
    answer = allow(review)
    answer["apiVersion"] = "admission.k8s.io/v1beta1"
    return answer


FAILURES: dict[str, Reply] = {
    "wrong-uid": wrong_uid,
    "patch-without-patchType": patch_without_type,
    "unsupported-patchType": merge_patch_type,
    "wrong-apiVersion": wrong_kind,
    "no-response": lambda review: {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"},
    "http-500": lambda review: web.Response(status=500, text="boom"),
    "not-json": lambda review: web.Response(text="{garbage", content_type="application/json"),
    "bad-base64-patch": lambda review: {
        **allow(review),
        "response": {**allow(review)["response"], "patch": "%%%", "patchType": "JSONPatch"},
    },
}


@pytest.mark.parametrize("failure", list(FAILURES), ids=list(FAILURES))
@pytest.mark.parametrize("policy", ["Fail", "Ignore"])
async def test_call_failures_follow_failure_policy(
    webhook: Webhook, api: tuple[ApiServer, Any], failure: str, policy: str
) -> None:
    server, core = api
    server.add_mutating_webhooks(config(webhook, failurePolicy=policy))
    webhook.reply = FAILURES[failure]
    if policy == "Ignore":
        created = await create(core, "default", pod("p1"))
        assert "labels" not in created["metadata"] or created["metadata"]["labels"] == {}
        return
    with pytest.raises(ApiException) as exc:
        await create(core, "default", pod("p1"))
    assert exc.value.status == 500
    body = json.loads(exc.value.body)
    assert body["reason"] == "InternalError" and 'failed calling webhook "vgpu.example.io"' in body["message"]
    assert server.store.list("pods").items == []


async def test_timeout_is_a_call_failure(webhook: Webhook, api: tuple[ApiServer, Any]) -> None:
    server, core = api
    server.add_mutating_webhooks(config(webhook, timeoutSeconds=1))
    webhook.reply = lambda review: "hang"
    with pytest.raises(ApiException) as exc:
        await create(core, "default", pod("p1"))
    assert exc.value.status == 500 and "TimeoutError" in json.loads(exc.value.body)["message"]


async def test_untrusted_certificate_is_a_call_failure(webhook: Webhook, api: tuple[ApiServer, Any]) -> None:
    server, core = api
    other_ca = base64.b64encode(trustme.CA().cert_pem.bytes()).decode()
    server.add_mutating_webhooks(config(webhook, clientConfig={"url": webhook.url, "caBundle": other_ca}))
    with pytest.raises(ApiException) as exc:
        await create(core, "default", pod("p1"))
    assert exc.value.status == 500 and webhook.reviews == []


async def test_patch_that_does_not_apply_is_500_even_when_ignored(
    webhook: Webhook, api: tuple[ApiServer, Any]
) -> None:
    server, core = api
    server.add_mutating_webhooks(config(webhook, failurePolicy="Ignore"))
    webhook.reply = lambda review: allow(
        review, [{"op": "add", "path": "/metadata/annotations/x", "value": "y"}]
    )
    with pytest.raises(ApiException) as exc:
        await create(core, "default", pod("p1"))
    assert exc.value.status == 500


@pytest.mark.parametrize(
    "case",
    [
        ({"namespaceSelector": {"matchLabels": {"gpu": "yes"}}}, "gpu-team", {}, True),
        ({"namespaceSelector": {"matchLabels": {"gpu": "yes"}}}, "default", {}, False),
        (
            {
                "namespaceSelector": {
                    "matchExpressions": [
                        {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system"]}
                    ]
                }
            },
            "kube-system",
            {},
            False,
        ),
        (
            {"objectSelector": {"matchExpressions": [{"key": "skip-vgpu", "operator": "DoesNotExist"}]}},
            "default",
            {"skip-vgpu": "1"},
            False,
        ),
        (
            {"objectSelector": {"matchExpressions": [{"key": "app", "operator": "In", "values": ["train"]}]}},
            "default",
            {"app": "train"},
            True,
        ),
        (
            {"objectSelector": {"matchExpressions": [{"key": "app", "operator": "Exists"}]}},
            "default",
            {},
            False,
        ),
        (
            {
                "rules": [
                    {
                        "operations": ["UPDATE"],
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "resources": ["pods"],
                    }
                ]
            },
            "default",
            {},
            False,
        ),
        (
            {"rules": [{"operations": ["*"], "apiGroups": ["*"], "apiVersions": ["*"], "resources": ["*"]}]},
            "default",
            {},
            True,
        ),
    ],
    ids=[
        "ns-match",
        "ns-no-match",
        "ns-notin",
        "obj-doesnotexist",
        "obj-in",
        "obj-exists",
        "rule-update-only",
        "rule-wildcards",
    ],
)
async def test_selectors_and_rules_decide_who_is_called(
    webhook: Webhook, api: tuple[ApiServer, Any], case: tuple[dict[str, Any], str, dict[str, str], bool]
) -> None:
    overrides, namespace, labels, called = case
    server, core = api
    server.add_mutating_webhooks(config(webhook, **overrides))
    await create(core, namespace, pod("p1", **labels))
    assert bool(webhook.reviews) == called


async def test_configuration_registered_through_the_api(webhook: Webhook, api: tuple[ApiServer, Any]) -> None:
    _server, core = api
    adm = kubernetes.client.AdmissionregistrationV1Api(core.api_client)
    body = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        **config(webhook),
    }
    await asyncio.to_thread(adm.create_mutating_webhook_configuration, body, _preload_content=False)
    listed = await asyncio.to_thread(adm.list_mutating_webhook_configuration)
    assert [c.metadata.name for c in listed.items] == ["vgpu"]
    await create(core, "default", pod("p1"))
    assert len(webhook.reviews) == 1


async def test_the_fast_door_runs_admission_when_given_the_chain(
    webhook: Webhook, api: tuple[ApiServer, Any]
) -> None:
    server, _ = api
    server.add_mutating_webhooks(config(webhook))
    webhook.reply = lambda review: allow(
        review, [{"op": "add", "path": "/metadata/labels", "value": {"m": "1"}}]
    )
    with_chain = LocalKubeApi(server.store, admission=server.admission)
    assert (await with_chain.create("pods", pod("a"), namespace="default"))["metadata"]["labels"] == {
        "m": "1"
    }
    plain = LocalKubeApi(server.store)
    assert (await plain.create("pods", pod("b"), namespace="default"))["metadata"]["labels"] == {}
    assert len(webhook.reviews) == 1
