# mypy: disable-error-code="no-untyped-call,arg-type"
# (the official client types bodies as its models; we pass plain dicts, which it accepts)
"""End to end over HTTPS: the official client creates pods in the local API server, which calls
our webhook (a real aiohttp server with a trustme certificate) exactly as kube-apiserver would:
the registered MutatingWebhookConfiguration, an AdmissionReview v1, the verified response, the
JSON Patch applied to the stored pod, denials surfaced to the client with the upstream message."""

from __future__ import annotations

import asyncio
import base64
import json
import pathlib
import ssl
from collections.abc import AsyncIterator, Mapping
from typing import Any

import kubernetes
import pytest
import trustme
from aiohttp import web
from kubernetes.client.exceptions import ApiException
from vgpu.core import annotations, config
from vgpu.demo import webhookconfig
from vgpu.localcluster.apiserver import ApiServer
from vgpu.localcluster.store import Store
from vgpu_scheduler import webhook

HOOK_NAME = "vgpu.kube-vgpu.io"


class View:
    """A small in-memory AdmissionView: labels, quota and usage per namespace."""

    def __init__(self) -> None:
        self.labels: dict[str, Mapping[str, str]] = {}
        self.limits: dict[str, tuple[int | None, int | None]] = {}
        self.usage: dict[str, tuple[int, int]] = {}

    def namespace_labels(self, ns: str) -> Mapping[str, str] | None:
        return self.labels.get(ns)

    def namespace_gpu_usage(self, ns: str) -> tuple[int, int]:
        return self.usage.get(ns, (0, 0))

    def quota_limits(self, ns: str) -> tuple[int | None, int | None]:
        return self.limits.get(ns, (None, None))

    def largest_gpu_memory_mib(self) -> int:
        return 24576


@pytest.fixture
async def hook_url() -> AsyncIterator[tuple[str, str, View]]:
    """Our webhook served over HTTPS on 127.0.0.1 port 0: (url, caBundle, view)."""
    ca = trustme.CA()
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_ctx)
    view = View()
    app = web.Application()
    app.router.add_post(
        "/webhook", webhook.Webhook(config.load({"webhook": {"overwriteEnv": True}}), view).handle
    )
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_ctx)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"https://127.0.0.1:{port}/webhook", base64.b64encode(ca.cert_pem.bytes()).decode(), view
    finally:
        await runner.cleanup()


@pytest.fixture
async def core(tmp_path: pathlib.Path, hook_url: tuple[str, str, View]) -> AsyncIterator[Any]:
    """The official client's CoreV1Api against a local API server with our webhook registered."""
    url, ca_bundle, _ = hook_url
    server = ApiServer(Store())
    await server.start()
    client = kubernetes.config.new_client_from_config(
        config_file=str(server.write_kubeconfig(tmp_path / "kc"))
    )
    try:
        registration = webhookconfig.webhook_configuration(url, base64.b64decode(ca_bundle), annotations.KEYS)
        adm = kubernetes.client.AdmissionregistrationV1Api(client)
        await asyncio.to_thread(
            adm.create_mutating_webhook_configuration, registration, _preload_content=False
        )
        for ns in ("team", "ops"):
            await asyncio.to_thread(
                kubernetes.client.CoreV1Api(client).create_namespace,
                {"metadata": {"name": ns}},
                _preload_content=False,
            )
        yield kubernetes.client.CoreV1Api(client)
    finally:
        await asyncio.to_thread(client.close)
        await server.stop()


def pod(name: str, *containers: dict[str, Any], **metadata: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, **metadata},
        "spec": {"containers": list(containers)},
    }


async def create(core: Any, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
    resp = await asyncio.to_thread(core.create_namespaced_pod, namespace, body, _preload_content=False)
    return dict(json.loads(resp.data))


async def denied(core: Any, namespace: str, body: dict[str, Any]) -> tuple[int, str]:
    with pytest.raises(ApiException) as info:
        await create(core, namespace, body)
    return info.value.status, json.loads(info.value.body)["message"]


async def test_gpu_pod_is_mutated_on_create(core: Any) -> None:
    gpu = {"name": "train", "image": "cuda", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
    side = {"name": "log", "image": "busybox"}
    created = await create(core, "team", pod("p1", gpu, side))
    spec = created["spec"]
    assert spec["schedulerName"] == "vgpu-scheduler"
    assert spec["containers"][0]["resources"] == {
        "limits": {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "100"},
        "requests": {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "100"},
    }
    assert spec["containers"][1]["env"] == [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "none"}]
    assert created["metadata"]["annotations"] == {
        "hami.io/gpu-type": "NVIDIA",
        "hami.io/node-scheduler-policy": "binpack",
        "hami.io/core-policy": "default",
    }


async def test_pod_without_gpus_keeps_its_scheduler(core: Any) -> None:
    created = await create(core, "team", pod("web", {"name": "c", "image": "nginx"}))
    assert created["spec"]["schedulerName"] == "default-scheduler"
    assert "annotations" not in created["metadata"] or not created["metadata"]["annotations"]


async def test_invalid_request_is_refused_with_the_field(core: Any) -> None:
    bad = {
        "name": "c",
        "image": "cuda",
        "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "150"}},
    }
    status, message = await denied(core, "team", pod("bad", bad))
    assert status == 400
    assert message == (
        f'admission webhook "{HOOK_NAME}" denied the request: '
        "container c: nvidia.com/gpumem-percentage: must be between 0 and 100, got 150"
    )


async def test_forged_scheduling_annotations_are_refused(core: Any) -> None:
    forged = pod(
        "forged",
        {"name": "c", "image": "cuda"},
        annotations={"hami.io/vgpu-devices-allocated": "GPU-x,NVIDIA,1,1:;"},
    )
    status, message = await denied(core, "team", forged)
    assert status == 403
    assert message.endswith(
        "pod sets hami.io/vgpu-devices-allocated: only the scheduler and device plugin may"
    )


async def test_namespace_quota_is_enforced_against_live_usage(
    core: Any, hook_url: tuple[str, str, View]
) -> None:
    view = hook_url[2]
    view.limits["ops"] = (10000, None)
    view.usage["ops"] = (8000, 0)
    asks = {
        "name": "c",
        "image": "cuda",
        "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4000"}},
    }
    status, message = await denied(core, "ops", pod("big", asks))
    assert status == 403
    assert message.endswith("namespace ops: GPU memory quota exceeded (used 8000 of 10000, requested 4000)")
    view.usage["ops"] = (6000, 0)
    created = await create(core, "ops", pod("fits", asks))
    assert created["metadata"]["name"] == "fits"


async def test_ignored_namespace_is_left_untouched(core: Any, hook_url: tuple[str, str, View]) -> None:
    hook_url[2].labels["ops"] = {"hami.io/webhook": "ignore"}
    gpu = {"name": "c", "image": "cuda", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
    created = await create(core, "ops", pod("free", gpu))
    assert created["spec"]["schedulerName"] == "default-scheduler"
    assert created["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "1"}
