"""The webhook's DRA mode against a real kube-apiserver (marked ``realk8s``): HAMi pods with
``kube-vgpu.io/mode: dra`` come back as pods with claims the real pod validation accepts, and the
ResourceClaimTemplates the scheduler creates pass the real resource.k8s.io/v1 validation (CEL
selectors compiled, consumable capacity requests, firstAvailable, constraints), again with
``fieldValidation=Strict`` so that no field of ours is silently dropped."""

from __future__ import annotations

import asyncio
import pathlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from vgpu.core import errors
from vgpu.core.dra import convert, names
from vgpu.kube import aioapi
from vgpu_scheduler import dratemplates

from tests.realk8s.stack import real_stack

pytestmark = [pytest.mark.realk8s, pytest.mark.dra, pytest.mark.slow, pytest.mark.timeout(300)]

DRA = {names.MODE_ANNOTATION: names.MODE_DRA}
TEMPLATES = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaimtemplates"


def _ctr(name: str, **limits: str) -> dict[str, Any]:
    keys = {"gpu": "nvidia.com/gpu", "mem": "nvidia.com/gpumem", "pct": "nvidia.com/gpumem-percentage"}
    keys |= {"cores": "nvidia.com/gpucores", "prio": "nvidia.com/priority"}
    wire = {keys[k]: v for k, v in limits.items()}
    wire["cpu"] = "100m"
    return {"name": name, "image": "busybox", "resources": {"limits": wire}}


def _pod(
    name: str, *containers: dict[str, Any], annotations: dict[str, str] | None = None, **spec: Any
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "annotations": {**DRA, **(annotations or {})}},
        "spec": {**spec, "containers": list(containers)},
    }


def _slice(node: str, *sizes: int) -> dict[str, Any]:
    """A ResourceSlice of our driver as far as the webhook reads it (the GPUs' memoryMiB)."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{names.DRIVER}"},
        "spec": {
            "driver": names.DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {
                    "name": names.device_name(i),
                    "allowMultipleAllocations": True,
                    "attributes": {
                        names.ATTR_MEMORY_MIB: {"int": size},
                        names.ATTR_UUID: {"string": f"GPU-{node}-{i}"},
                        names.ATTR_MODEL: {"string": "NVIDIA A100-SXM4-80GB"},
                        names.ATTR_NUMA: {"int": i % 2},
                    },
                    "capacity": {
                        names.CAPACITY_MEMORY: {"value": f"{size}Mi"},
                        names.CAPACITY_CORES: {"value": "100"},
                    },
                }
                for i, size in enumerate(sizes)
            ],
        },
    }


@pytest.fixture
async def api(k8s_bin: pathlib.Path, tmp_path: pathlib.Path) -> AsyncIterator[aioapi.AioKubeApi]:
    async with real_stack(k8s_bin, tmp_path) as stack:
        yield stack.api


async def _template(api: aioapi.AioKubeApi, pod: dict[str, Any], claim: str) -> dict[str, Any]:
    entry = next(c for c in pod["spec"]["resourceClaims"] if c["name"] == claim)
    got: dict[str, Any] = await api.get(
        "resourceclaimtemplates", entry["resourceClaimTemplateName"], namespace="default"
    )
    # the name is the hash of the claim spec we sent: the API server stored it exactly as sent
    # (no defaults added, quantities already canonical)
    assert convert.template_name(got["spec"]["spec"]) == got["metadata"]["name"]
    # and as a whole it is what the scheduler's exact check takes for ours (on a 409, or cached)
    ours = convert.template_body(got["spec"]["spec"], namespace="default")
    assert dratemplates.not_ours(got, ours) is None
    return got


async def _strict_dry_run(api: aioapi.AioKubeApi, template: dict[str, Any], name: str) -> None:
    """The template's spec created again, strictly (an unknown field is an error, not dropped)."""
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": f"{name}-strict"},
        "spec": {"spec": template["spec"]["spec"]},
    }
    await api.request("POST", TEMPLATES, body=body, query={"dryRun": "All", "fieldValidation": "Strict"})


CASES = [
    ("memory-cores", [_ctr("main", gpu="1", mem="2000", cores="30")], {}),
    ("whole-gpus-numa", [_ctr("main", gpu="2")], {"nvidia.com/numa-bind": "true"}),
    (
        "selectors",
        [_ctr("main", gpu="1", mem="1000", prio="1")],
        {
            "nvidia.com/use-gputype": "A100,H100",
            "nvidia.com/nouse-gputype": "MIG",
            "nvidia.com/use-gpuuuid": "GPU-node-a-0,GPU-node-a-1",
            "nvidia.com/nouse-gpuuuid": 'GPU-"odd\\',
        },
    ),
]


@pytest.mark.parametrize(("name", "containers", "annotations"), CASES, ids=[c[0] for c in CASES])
async def test_dra_pods_and_their_templates_pass_the_real_validation(
    api: aioapi.AioKubeApi, name: str, containers: list[dict[str, Any]], annotations: dict[str, str]
) -> None:
    created = await api.create("pods", _pod(name, *containers, annotations=annotations), namespace="default")
    assert created["metadata"]["annotations"][names.MODE_ANNOTATION] == "dra"
    assert created["spec"]["schedulerName"] == "default-scheduler"
    (main,) = created["spec"]["containers"]
    assert main["resources"]["claims"] == [{"name": "vgpu-0"}]
    assert main["resources"]["limits"] == {"cpu": "100m"}
    template = await _template(api, created, "vgpu-0")
    assert template["metadata"]["labels"] == {names.TEMPLATE_LABEL: "true"}
    await _strict_dry_run(api, template, name)


