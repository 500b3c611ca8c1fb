"""kube-controller-manager's resourceclaim controller, emulated: claims from templates for pods,
recorded in the pod's status, released and deleted with the pod."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from vgpu.localcluster import claimcontroller
from vgpu.localcluster.client import LocalKubeApi
from vgpu.localcluster.statuswriter import StoreStatusWriter
from vgpu.localcluster.store import Store

from tests.localcluster import draobjects as dra
from tests.localcluster.conftest import wait_event, wait_for


@pytest.mark.parametrize(
    ("pod", "claim", "expected"),
    [
        ("web-0", "vgpu-0", "web-0-vgpu-0-"),
        ("p" * 60, "vgpu-0", "p" * 50 + "-" + "vgpu-"),  # 60*57//68, 6*57//68
        ("p" * 40, "c" * 40, "p" * 27 + "-" + "c" * 27),  # 40*57//82
    ],
    ids=["short", "long-pod", "both-long"],
)
def test_generate_name_cuts_both_names_in_proportion(pod: str, claim: str, expected: str) -> None:
    assert claimcontroller.generate_name(pod, claim) == expected


async def _gone(api: LocalKubeApi, name: str, *, timeout_s: float = 10.0) -> None:
    """Return once the claim ``name`` is deleted (watching)."""
    async with asyncio.timeout(timeout_s):
        listed = await api.list("resourceclaims", namespace="default", field_selector=f"metadata.name={name}")
        if not listed.items:
            return
        async for event in api.watch(
            "resourceclaims",
            resource_version=listed.resource_version,
            namespace="default",
            field_selector=f"metadata.name={name}",
        ):
            if event.type == "DELETED":
                return


async def _start(
    store: Store, running: Callable[[Any], asyncio.Task[Any]]
) -> claimcontroller.ResourceClaimController:
    controller = claimcontroller.ResourceClaimController(
        LocalKubeApi(store), status_writer=StoreStatusWriter(store), retry_s=0.01
    )
    running(controller.run())
    await asyncio.wait_for(controller.synced.wait(), 10)
    return controller


async def test_a_pods_template_becomes_its_owned_claim_recorded_in_its_status(
    store: Store, api: LocalKubeApi, running: Callable[[Any], asyncio.Task[Any]]
) -> None:
    template = dra.template("t", dra.gpu_request(memory_mib=1000))
    template["spec"]["metadata"] = {"labels": {"team": "a"}, "annotations": {"note": "x"}}
    store.create("resourceclaimtemplates", template, namespace="default")
    await _start(store, running)
    pod = store.create("pods", dra.dra_pod("web", "t", containers=2), namespace="default")
    got = await wait_for(
        api, "pods", "web", lambda p: len((p.get("status") or {}).get("resourceClaimStatuses") or []) == 2
    )
    statuses = {s["name"]: s["resourceClaimName"] for s in got["status"]["resourceClaimStatuses"]}
    assert set(statuses) == {"vgpu-0", "vgpu-1"}
    for pod_claim, claim_name in statuses.items():
        assert claim_name.startswith(f"web-{pod_claim}-") and len(claim_name) == len(f"web-{pod_claim}-") + 5
        claim = store.get("resourceclaims", claim_name, namespace="default")
        assert claim["metadata"]["ownerReferences"] == [
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": "web",
                "uid": pod["metadata"]["uid"],
                "controller": True,
            }
        ]
        assert claim["metadata"]["annotations"] == {
            "note": "x",
            claimcontroller.POD_CLAIM_ANNOTATION: pod_claim,
        }
        assert claim["metadata"]["labels"] == {"team": "a"}
        assert (
            claim["spec"]["devices"]["requests"][0]["exactly"]["capacity"]["requests"]["memory"] == "1000Mi"
        )


async def test_an_existing_owned_claim_is_reused_not_duplicated(
    store: Store, api: LocalKubeApi, running: Callable[[Any], asyncio.Task[Any]]
) -> None:
    store.create("resourceclaimtemplates", dra.template("t", dra.gpu_request()), namespace="default")
    pod = store.create("pods", dra.dra_pod("web", "t"), namespace="default")
    orphan = claimcontroller.claim_from_template(
        pod, "vgpu-0", store.get("resourceclaimtemplates", "t", namespace="default")
    )
    made = store.create("resourceclaims", orphan, namespace="default")
    await _start(store, running)
    got = await wait_for(
        api, "pods", "web", lambda p: bool((p.get("status") or {}).get("resourceClaimStatuses"))
    )
    assert got["status"]["resourceClaimStatuses"] == [
        {"name": "vgpu-0", "resourceClaimName": made["metadata"]["name"]}
    ]
    assert len(store.list("resourceclaims", namespace="default").items) == 1


async def test_a_missing_template_warns_and_is_retried_when_it_appears(
    store: Store, api: LocalKubeApi, running: Callable[[Any], asyncio.Task[Any]]
) -> None:
    await _start(store, running)
    store.create("pods", dra.dra_pod("web", "later"), namespace="default")
    event = await wait_event(api, "web", reason="FailedResourceClaimCreation")
    assert 'resource claim template "later"' in event["message"]
    store.create("resourceclaimtemplates", dra.template("later", dra.gpu_request()), namespace="default")
    await wait_for(api, "pods", "web", lambda p: bool((p.get("status") or {}).get("resourceClaimStatuses")))


async def test_a_deleted_pod_releases_deallocates_and_deletes_its_claims(
    store: Store, api: LocalKubeApi, running: Callable[[Any], asyncio.Task[Any]]
) -> None:
    store.create("resourceclaimtemplates", dra.template("t", dra.gpu_request()), namespace="default")
    await _start(store, running)
    pod = store.create("pods", dra.dra_pod("web", "t"), namespace="default")
    got = await wait_for(
        api, "pods", "web", lambda p: bool((p.get("status") or {}).get("resourceClaimStatuses"))
    )
    name = got["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
    # a claim the pod does not own, shared with another consumer, only loses the pod's reservation
    shared = store.create("resourceclaims", dra.claim("shared", dra.gpu_request()), namespace="default")
    result = {"request": "gpu", "driver": "gpu.kube-vgpu.io", "pool": "n1", "device": "gpu-0"}
    for claim, reserved in ((name, [pod]), ("shared", [pod, {"metadata": {"name": "other", "uid": "u-2"}}])):
        store.patch(
            "resourceclaims",
            claim,
            {
                "status": {
                    "allocation": {"devices": {"results": [result]}},
                    "reservedFor": [
                        {"resource": "pods", "name": p["metadata"]["name"], "uid": p["metadata"]["uid"]}
                        for p in reserved
                    ],
                }
            },
            namespace="default",
            subresource="status",
        )
    assert shared
    store.delete("pods", "web", namespace="default")
    await _gone(api, name)
    left = await wait_for(
        api, "resourceclaims", "shared", lambda c: len(c["status"].get("reservedFor") or []) == 1
    )
    assert left["status"]["reservedFor"] == [{"resource": "pods", "name": "other", "uid": "u-2"}]
    assert left["status"]["allocation"] == {"devices": {"results": [result]}}


async def test_a_done_pods_claim_is_deleted(
    store: Store, api: LocalKubeApi, running: Callable[[Any], asyncio.Task[Any]]
) -> None:
    store.create("resourceclaimtemplates", dra.template("t", dra.gpu_request()), namespace="default")
    await _start(store, running)
    store.create("pods", dra.dra_pod("job", "t"), namespace="default")
    got = await wait_for(
        api, "pods", "job", lambda p: bool((p.get("status") or {}).get("resourceClaimStatuses"))
    )
    name = got["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
    store.patch("pods", "job", {"status": {"phase": "Succeeded"}}, namespace="default", subresource="status")
    await _gone(api, name)
