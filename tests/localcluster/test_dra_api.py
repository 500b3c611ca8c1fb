# mypy: disable-error-code="union-attr,no-untyped-call,arg-type,index"
# (the official client's models make every field Optional; these tests read them directly)
"""The DRA kinds (resource.k8s.io/v1) on the local API server: the official client's ResourceV1Api
unchanged over HTTP, discovery, field selectors, defaults and kube-apiserver 1.36's validation."""

from __future__ import annotations

import asyncio
import copy
import json
import pathlib
from collections.abc import AsyncIterator
from typing import Any

import kubernetes
import pytest
from kubernetes.client.exceptions import ApiException
from vgpu.core import errors
from vgpu.core.dra import names
from vgpu.localcluster.apiserver import ApiServer
from vgpu.localcluster.store import Store

from tests.localcluster import draobjects as dra


@pytest.fixture
async def resource_api(tmp_path: pathlib.Path) -> AsyncIterator[tuple[Store, Any]]:
    store = Store(history_size=50)
    server = ApiServer(store)
    await server.start()
    path = server.write_kubeconfig(tmp_path / "kubeconfig")
    client = kubernetes.config.new_client_from_config(config_file=str(path))
    try:
        yield store, client
    finally:
        await asyncio.to_thread(client.close)
        await server.stop()


async def test_the_official_resource_v1_api_works_unchanged(resource_api: tuple[Store, Any]) -> None:
    store, client = resource_api
    api = kubernetes.client.ResourceV1Api(client)
    await asyncio.to_thread(api.create_device_class, dra.device_class())
    await asyncio.to_thread(api.create_resource_slice, dra.resource_slice("n1", [dra.gpu(0), dra.gpu(1)]))
    await asyncio.to_thread(api.create_resource_slice, dra.resource_slice("n2", [dra.gpu(0)]))
    await asyncio.to_thread(
        api.create_namespaced_resource_claim_template,
        "default",
        dra.template("t", dra.gpu_request(memory_mib=1000)),
    )
    created = await asyncio.to_thread(
        api.create_namespaced_resource_claim,
        "default",
        dra.claim("c", dra.gpu_request(memory_mib=1000, cores=20)),
    )
    assert created.spec.devices.requests[0].exactly.capacity.requests == {"memory": "1000Mi", "cores": "20"}
    assert created.spec.devices.requests[0].exactly.allocation_mode == "ExactCount"

    slices = await asyncio.to_thread(api.list_resource_slice, field_selector="spec.nodeName=n1")
    assert [s.metadata.name for s in slices.items] == [f"n1-{names.DRIVER}"]
    by_driver = await asyncio.to_thread(api.list_resource_slice, field_selector=f"spec.driver={names.DRIVER}")
    assert len(by_driver.items) == 2
    gpu0 = slices.items[0].spec.devices[0]
    assert gpu0.allow_multiple_allocations is True
    assert gpu0.capacity["memory"].value == "16Gi"  # stored canonical
    assert gpu0.capacity["memory"].request_policy.valid_range.step == "1Mi"

    # the status subresource: allocation and reservedFor, with the scheduler's shape
    body = {
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "gpu",
                            "driver": names.DRIVER,
                            "pool": "n1",
                            "device": "gpu-0",
                            "shareID": "3c4a2d7e-1a6b-4c7d-9f00-0123456789ab",
                            "consumedCapacity": {"memory": "1000Mi", "cores": "20"},
                        }
                    ]
                }
            },
            "reservedFor": [{"resource": "pods", "name": "p", "uid": "u-1"}],
        }
    }
    patched = await asyncio.to_thread(api.patch_namespaced_resource_claim_status, "c", "default", body)
    assert patched.status.allocation.devices.results[0].share_id == "3c4a2d7e-1a6b-4c7d-9f00-0123456789ab"
    # a write to the main resource leaves the status alone
    stored = store.get("resourceclaims", "c", namespace="default")
    stored["metadata"]["labels"] = {"x": "y"}
    stored.pop("status")
    store.update("resourceclaims", stored, namespace="default")
    assert store.get("resourceclaims", "c", namespace="default")["status"]["reservedFor"][0]["uid"] == "u-1"


async def test_discovery_lists_the_resource_group(resource_api: tuple[Store, Any]) -> None:
    _, client = resource_api
    groups = await asyncio.to_thread(kubernetes.client.ApisApi(client).get_api_versions)
    assert "resource.k8s.io" in [g.name for g in groups.groups]
    resources = await asyncio.to_thread(kubernetes.client.ResourceV1Api(client).get_api_resources)
    listed = {r.name: r.namespaced for r in resources.resources}
    assert listed == {
        "deviceclasses": False,
        "resourceslices": False,
        "resourceclaims": True,
        "resourceclaims/status": True,
        "resourceclaimtemplates": True,
    }


def _invalid(store: Store, kind: str, body: dict[str, Any], *, namespace: str | None = None) -> str:
    with pytest.raises(errors.KubeError) as caught:
        store.create(kind, body, namespace=namespace)
    assert caught.value.status == 422, caught.value
    return str(caught.value)


