"""The admission webhook called by a real kube-apiserver (marked ``realk8s``): the configuration
the chart renders (admissionregistration.k8s.io/v1, JSONPatch answers, CREATE of pods), the
AdmissionReview as kube-apiserver itself sends it (quantities already canonical: a limit written
``2000`` arrives as ``2k``), and its answers applied or refused by kube-apiserver."""

from __future__ import annotations

import pathlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from vgpu.core import errors
from vgpu.kube import aioapi

from tests.realk8s.stack import real_stack

pytestmark = [pytest.mark.realk8s, pytest.mark.slow, pytest.mark.timeout(300)]


def _pod(name: str, *, limits: dict[str, str], **extra: Any) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "busybox", "resources": {"limits": limits}}
    container.update(extra.pop("container", {}))
    return {"metadata": {"name": name, **extra.pop("metadata", {})}, "spec": {"containers": [container]}}


@pytest.fixture
async def api(k8s_bin: pathlib.Path, tmp_path: pathlib.Path) -> AsyncIterator[aioapi.AioKubeApi]:
    """A real control plane with the vgpu-scheduler's webhook registered as the chart does it."""
    async with real_stack(k8s_bin, tmp_path) as stack:
        yield stack.api


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
