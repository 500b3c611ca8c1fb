"""The webhook over HTTP (aiohttp test client on port 0): envelope, versions, facts, garbage."""

from __future__ import annotations

import base64
import io
import json
import logging
from collections.abc import Mapping
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st
from vgpu.core import config
from vgpu_scheduler import webhook
from vgpu_scheduler.limits import WEBHOOK_MAX_BODY_BYTES

GPU_POD: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "train", "namespace": "team"},
    "spec": {
        "schedulerName": "default-scheduler",
        "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
    },
}
CPU_POD: dict[str, Any] = {"metadata": {"name": "web"}, "spec": {"containers": [{"name": "c"}]}}


class FakeView:
    """An AdmissionView backed by dicts; counts usage reads to prove they happen only under quota."""

    def __init__(
        self,
        *,
        labels: Mapping[str, Mapping[str, str]] | None = None,
        usage: Mapping[str, tuple[int, int]] | None = None,
        limits: Mapping[str, tuple[int | None, int | None]] | None = None,
        largest_mib: int = 0,
        broken: bool = False,
    ) -> None:
        self.labels = dict(labels or {})
        self.usage = dict(usage or {})
        self.limits = dict(limits or {})
        self.largest_mib = largest_mib
        self.broken = broken
        self.usage_reads: list[str] = []

    def namespace_labels(self, ns: str) -> Mapping[str, str] | None:
        return self.labels.get(ns)

    def namespace_gpu_usage(self, ns: str) -> tuple[int, int]:
        self.usage_reads.append(ns)
        return self.usage.get(ns, (0, 0))

    def quota_limits(self, ns: str) -> tuple[int | None, int | None]:
        if self.broken:
            raise KeyError(ns)
        return self.limits.get(ns, (None, None))

    def largest_gpu_memory_mib(self) -> int:
        return self.largest_mib


def review(
    obj: Any,
    *,
    version: str = "admission.k8s.io/v1",
    operation: str = "CREATE",
    uid: str = "705ab4f5-6393-11e8-b7cc-42010a800002",
    namespace: str = "team",
    kind: Mapping[str, str] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    return {
        "apiVersion": version,
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": kind or {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": namespace,
            "operation": operation,
            "userInfo": {"username": "alice"},
            "object": obj,
            "dryRun": False,
            **extra,
        },
    }


async def make_client(aiohttp_client: Any, view: FakeView, **webhook_config: Any) -> TestClient[Any, Any]:
    hook = webhook.Webhook(config.load({"webhook": webhook_config}), view)
    app = web.Application()
    app.router.add_post("/webhook", hook.handle)
    client: TestClient[Any, Any] = await aiohttp_client(app)
    return client


async def post(client: TestClient[Any, Any], body: Any) -> dict[str, Any]:
    resp = await client.post("/webhook", json=body)
    assert resp.status == 200, await resp.text()
    out: dict[str, Any] = await resp.json()
    return out


def patch_of(response: Mapping[str, Any]) -> list[dict[str, Any]]:
    assert response["patchType"] == "JSONPatch"
    ops: list[dict[str, Any]] = json.loads(base64.b64decode(response["patch"]))
    return ops


@pytest.mark.parametrize("version", ["admission.k8s.io/v1", "admission.k8s.io/v1beta1"])
async def test_gpu_pod_is_patched_in_the_same_review_version(aiohttp_client: Any, version: str) -> None:
    client = await make_client(aiohttp_client, FakeView())
    out = await post(client, review(GPU_POD, version=version, uid="u-1"))
    assert out["apiVersion"] == version and out["kind"] == "AdmissionReview"
    response = out["response"]
    assert response["uid"] == "u-1" and response["allowed"] is True
    assert "status" not in response and "warnings" not in response
    assert patch_of(response) == [
        {"op": "add", "path": "/spec/containers/0/resources/limits/nvidia.com~1gpucores", "value": "100"},
        {
            "op": "add",
            "path": "/spec/containers/0/resources/requests",
            "value": {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "100"},
        },
        {"op": "replace", "path": "/spec/schedulerName", "value": "vgpu-scheduler"},
        {
            "op": "add",
            "path": "/metadata/annotations",
            "value": {
                "hami.io/gpu-type": "NVIDIA",
                "hami.io/node-scheduler-policy": "binpack",
                "hami.io/core-policy": "default",
            },
        },
    ]