def _slice_with(**changes: Any) -> dict[str, Any]:
    s = dra.resource_slice("n1", [dra.gpu(0)])
    device = s["spec"]["devices"][0]
    for path, value in changes.items():
        holder, *keys = path.split("__")
        target: Any = {"device": device, "spec": s["spec"]}[holder]
        for k in keys[:-1]:
            target = target[k]
        if value is None:
            target.pop(keys[-1])
        else:
            target[keys[-1]] = value
    return s


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"device__name": "GPU_0"}, 'spec.devices[0].name: Invalid value: "GPU_0"'),
        ({"spec__driver": ""}, "spec.driver: Required value"),
        (
            {"spec__pool__resourceSliceCount": 0},
            "spec.pool.resourceSliceCount: Invalid value: 0: must be greater than zero",
        ),
        (
            {"spec__nodeName": None},
            "exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` is required",
        ),
        ({"spec__allNodes": True}, "but multiple fields are set"),
        (
            {"device__allowMultipleAllocations": None},
            "spec.devices[0].capacity[cores].requestPolicy: Forbidden: allowMultipleAllocations must be true",
        ),
        (
            {"device__capacity__memory__requestPolicy__default": None},
            "capacity[memory].requestPolicy.default: Required value",
        ),
        (
            {"device__capacity__cores__requestPolicy__validRange__max": "200"},
            "max is larger than capacity value",
        ),
        (
            {"device__capacity__memory__requestPolicy__validRange__step": "5Mi"},
            "value is not a multiple of a given step",
        ),
        (
            {"device__capacity__memory__requestPolicy__validRange__min": "32Gi"},
            "min is larger than capacity value",
        ),
        ({"device__capacity__bad-name": {"value": "1"}}, "spec.devices[0].capacity[bad-name]: Invalid value"),
        ({"device__attributes__index": {"int": 1, "string": "x"}}, "exactly one value must be specified"),
        (
            {"device__taints": [{"key": "k", "effect": "Sometimes"}]},
            'taints[0].effect: Unsupported value: "Sometimes"',
        ),
    ],
    ids=[
        "device-name",
        "driver",
        "slice-count",
        "no-node",
        "two-nodes",
        "policy-needs-multi",
        "policy-default",
        "max-over-value",
        "default-off-step",
        "min-over-value",
        "capacity-name",
        "attribute-two-values",
        "taint-effect",
    ],
)
def test_resource_slice_validation_as_1_36(changes: dict[str, Any], message: str) -> None:
    message_got = _invalid(Store(), "resourceslices", _slice_with(**changes))
    assert message_got.startswith(f'ResourceSlice.resource.k8s.io "n1-{names.DRIVER}" is invalid: ')
    assert message in message_got


def test_kube_vgpu_slices_and_taints_are_accepted_and_defaulted() -> None:
    store = Store()
    taint = {"key": names.UNHEALTHY_TAINT_KEY, "value": "true", "effect": "NoSchedule"}
    got = store.create("resourceslices", dra.resource_slice("n1", [dra.gpu(0, taints=[taint]), dra.gpu(1)]))
    assert got["spec"]["devices"][0]["taints"][0]["timeAdded"].endswith("Z")
    changed = copy.deepcopy(got)
    changed["spec"]["nodeName"] = "n2"
    with pytest.raises(errors.KubeError, match=r"spec.nodeName: Invalid value: \"n2\": field is immutable"):
        store.update("resourceslices", changed)


@pytest.mark.parametrize(
    ("request_body", "message"),
    [
        (
            {"name": "gpu"},
            "spec.devices.requests[0]: Required value: exactly one of `exactly` or `firstAvailable` is required",
        ),
        (
            {"name": "Gpu", "exactly": {"deviceClassName": "c"}},
            'spec.devices.requests[0].name: Invalid value: "Gpu"',
        ),
        ({"name": "gpu", "exactly": {}}, "spec.devices.requests[0].exactly.deviceClassName: Required value"),
        (
            {"name": "gpu", "exactly": {"deviceClassName": "c", "count": -1}},
            "exactly.count: Invalid value: -1: must be greater than zero",
        ),
        (
            {"name": "gpu", "exactly": {"deviceClassName": "c", "allocationMode": "Some"}},
            'allocationMode: Unsupported value: "Some"',
        ),
        (
            {"name": "gpu", "exactly": {"deviceClassName": "c", "allocationMode": "All", "count": 2}},
            "must not be specified when allocationMode is 'All'",
        ),
        (
            {"name": "gpu", "exactly": {"deviceClassName": "c", "selectors": [{"cel": {"expression": ""}}]}},
            "selectors[0].cel.expression: Required value",
        ),
    ],
    ids=["neither", "request-name", "class", "count", "mode", "all-with-count", "empty-cel"],
)
def test_claim_validation_as_1_36(request_body: dict[str, Any], message: str) -> None:
    got = _invalid(Store(), "resourceclaims", dra.claim("c", request_body), namespace="default")
    assert got.startswith('ResourceClaim.resource.k8s.io "c" is invalid: ')
    assert message in got
    template = _invalid(
        Store(), "resourceclaimtemplates", dra.template("t", request_body), namespace="default"
    )
    assert message.replace("spec.devices", "spec.spec.devices") in template


