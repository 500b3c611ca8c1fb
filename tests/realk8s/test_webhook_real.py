"""The admission webhook called by a real kube-apiserver (marked ``realk8s``): the configuration
the chart renders (admissionregistration.k8s.io/v1, JSONPatch answers, CREATE of pods), the
AdmissionReview as kube-apiserver itself sends it (quantities already canonical: a limit written
``2000`` arrives as ``2k``), and its answers applied or refused by kube-apiserver."""

from __future__ import annotations

import asyncio
import base64
import datetime
import pathlib
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import yaml
from vgpu.core import errors
from vgpu.kube import aioapi, kubeconfig
from vgpu.localcluster import certs

from bench import realk8s
from bench.throughput_bench import VgpuSchedulerProcess

pytestmark = [pytest.mark.realk8s, pytest.mark.slow, pytest.mark.timeout(300)]

WEBHOOK_READY_S = 60.0  # kube-apiserver's informer picks up a new webhook configuration


def _pod(name: str, *, limits: dict[str, str], **extra: Any) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "busybox", "resources": {"limits": limits}}
    container.update(extra.pop("container", {}))
    return {"metadata": {"name": name, **extra.pop("metadata", {})}, "spec": {"containers": [container]}}


@pytest.fixture
async def api(k8s_bin: pathlib.Path, tmp_path: pathlib.Path) -> AsyncIterator[aioapi.AioKubeApi]:
    """A real control plane with the vgpu-scheduler's webhook registered as the chart does it."""
    now = datetime.datetime.now(datetime.UTC)
    async with realk8s.control_plane(k8s_bin, tmp_path, now=now) as plane:
        kube = kubeconfig.write_kubeconfig(
            tmp_path / "kubeconfig", server=plane.url, token=plane.token, ca_pem=plane.ca_file.read_bytes()
        )
        (tmp_path / "vgpu.yaml").write_text(yaml.safe_dump({"scheduler": {}}))
        tls = certs.make_serving_certs(tmp_path / "certs", now=now)
        async with (
            VgpuSchedulerProcess(tmp_path, kube, tls) as _extender,
            aioapi.AioKubeApi(plane.url, token=plane.token, ca_file=str(plane.ca_file)) as client,
        ):
            service = (tmp_path / "scheduler.addr").read_text().split()[0]
            await client.request(
                "POST",
                "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations",
                body={
                    "apiVersion": "admissionregistration.k8s.io/v1",
                    "kind": "MutatingWebhookConfiguration",
                    "metadata": {"name": "kube-vgpu"},
                    "webhooks": [
                        {
                            "name": "vgpu.kube-vgpu.io",
                            "admissionReviewVersions": ["v1", "v1beta1"],
                            "sideEffects": "None",
                            "failurePolicy": "Fail",
                            "clientConfig": {
                                "url": f"https://{service}/webhook",
                                "caBundle": base64.b64encode(tls.ca_file.read_bytes()).decode(),
                            },
                            "rules": [
                                {
                                    "operations": ["CREATE"],
                                    "apiGroups": [""],
                                    "apiVersions": ["v1"],
                                    "resources": ["pods"],
                                    "scope": "Namespaced",
                                }
                            ],
                        }
                    ],
                },
            )
            await _until_webhook_answers(client)
            yield client


async def _until_webhook_answers(api: aioapi.AioKubeApi) -> None:
    """Dry-run creates (admission runs, nothing is stored) until the new configuration is live."""
    probe = _pod("probe", limits={"nvidia.com/gpu": "1"})
    deadline = time.monotonic() + WEBHOOK_READY_S
    while True:
        got = await api.request(
            "POST", "/api/v1/namespaces/default/pods", body=probe, query={"dryRun": "All"}
        )
        if got["spec"].get("schedulerName") == "vgpu-scheduler":
            return
        assert time.monotonic() < deadline, "kube-apiserver never called the webhook"
        await asyncio.sleep(0.2)  # its informer's resync: nothing to wait on from here


async def test_gpu_pod_is_mutated_by_the_webhook_through_kube_apiserver(api: aioapi.AioKubeApi) -> None:
    created = await api.create(
        "pods",
        _pod("gpu", limits={"nvidia.com/gpu": "1", "nvidia.com/gpumem": "2000"}),
        namespace="default",
    )
    assert created["spec"]["schedulerName"] == "vgpu-scheduler"
    limits = created["spec"]["containers"][0]["resources"]["limits"]
    assert limits["nvidia.com/gpumem"] == "2k"  # canonical, as the webhook saw it and kept it


async def test_plain_pod_passes_unchanged(api: aioapi.AioKubeApi) -> None:
    created = await api.create("pods", _pod("plain", limits={"cpu": "1"}), namespace="default")
    assert created["spec"]["schedulerName"] == "default-scheduler"


@pytest.mark.parametrize(
    ("extra", "status", "says"),
    [
        ({"container": {"securityContext": {"privileged": True}}}, 403, "is privileged"),
        ({"metadata": {"annotations": {"hami.io/bind-phase": "success"}}}, 403, "hami.io/bind-phase"),
    ],
)
async def test_refusals_reach_the_user_through_kube_apiserver(
    api: aioapi.AioKubeApi, extra: dict[str, Any], status: int, says: str
) -> None:
    with pytest.raises(errors.KubeError) as refused:
        await api.create("pods", _pod("bad", limits={"nvidia.com/gpu": "1"}, **extra), namespace="default")
    assert refused.value.status == status
    assert 'admission webhook "vgpu.kube-vgpu.io" denied the request' in str(refused.value)
    assert says in str(refused.value)
