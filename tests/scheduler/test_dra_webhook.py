"""The webhook's DRA mode over real HTTP against the local cluster: the claims in the patch, the
ResourceClaimTemplate made before the answer (once, however many pods ask at once), 409s, a create
that hangs, the mode from a namespace label, and GPU sizes from ResourceSlices."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from vgpu.core import config, errors, request
from vgpu.core.dra import convert, names
from vgpu.kube.port import JsonObj, Kind
from vgpu.localcluster.client import LocalKubeApi
from vgpu_scheduler import dratemplates

from tests.scheduler.scenario import Cluster

TEMPLATES: Kind = "resourceclaimtemplates"


def gpu_pod(name: str, **limits: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "team"},
        "spec": {
            "schedulerName": "default-scheduler",
            "containers": [{"name": "main", "image": "cuda", "resources": {"limits": limits}}],
        },
    }


def review(pod: dict[str, Any], uid: str = "u-1") -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "team",
            "operation": "CREATE",
            "userInfo": {"username": "alice"},
            "object": pod,
        },
    }


def patch_of(response: dict[str, Any]) -> list[dict[str, Any]]:
    ops: list[dict[str, Any]] = json.loads(base64.b64decode(response["patch"]))
    return ops


def claims_in(response: dict[str, Any]) -> list[dict[str, Any]]:
    return next(op["value"] for op in patch_of(response) if op["path"] == "/spec/resourceClaims")


class HeldCreates(LocalKubeApi):
    """The local API, with template creates held until ``release`` is set (a slow API server)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.release = asyncio.Event()
        self.held = 0

    async def create(self, kind: Kind, body: JsonObj, *, namespace: str | None = None) -> JsonObj:
        if kind == TEMPLATES:
            self.held += 1
            await self.release.wait()
        return await super().create(kind, body, namespace=namespace)


def dra_cluster(api: Any = None, **webhook: Any) -> Cluster:
    conf = config.load({"webhook": {"defaultMode": "dra", **webhook}})
    if api is not None:
        c = Cluster(conf)
        c.api = api(c.store, clock=c.clock.wall)
        return c
    return Cluster(conf)


@pytest.fixture
async def cluster() -> AsyncIterator[Cluster]:
    c = dra_cluster()
    c.add_node("node-a")
    await c.start()
    yield c
    await c.stop()