def test_claim_spec_and_allocation_are_immutable_and_reserved_for_needs_an_allocation() -> None:
    store = Store()
    store.create("resourceclaims", dra.claim("c", dra.gpu_request(memory_mib=10)), namespace="default")
    with pytest.raises(
        errors.KubeError,
        match=r"status\.reservedFor: Forbidden: may not be specified when `allocated` is not set",
    ):
        store.patch(
            "resourceclaims",
            "c",
            {"status": {"reservedFor": [{"resource": "pods", "name": "p", "uid": "u"}]}},
            namespace="default",
            subresource="status",
        )
    result = {"request": "gpu", "driver": names.DRIVER, "pool": "n1", "device": "gpu-0"}
    with pytest.raises(
        errors.KubeError, match=r'status\.allocation\.devices\.results\[0\]\.request: Invalid value: "cpu"'
    ):
        store.patch(
            "resourceclaims",
            "c",
            {"status": {"allocation": {"devices": {"results": [{**result, "request": "cpu"}]}}}},
            namespace="default",
            subresource="status",
        )
    with pytest.raises(errors.KubeError, match="shareID: Invalid value"):
        store.patch(
            "resourceclaims",
            "c",
            {"status": {"allocation": {"devices": {"results": [{**result, "shareID": "X"}]}}}},
            namespace="default",
            subresource="status",
        )
    store.patch(
        "resourceclaims",
        "c",
        {"status": {"allocation": {"devices": {"results": [result]}}}},
        namespace="default",
        subresource="status",
    )
    with pytest.raises(
        errors.KubeError, match=r"status\.allocation: Invalid value: null: field is immutable"
    ):
        store.patch(
            "resourceclaims",
            "c",
            {"status": {"allocation": {"devices": {"results": [{**result, "device": "gpu-1"}]}}}},
            namespace="default",
            subresource="status",
        )
    with pytest.raises(errors.KubeError, match="spec: Invalid value: null: field is immutable"):
        store.patch(
            "resourceclaims",
            "c",
            {"spec": {"devices": {"requests": [dra.gpu_request(memory_mib=20)]}}},
            namespace="default",
        )
    # clearing the allocation (the controller's deallocation) is allowed
    store.patch(
        "resourceclaims", "c", {"status": {"allocation": None}}, namespace="default", subresource="status"
    )


def test_a_new_claims_status_is_dropped() -> None:
    body = dra.claim("c", dra.gpu_request())
    body["status"] = {"allocation": {"devices": {"results": []}}}
    got = Store().create("resourceclaims", body, namespace="default")
    assert "status" not in got


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (
            lambda p: p["spec"]["resourceClaims"][0].pop("resourceClaimTemplateName"),
            "must specify one of: `resourceClaimName`, `resourceClaimTemplateName`",
        ),
        (
            lambda p: p["spec"]["resourceClaims"][0].update(resourceClaimName="x"),
            "at most one of `resourceClaimName` or `resourceClaimTemplateName` may be specified",
        ),
        (
            lambda p: p["spec"]["resourceClaims"].append(dict(p["spec"]["resourceClaims"][0])),
            'spec.resourceClaims[1].name: Duplicate value: "vgpu-0"',
        ),
        (
            lambda p: p["spec"]["containers"][0]["resources"]["claims"][0].update(name="vgpu-9"),
            'spec.containers[0].resources.claims[0]: Not found: "vgpu-9": must be one of the names in pod.spec.resourceClaims: vgpu-0',
        ),
    ],
    ids=["neither", "both", "duplicate", "unknown-claim"],
)
def test_pod_claims_validation_as_1_36(mutate: Any, message: str) -> None:
    pod = dra.dra_pod("p", "t")
    mutate(pod)
    got = _invalid(Store(), "pods", pod, namespace="default")
    assert got.startswith('Pod "p" is invalid: ')
    assert message in got


def test_pod_resource_claims_are_immutable() -> None:
    store = Store()
    store.create("pods", dra.dra_pod("p", "t"), namespace="default")
    with pytest.raises(errors.KubeError, match=r"spec\.resourceClaims: Forbidden: field is immutable"):
        store.patch(
            "pods",
            "p",
            {"spec": {"resourceClaims": [{"name": "vgpu-0", "resourceClaimTemplateName": "u"}]}},
            namespace="default",
        )


async def test_a_garbage_slice_over_http_is_a_422_status(resource_api: tuple[Store, Any]) -> None:
    _, client = resource_api
    api = kubernetes.client.ResourceV1Api(client)
    body = dra.resource_slice("n1", [dra.gpu(0)])
    body["spec"]["devices"][0]["capacity"]["memory"]["value"] = "lots"
    with pytest.raises(ApiException) as caught:
        await asyncio.to_thread(api.create_resource_slice, body)
    assert caught.value.status == 400
    assert "lots" in json.loads(caught.value.body)["message"]