async def test_no_patch_means_no_patch_type(aiohttp_client: Any) -> None:
    client = await make_client(aiohttp_client, FakeView())
    response = (await post(client, review(CPU_POD)))["response"]
    assert response == {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "allowed": True}


@pytest.mark.parametrize(
    "changes",
    [
        {"operation": "UPDATE", "oldObject": GPU_POD},
        {"operation": "DELETE", "obj": None},
        {"operation": "CONNECT"},
        {"kind": {"group": "apps", "version": "v1", "kind": "Deployment"}},
        {"kind": {"group": "", "version": "v1", "kind": "ConfigMap"}},
        {"subResource": "ephemeralcontainers"},
        {"operation": "UPDATE", "subResource": "status", "oldObject": None},
        {"operation": "UPDATE", "kind": {"group": "apps", "version": "v1", "kind": "Node"}},
    ],
    ids=[
        "update-unchanged",
        "delete",
        "connect",
        "deployment",
        "configmap",
        "subresource",
        "status-update",
        "update-other-group",
    ],
)
async def test_other_operations_and_kinds_pass_unchanged(
    aiohttp_client: Any, changes: dict[str, Any]
) -> None:
    client = await make_client(aiohttp_client, FakeView())
    obj = changes.pop("obj", GPU_POD)
    response = (await post(client, review(obj, **changes)))["response"]
    assert response == {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "allowed": True}


async def test_denial_carries_a_status(aiohttp_client: Any) -> None:
    client = await make_client(aiohttp_client, FakeView())
    pod = json.loads(json.dumps(GPU_POD))
    pod["spec"]["nodeName"] = "n1"
    response = (await post(client, review(pod)))["response"]
    assert response["allowed"] is False and "patch" not in response and "patchType" not in response
    assert response["status"] == {
        "metadata": {},
        "status": "Failure",
        "reason": "Forbidden",
        "code": 403,
        "message": "pod has node assigned (spec.nodeName=n1): GPU pods must be placed by vgpu-scheduler; remove spec.nodeName",
    }


async def test_object_that_is_not_a_pod_is_refused_with_400_in_the_review(aiohttp_client: Any) -> None:
    client = await make_client(aiohttp_client, FakeView())
    response = (await post(client, review("not a pod")))["response"]
    assert response["allowed"] is False
    assert response["status"]["code"] == 400 and response["status"]["reason"] == "BadRequest"
    assert response["status"]["message"] == "request.object: expected a Pod object"


async def test_quota_is_read_from_the_view_with_live_usage(aiohttp_client: Any) -> None:
    view = FakeView(limits={"team": (8000, None)}, usage={"team": (6000, 0)})
    client = await make_client(aiohttp_client, view)
    pod = json.loads(json.dumps(GPU_POD))
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem"] = "3000"
    response = (await post(client, review(pod)))["response"]
    assert response["allowed"] is False
    assert (
        response["status"]["message"]
        == "namespace team: GPU memory quota exceeded (used 6000 of 8000, requested 3000)"
    )
    assert view.usage_reads == ["team"]
    view.usage["team"] = (5000, 0)
    assert (await post(client, review(pod)))["response"]["allowed"] is True


async def test_usage_is_not_read_without_a_quota(aiohttp_client: Any) -> None:
    view = FakeView(limits={"other": (1, 1)})
    client = await make_client(aiohttp_client, view)
    assert (await post(client, review(GPU_POD)))["response"]["allowed"] is True
    assert view.usage_reads == []


