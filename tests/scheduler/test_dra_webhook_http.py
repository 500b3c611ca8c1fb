"""The DRA mode's templates through the production adapters (the official client on threads, and
aiohttp on the loop) against the emulated API server over HTTP: the informers of templates and
slices, the create, and a 409 read back with a GET (a template made by hand, without our label:
not ours, so the pod is refused)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from vgpu.core import config
from vgpu.core import request as pod_request
from vgpu.core.dra import convert
from vgpu.kube.aioapi import AioKubeApi
from vgpu.kube.client import OfficialKubeApi
from vgpu.kube.kubeconfig import write_kubeconfig
from vgpu.localcluster.apiserver import ApiServer

from tests.scheduler.scenario import Cluster
from tests.scheduler.test_dra_webhook import TEMPLATES, _slice, claims_in, gpu_pod, review

CONF = config.load({"webhook": {"defaultMode": "dra"}})


def _official(url: str, tmp_path: Path) -> Any:
    return OfficialKubeApi.from_kubeconfig(str(write_kubeconfig(tmp_path / "kubeconfig", server=url)))


def _aio(url: str, tmp_path: Path) -> Any:
    return AioKubeApi(url)


@pytest.fixture(params=[_official, _aio], ids=["official-client", "aiohttp"])
async def http_cluster(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Cluster]:
    c = Cluster(CONF)
    server = ApiServer(c.store, host="127.0.0.1", port=0)
    await server.start()
    make: Callable[[str, Path], Any] = request.param
    api = make(server.url, tmp_path)
    c.api = api
    # made by hand before the scheduler starts: not labelled, so its create answers 409
    pod = gpu_pod("x", **{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "2000"})
    parsed = pod_request.parse_pod(pod, CONF, default_count=True)
    (body,) = convert.convert(
        pod, parsed, namespace="team", resources=CONF.resources, memory_sizes_mib=()
    ).templates
    c.store.create(TEMPLATES, {**body, "metadata": {"name": body["metadata"]["name"]}}, namespace="team")
    c.store.create("resourceslices", _slice("node-a", 24576))
    try:
        await c.start()
        yield c
    finally:
        await c.stop()
        with contextlib.suppress(Exception):
            await api.close()
        await server.stop()


@pytest.mark.slow
async def test_templates_and_slices_over_http(http_cluster: Cluster) -> None:
    c = http_cluster
    assert c.service is not None
    keeper = c.service.dra_templates
    assert keeper.memory_sizes_mib() == (24576,)
    _, out = await c.post(
        "webhook", review(gpu_pod("p", **{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "2000"}))
    )
    # the 409, read back and found not ours
    assert out["response"]["allowed"] is False
    assert "is not labelled kube-vgpu.io/claim-template=true" in out["response"]["status"]["message"]
    _, out = await c.post(
        "webhook", review(gpu_pod("q", **{"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "50"}))
    )
    name = claims_in(out["response"])[0]["resourceClaimTemplateName"]
    template = c.store.get(TEMPLATES, name, namespace="team")
    assert template["spec"]["spec"]["devices"]["requests"][0]["firstAvailable"][0]["capacity"] == {
        "requests": {"memory": "12Gi"}
    }
    await c.until(lambda: keeper.templates.get("team", name) is not None)
    assert keeper.creates == 2