async def test_a_dra_pod_gets_claims_and_its_template_exists_before_the_answer(cluster: Cluster) -> None:
    status, out = await cluster.post(
        "webhook", review(gpu_pod("p", **{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4000"}))
    )
    assert status == 200 and out["response"]["allowed"] is True
    (claim,) = claims_in(out["response"])
    assert claim["name"] == "vgpu-0"
    template = cluster.store.get(TEMPLATES, claim["resourceClaimTemplateName"], namespace="team")
    assert template["metadata"]["labels"] == {names.TEMPLATE_LABEL: "true"}
    assert template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["capacity"] == {
        "requests": {"memory": "4000Mi"}
    }
    # the next pod of that size is answered from memory: no second create
    assert cluster.service is not None
    keeper = cluster.service.dra_templates
    status, again = await cluster.post(
        "webhook", review(gpu_pod("q", **{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4000"}), "u-2")
    )
    assert again["response"]["allowed"] is True and keeper.creates == 1


async def test_pods_of_a_new_size_at_once_share_one_create() -> None:
    c = dra_cluster(HeldCreates)
    await c.start()
    try:
        api = c.api
        assert isinstance(api, HeldCreates)
        body = gpu_pod("p", **{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000"})
        posts = [asyncio.ensure_future(c.post("webhook", review(body, f"u-{i}"))) for i in range(5)]
        await c.until(lambda: api.held == 1)
        api.release.set()
        answers = await asyncio.gather(*posts)
        assert all(out["response"]["allowed"] for _, out in answers)
        assert api.held == 1
        assert len(c.store.list(TEMPLATES, namespace="team").items) == 1
    finally:
        await c.stop()


async def test_a_create_that_hangs_refuses_the_pod_within_the_wait_and_finishes_later() -> None:
    c = dra_cluster(HeldCreates, draTemplateWaitS=0.2)
    await c.start()
    try:
        api = c.api
        assert isinstance(api, HeldCreates)
        loop = asyncio.get_running_loop()
        started = loop.time()
        status, out = await c.post(
            "webhook", review(gpu_pod("p", **{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000"}))
        )
        assert loop.time() - started < 2.0
        response = out["response"]
        assert status == 200 and response["allowed"] is False
        assert response["status"]["code"] == 503
        assert "not created within 0.2s; retry" in response["status"]["message"]
        api.release.set()  # the create goes on; the pod's retry finds the template
        await c.until(lambda: len(c.store.list(TEMPLATES, namespace="team").items) == 1)
        status, out = await c.post(
            "webhook", review(gpu_pod("p", **{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000"}))
        )
        assert out["response"]["allowed"] is True and api.held == 1
    finally:
        await c.stop()


def _template(**limits: str) -> dict[str, Any]:
    conf = config.load({"webhook": {"defaultMode": "dra"}})
    pod = gpu_pod("x", **limits)
    parsed = request.parse_pod(pod, conf, default_count=True)
    conversion = convert.convert(pod, parsed, namespace="team", resources=conf.resources, memory_sizes_mib=())
    (body,) = conversion.templates
    return body


async def test_already_exists_with_our_spec_is_success_and_with_another_is_refused() -> None:
    c = dra_cluster()
    ours = _template(**{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "2000"})
    c.store.create(TEMPLATES, ours, namespace="team")  # another replica made it
    other = _template(**{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "5000"})
    squatter = {
        **_template(**{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "6000"}),
        "metadata": {"name": other["metadata"]["name"]},
    }
    c.store.create(TEMPLATES, squatter, namespace="team")
    await c.start()
    try:
        _, out = await c.post(
            "webhook", review(gpu_pod("p", **{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "2000"}))
        )
        assert out["response"]["allowed"] is True
        _, out = await c.post(
            "webhook", review(gpu_pod("p", **{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "5000"}))
        )
        status = out["response"]["status"]
        assert out["response"]["allowed"] is False and status["code"] == 503
        assert (
            f"ResourceClaimTemplate team/{other['metadata']['name']} exists but is not kube-vgpu's"
            in status["message"]
        )
    finally:
        await c.stop()


async def test_a_namespace_label_picks_dra_mode() -> None:
    c = Cluster()  # extender by default
    c.store.create("namespaces", {"metadata": {"name": "team", "labels": {names.MODE_ANNOTATION: "dra"}}})
    c.store.create("namespaces", {"metadata": {"name": "other"}})
    await c.start()
    try:
        _, out = await c.post("webhook", review(gpu_pod("p", **{"nvidia.com/gpu": "1"})))
        assert claims_in(out["response"])[0]["name"] == "vgpu-0"
        other = review(gpu_pod("p", **{"nvidia.com/gpu": "1"}))
        other["request"]["namespace"] = "other"
        _, out = await c.post("webhook", other)
        assert not any(op["path"] == "/spec/resourceClaims" for op in patch_of(out["response"]))
    finally:
        await c.stop()


def _slice(node: str, *sizes: int, driver: str = names.DRIVER) -> dict[str, Any]:
    """A slice the API server accepts, with one device whose memoryMiB is a string (skipped); the
    shapes it refuses are read in test_slices_are_read_for_sizes_without_trusting_their_shape."""
    return {
        "metadata": {"name": f"{node}-{driver}"},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {"name": f"gpu-{i}", "attributes": {"memoryMiB": {"int": size}}}
                for i, size in enumerate(sizes)
            ]
            + [{"name": "junk", "attributes": {"memoryMiB": {"string": "big"}}}],
        },
    }


async def test_percentage_follows_the_sizes_the_slices_publish(cluster: Cluster) -> None:
    asks = {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "25"}
    _, out = await cluster.post("webhook", review(gpu_pod("p", **asks)))
    assert out["response"]["allowed"] is False
    assert "no GPU of driver gpu.kube-vgpu.io is published" in out["response"]["status"]["message"]
    assert cluster.service is not None
    keeper = cluster.service.dra_templates
    cluster.store.create("resourceslices", _slice("node-a", 81559, 81559, 40960))
    cluster.store.create("resourceslices", _slice("node-b", 16384, driver="gpu.nvidia.com"))
    await cluster.until(lambda: keeper.memory_sizes_mib() == (40960, 81559))
    _, out = await cluster.post("webhook", review(gpu_pod("p", **asks)))
    (claim,) = claims_in(out["response"])
    spec = cluster.store.get(TEMPLATES, claim["resourceClaimTemplateName"], namespace="team")["spec"]["spec"]
    alternatives = spec["devices"]["requests"][0]["firstAvailable"]
    assert [(a["name"], a["capacity"]["requests"]["memory"]) for a in alternatives] == [
        ("mem-40960", "10Gi"),
        ("mem-81559", "20389Mi"),
    ]
    cluster.store.delete("resourceslices", "node-a-gpu.kube-vgpu.io")
    await cluster.until(lambda: keeper.memory_sizes_mib() == ())


async def test_a_deleted_template_is_made_again(cluster: Cluster) -> None:
    body = review(gpu_pod("p", **{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1234"}))
    _, out = await cluster.post("webhook", body)
    name = claims_in(out["response"])[0]["resourceClaimTemplateName"]
    assert cluster.service is not None
    keeper = cluster.service.dra_templates
    await cluster.until(lambda: keeper.templates.get("team", name) is not None)
    cluster.store.delete(TEMPLATES, name, namespace="team")
    await cluster.until(lambda: keeper.claim_spec("team", name) is None)
    _, out = await cluster.post("webhook", body)
    assert out["response"]["allowed"] is True
    assert cluster.store.get(TEMPLATES, name, namespace="team")["metadata"]["name"] == name
    assert keeper.creates == 2


async def test_an_api_server_without_dra_refuses_dra_pods_with_its_reason() -> None:
    class NoDra(LocalKubeApi):
        async def create(self, kind: Kind, body: JsonObj, *, namespace: str | None = None) -> JsonObj:
            if kind == TEMPLATES:
                raise errors.NotFound("the server could not find the requested resource", status=404)
            return await super().create(kind, body, namespace=namespace)

    c = dra_cluster(NoDra)
    await c.start()
    try:
        _, out = await c.post("webhook", review(gpu_pod("p", **{"nvidia.com/gpu": "1"})))
        status = out["response"]["status"]
        assert out["response"]["allowed"] is False and status["code"] == 503
        assert "creating ResourceClaimTemplate team/vgpu-" in status["message"]
        assert "could not find the requested resource" in status["message"]
    finally:
        await c.stop()


async def test_a_dry_run_names_the_template_and_makes_none(cluster: Cluster) -> None:
    body = review(gpu_pod("p", **{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "2222"}))
    body["request"]["dryRun"] = True
    _, out = await cluster.post("webhook", body)
    assert out["response"]["allowed"] is True
    name = claims_in(out["response"])[0]["resourceClaimTemplateName"]
    assert cluster.service is not None and cluster.service.dra_templates.creates == 0
    assert cluster.store.list(TEMPLATES, namespace="team").items == []
    assert name.startswith("vgpu-")


@pytest.mark.parametrize(
    ("obj", "sizes"),
    [
        ({"metadata": {"name": "s"}, "spec": {"driver": names.DRIVER, "devices": "junk"}}, []),
        ({"metadata": {"name": "s"}, "spec": "junk"}, []),
        ({"metadata": {"name": "s"}}, []),
        (
            {
                "spec": {
                    "driver": names.DRIVER,
                    "devices": [
                        "junk",
                        {"attributes": "junk"},
                        {"attributes": {"memoryMiB": {"int": True}}},
                    ],
                }
            },
            [],
        ),
        ({"spec": {"driver": names.DRIVER, "devices": [{"attributes": {"memoryMiB": {"int": -5}}}]}}, []),
        (
            {
                "spec": {
                    "driver": names.DRIVER,
                    "devices": [{"attributes": {"gpu.kube-vgpu.io/memoryMiB": {"int": 80}}}],
                }
            },
            [80],
        ),
        ({"spec": {"driver": "other", "devices": [{"attributes": {"memoryMiB": {"int": 80}}}]}}, []),
    ],
    ids=[
        "devices-not-a-list",
        "spec-not-an-object",
        "no-spec",
        "junk-devices-attributes-and-bool",
        "negative",
        "qualified-name",
        "other-driver",
    ],
)
def test_slices_are_read_for_sizes_without_trusting_their_shape(
    obj: dict[str, Any], sizes: list[int]
) -> None:
    assert dratemplates.slim_slice(obj)["memoryMiB"] == sizes


@pytest.mark.parametrize(
    "obj",
    [
        {"metadata": {"name": "t", "namespace": "team"}, "spec": "junk"},
        {"metadata": {"name": "t"}, "spec": {"spec": [1]}},
        {},
    ],
    ids=["spec-not-an-object", "claim-spec-not-an-object", "empty"],
)
def test_garbage_templates_are_kept_with_an_empty_spec(obj: dict[str, Any]) -> None:
    assert dratemplates.slim_template(obj)["spec"] == {"spec": {}}