async def test_ignored_namespace_is_left_alone(aiohttp_client: Any) -> None:
    client = await make_client(aiohttp_client, FakeView(labels={"team": {"hami.io/webhook": "ignore"}}))
    response = (await post(client, review(GPU_POD)))["response"]
    assert response == {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "allowed": True}


async def test_namespace_falls_back_to_the_object(aiohttp_client: Any) -> None:
    view = FakeView(labels={"team": {"hami.io/webhook": "ignore"}})
    client = await make_client(aiohttp_client, view)
    response = (await post(client, review(GPU_POD, namespace="")))["response"]
    assert "patch" not in response


async def test_warnings_are_returned(aiohttp_client: Any) -> None:
    client = await make_client(aiohttp_client, FakeView(largest_mib=24576))
    pod = json.loads(json.dumps(GPU_POD))
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem"] = "40000"
    response = (await post(client, review(pod)))["response"]
    assert response["warnings"] == [
        "container c: 40000 MiB per GPU is more than the largest GPU in the cluster (24576 MiB)"
    ]


async def test_a_fault_in_the_view_is_logged_and_answered_in_the_review(
    aiohttp_client: Any, caplog: pytest.LogCaptureFixture
) -> None:
    client = await make_client(aiohttp_client, FakeView(broken=True))
    with caplog.at_level(logging.ERROR, logger="vgpu_scheduler.webhook"):
        response = (await post(client, review(GPU_POD)))["response"]
    assert response["allowed"] is False and response["status"]["code"] == 500
    assert "admission of pod team/train failed unexpectedly" in caplog.text


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"", "body is not JSON"),
        (b"{", "body is not JSON"),
        (b"\xff\xfe\x00garbage", "body is not JSON"),
        (b"[" * 100_000 + b"]" * 100_000, "body is not JSON"),
        (b"[]", "body is not a JSON object"),
        (b'{"apiVersion":"v1","kind":"AdmissionReview","request":{"uid":"u"}}', "apiVersion 'v1'"),
        (b'{"apiVersion":"admission.k8s.io/v1","kind":"Pod","request":{"uid":"u"}}', "kind 'Pod'"),
        (b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}', "request: expected an object"),
        (b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{}}', "request.uid"),
        (b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":7}}', "request.uid"),
        (
            b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","operation":1}}',
            "request.operation: expected a string",
        ),
    ],
    ids=[
        "empty",
        "truncated",
        "binary",
        "deep",
        "array",
        "api-version",
        "kind",
        "no-request",
        "no-uid",
        "int-uid",
        "int-op",
    ],
)
async def test_undecodable_bodies_get_http_400_with_the_reason(
    aiohttp_client: Any, body: bytes, reason: str
) -> None:
    client = await make_client(aiohttp_client, FakeView())
    resp = await client.post("/webhook", data=body, headers={"Content-Type": "application/json"})
    assert resp.status == 400
    text = await resp.text()
    assert text.startswith("bad AdmissionReview: ") and reason in text


# --- property: whatever arrives, the answer is 200 or 400 and a well-formed review ---------------

json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=5)),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=10,
)
requests = st.fixed_dictionaries(
    {"uid": st.text(min_size=1, max_size=8)},
    optional={
        "operation": st.sampled_from(["CREATE", "UPDATE", "DELETE", "CONNECT"]),
        "kind": st.one_of(st.just({"group": "", "version": "v1", "kind": "Pod"}), json_values),
        "namespace": st.sampled_from(["team", "", "kube-system"]),
        "object": st.one_of(st.just(GPU_POD), st.just(CPU_POD), json_values),
        "subResource": st.sampled_from(["", "status"]),
    },
)
bodies = st.one_of(
    st.binary(max_size=64),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries(
        {
            "apiVersion": st.sampled_from(webhook.API_VERSIONS),
            "kind": st.just("AdmissionReview"),
            "request": requests,
        }
    ).map(lambda v: json.dumps(v).encode()),
)