async def test_init_containers_sidecars_and_percentages_pass_the_real_validation(
    api: aioapi.AioKubeApi,
) -> None:
    await api.create("resourceslices", _slice("node-a", 81559, 40960))
    sidecar = {**_ctr("side", gpu="1", mem="500"), "restartPolicy": "Always"}
    pod = _pod(
        "mixed",
        _ctr("main", gpu="1", pct="25", cores="10"),
        _ctr("plain"),
        initContainers=[_ctr("prep", gpu="1", mem="1000"), sidecar],
    )
    deadline = asyncio.get_running_loop().time() + 30
    while True:  # until the scheduler's informer has the slice (nothing else to wait on)
        try:
            created = await api.create("pods", pod, namespace="default")
            break
        except errors.KubeError as exc:
            if (
                "is published in a ResourceSlice" not in str(exc)
                or asyncio.get_running_loop().time() > deadline
            ):
                raise
            await asyncio.sleep(0.2)
    assert [c["name"] for c in created["spec"]["resourceClaims"]] == ["vgpu-0", "vgpu-1", "vgpu-2"]
    assert [c["resources"]["claims"] for c in created["spec"]["initContainers"]] == [
        [{"name": "vgpu-0"}],
        [{"name": "vgpu-1"}],
    ]
    main, plain = created["spec"]["containers"]
    assert main["resources"]["claims"] == [{"name": "vgpu-2"}] and "claims" not in plain["resources"]
    template = await _template(api, created, "vgpu-2")
    alternatives = template["spec"]["spec"]["devices"]["requests"][0]["firstAvailable"]
    assert [a["capacity"]["requests"]["memory"] for a in alternatives] == ["10Gi", "20389Mi"]
    await _strict_dry_run(api, template, "mixed")


async def test_a_pod_holding_our_claim_name_is_refused_through_kube_apiserver(api: aioapi.AioKubeApi) -> None:
    pod = _pod(
        "taken",
        _ctr("main", gpu="1", mem="1000"),
        resourceClaims=[{"name": "vgpu-0", "resourceClaimName": "mine"}],
    )
    with pytest.raises(errors.KubeError) as refused:
        await api.create("pods", pod, namespace="default")
    assert refused.value.status == 400
    assert "a claim named vgpu-0 is there already" in str(refused.value)


async def test_a_template_under_our_name_with_more_in_it_refuses_the_pod(api: aioapi.AioKubeApi) -> None:
    """A user of namespace ``squat`` makes our template first, labelled, with claim annotations:
    the pod is refused naming it, and the template is left as the user made it."""
    made = await api.create("pods", _pod("ours", _ctr("main", gpu="1", mem="1500")), namespace="default")
    template = await _template(api, made, "vgpu-0")
    await api.create("namespaces", {"metadata": {"name": "squat"}})
    squat = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": template["metadata"]["name"], "labels": {names.TEMPLATE_LABEL: "true"}},
        "spec": {"metadata": {"annotations": {"team.example/x": "y"}}, "spec": template["spec"]["spec"]},
    }
    stored = await api.create("resourceclaimtemplates", squat, namespace="squat")
    with pytest.raises(errors.KubeError) as refused:
        await api.create("pods", _pod("p", _ctr("main", gpu="1", mem="1500")), namespace="squat")
    name = template["metadata"]["name"]
    assert f"ResourceClaimTemplate squat/{name} exists but is not kube-vgpu's" in str(refused.value)
    kept = await api.get("resourceclaimtemplates", name, namespace="squat")
    assert kept["metadata"]["resourceVersion"] == stored["metadata"]["resourceVersion"]


async def test_a_dry_run_names_a_template_it_does_not_make(api: aioapi.AioKubeApi) -> None:
    pod = _pod("dry", _ctr("main", gpu="1", mem="777"))
    got = await api.request("POST", "/api/v1/namespaces/default/pods", body=pod, query={"dryRun": "All"})
    name = got["spec"]["resourceClaims"][0]["resourceClaimTemplateName"]
    with pytest.raises(errors.NotFound):
        await api.get("resourceclaimtemplates", name, namespace="default")


async def test_the_namespace_gpu_quota_holds_for_dra_pods_through_kube_apiserver(
    api: aioapi.AioKubeApi,
) -> None:
    quota = {"metadata": {"name": "gpu"}, "spec": {"hard": {"limits.nvidia.com/gpumem": "3000"}}}
    await api.create("resourcequotas", quota, namespace="default")
    first = _pod("q1", _ctr("main", gpu="1", mem="2000"))
    deadline = asyncio.get_running_loop().time() + 30
    probe = _pod("probe", _ctr("main", gpu="1", mem="3001"))
    while True:  # until the scheduler's informer has the quota (a dry run: nothing is stored)
        try:
            await api.request("POST", "/api/v1/namespaces/default/pods", body=probe, query={"dryRun": "All"})
        except errors.KubeError as exc:
            assert "GPU memory quota exceeded" in str(exc)
            break
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.2)
    await api.create("pods", first, namespace="default")
    # at once, before or after the watch shows q1: its charge holds either way
    with pytest.raises(errors.KubeError) as refused:
        await api.create("pods", _pod("q2", _ctr("main", gpu="1", mem="2000")), namespace="default")
    assert refused.value.status == 403
    assert "namespace default: GPU memory quota exceeded (used 2000 of 3000, requested 2000)" in str(
        refused.value
    )
    await api.create("pods", _pod("q3", _ctr("main", gpu="1", mem="1000")), namespace="default")