@settings(max_examples=300, deadline=None)
@given(body=bodies)
def test_any_body_gets_a_review_or_a_400(body: bytes) -> None:
    hook = webhook.Webhook(config.Config(), FakeView(limits={"team": (100, 100)}, largest_mib=24576))
    try:
        api_version, req = webhook.parse_review(body)
    except webhook.BadReview as exc:
        assert str(exc)
        return
    out = hook.review(api_version, req)
    json.dumps(out)
    response = out["response"]
    assert out["apiVersion"] == api_version and response["uid"] == req["uid"]
    assert ("patch" in response) == ("patchType" in response)
    if not response["allowed"]:
        assert response["status"]["code"] in (400, 403), response["status"]


def _wide_pod(n: int) -> dict[str, Any]:
    containers = [{"name": f"c{i}", "resources": {"limits": {"nvidia.com/gpu": "1"}}} for i in range(n)]
    return {"metadata": {"name": "wide"}, "spec": {"containers": containers}}


async def test_a_40000_container_review_is_denied_with_the_count(aiohttp_client: Any) -> None:
    # 40,000 containers: about 2.7 MiB, under the API server's 3 MiB request limit
    hook = webhook.Webhook(config.Config(), FakeView())
    app = web.Application(client_max_size=WEBHOOK_MAX_BODY_BYTES)  # the Service port's /webhook limit
    app.router.add_post("/webhook", hook.handle)
    client = await aiohttp_client(app)
    body = json.dumps(review(_wide_pod(40_000)), separators=(",", ":")).encode()
    assert 2 << 20 < len(body) < 3 << 20
    # a stream: aiohttp's client warns that big raw bodies would block its own loop
    resp = await client.post("/webhook", data=io.BytesIO(body), headers={"Content-Type": "application/json"})
    assert resp.status == 200
    response = (await resp.json())["response"]
    assert response["allowed"] is False and response["status"]["code"] == 400
    assert (
        "40000 containers (init and app), more than the limit of 1000 (webhook.maxContainers)"
        in (response["status"]["message"])
    )


async def test_the_container_limit_is_configurable_and_wide_pods_under_it_are_patched(
    aiohttp_client: Any,
) -> None:
    client = await make_client(aiohttp_client, FakeView(), maxContainers=3000)
    out = await post(client, review(_wide_pod(3000)))
    response = out["response"]
    assert response["allowed"] is True
    ops = patch_of(response)
    gpucores = [op for op in ops if op["path"].endswith("nvidia.com~1gpucores")]
    assert len(gpucores) == 3000  # one per container: each got its exclusive cores
    denied = await post(
        await make_client(aiohttp_client, FakeView(), maxContainers=2999), review(_wide_pod(3000))
    )
    assert denied["response"]["allowed"] is False


@pytest.mark.parametrize(
    ("namespace", "allowed"), [("team", False), ("lab", True)], ids=["refused", "allowed-namespace"]
)
async def test_a_tenants_own_hami_core_env_is_refused_over_http(
    aiohttp_client: Any, namespace: str, allowed: bool
) -> None:
    """issue 49: CUDA_DISABLE_CONTROL / a memory limit of its own on a GPU container is refused,
    named, except in a namespace the config lists."""
    client = await make_client(aiohttp_client, FakeView(), allowControlEnvNamespaces=["lab"])
    pod = json.loads(json.dumps(GPU_POD))
    pod["spec"]["containers"][0]["env"] = [
        {"name": "CUDA_DISABLE_CONTROL", "value": "true"},
        {"name": "CUDA_DEVICE_MEMORY_LIMIT_0", "value": "16000m"},
    ]
    response = (await post(client, review(pod, namespace=namespace)))["response"]
    assert response["allowed"] is allowed
    if not allowed:
        status = response["status"]
        assert (status["code"], status["reason"]) == (403, "Forbidden")
        assert status["message"].startswith(
            "container c sets CUDA_DISABLE_CONTROL, CUDA_DEVICE_MEMORY_LIMIT_0: the device plugin sets"
        )
