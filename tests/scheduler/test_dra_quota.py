"""The namespace GPU quota holds for DRA pods: the webhook over real HTTP counts the pods admitted
as claims (reserved at once, then charged from the watch), frees finished and deleted ones, and
``DraUsage`` settles templates seen after their pods, reservations no pod takes, and garbage."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from vgpu.core import config, jsonpatch
from vgpu.core.config import ResourceNames
from vgpu.kube import informer
from vgpu_scheduler.draquota import DraUsage
from vgpu_scheduler.namespaces import Namespaces

from tests.scheduler.scenario import Cluster, FakeClock
from tests.scheduler.test_dra_webhook import HeldCreates


def gpu_pod(name: str, mem: int, *, init_mem: int | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "schedulerName": "default-scheduler",
        "containers": [
            {
                "name": "main",
                "image": "cuda",
                "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": str(mem)}},
            }
        ],
    }
    if init_mem is not None:
        spec["initContainers"] = [
            {
                "name": "prep",
                "image": "cuda",
                "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": str(init_mem)}},
            }
        ]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "team"}, "spec": spec}


def review(pod: dict[str, Any], uid: str) -> dict[str, Any]:
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


@pytest.fixture
async def cluster() -> AsyncIterator[Cluster]:
    c = Cluster(config.load({"webhook": {"defaultMode": "dra"}}))
    c.store.create(
        "resourcequotas",
        {"metadata": {"name": "gpu"}, "spec": {"hard": {"limits.nvidia.com/gpumem": "5000"}}},
        namespace="team",
    )
    await c.start()
    yield c
    await c.stop()


async def admit(cluster: Cluster, pod: dict[str, Any], uid: str) -> dict[str, Any]:
    status, out = await cluster.post("webhook", review(pod, uid))
    assert status == 200
    response: dict[str, Any] = out["response"]
    return response


def created(cluster: Cluster, pod: dict[str, Any], response: dict[str, Any]) -> dict[str, Any]:
    """What the API server stores after the patch: the pod as a watch then shows it."""
    patched = jsonpatch.apply(pod, json.loads(base64.b64decode(response["patch"])))
    return cluster.store.create("pods", patched, namespace="team")


async def test_a_pod_is_charged_from_admission_then_from_the_watch_and_freed_when_gone(
    cluster: Cluster,
) -> None:
    state = cluster.state
    first = gpu_pod("a", 4000)
    allowed = await admit(cluster, first, "u-1")
    assert allowed["allowed"] is True
    assert state.quota.namespace_gpu_usage("team") == (4000, 0) and state.dra.reserved() == 1
    # the watch has not shown pod a yet: its reservation already counts
    refused = await admit(cluster, gpu_pod("b", 2000), "u-2")
    assert refused["allowed"] is False
    assert refused["status"]["message"] == (
        "namespace team: GPU memory quota exceeded (used 4000 of 5000, requested 2000)"
    )
    created(cluster, first, allowed)
    await cluster.until(lambda: state.dra.reserved() == 0)
    assert state.quota.namespace_gpu_usage("team") == (4000, 0)
    cluster.store.patch(
        "pods",
        "a",
        {"status": {"phase": "Succeeded"}},
        patch_type="merge",
        namespace="team",
        subresource="status",
    )
    await cluster.until(lambda: state.quota.namespace_gpu_usage("team") == (0, 0))
    assert (await admit(cluster, gpu_pod("b", 2000), "u-3"))["allowed"] is True


async def test_an_init_containers_claim_counts_for_the_pods_life(cluster: Cluster) -> None:
    pod = gpu_pod("a", 2000, init_mem=2500)
    response = await admit(cluster, pod, "u-1")
    created(cluster, pod, response)
    await cluster.until(lambda: cluster.state.dra.reserved() == 0)
    assert cluster.state.quota.namespace_gpu_usage("team") == (4500, 0)
    cluster.store.delete("pods", "a", namespace="team")
    await cluster.until(lambda: cluster.state.quota.namespace_gpu_usage("team") == (0, 0))


async def test_a_reservation_no_pod_takes_expires(cluster: Cluster) -> None:
    assert (await admit(cluster, gpu_pod("a", 4000), "u-1"))["allowed"] is True
    assert cluster.state.quota.namespace_gpu_usage("team") == (4000, 0)
    cluster.clock.now += cluster.config.scheduler.reservation_ttl_s
    assert cluster.state.quota.namespace_gpu_usage("team") == (0, 0)


# --- DraUsage on its own ---------------------------------------------------------------------------

SPEC = {
    "devices": {
        "requests": [
            {
                "name": "gpu",
                "exactly": {"count": 2, "capacity": {"requests": {"memory": "1000Mi", "cores": "10"}}},
            }
        ]
    }
}


def template(name: str, spec: Any = SPEC) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "team", "uid": name, "resourceVersion": "1"},
        "spec": {"spec": spec},
    }


def dra_pod(uid: str, *templates: str, phase: str = "Pending") -> dict[str, Any]:
    claims = [{"name": f"vgpu-{i}", "resourceClaimTemplateName": t} for i, t in enumerate(templates)]
    return {
        "metadata": {"name": uid, "namespace": "team", "uid": uid},
        "spec": {"resourceClaims": claims},
        "status": {"phase": phase},
    }


def usage() -> tuple[DraUsage, Namespaces, FakeClock]:
    namespaces = Namespaces(ResourceNames())
    clock = FakeClock()
    return (
        DraUsage(namespaces, clock=clock, ttl_s=60.0, largest_gpu_memory_mib=lambda: 16000),
        namespaces,
        clock,
    )


def test_pods_listed_before_their_template_are_charged_when_it_comes() -> None:
    dra, namespaces, _ = usage()
    dra.pod(dra_pod("p1", "t", "t"), deleted=False)
    dra.pod(dra_pod("p2", "other"), deleted=False)
    assert namespaces.usage("team") == (0, 0)
    dra.template(informer.Change("ADDED", template("t"), None))
    assert namespaces.usage("team") == (4000, 40)  # two claims of two GPUs, 1000 MiB and 10 each
    dra.template(
        informer.Change(
            "MODIFIED", template("t", {"devices": {"requests": [{"name": "gpu", "exactly": {}}]}}), None
        )
    )
    assert namespaces.usage("team") == (32000, 0)  # a whole GPU per claim, at the largest size
    dra.template(informer.Change("DELETED", template("t"), None))
    assert namespaces.usage("team") == (0, 0)


def test_the_same_event_twice_is_charged_once_and_finished_pods_free() -> None:
    dra, namespaces, _ = usage()
    dra.template(informer.Change("ADDED", template("t"), None))
    for _ in range(2):
        dra.pod(dra_pod("p1", "t"), deleted=False)
    assert namespaces.usage("team") == (2000, 20)
    dra.pod(dra_pod("p1", "t", phase="Failed"), deleted=False)
    assert namespaces.usage("team") == (0, 0)
    dra.pod(dra_pod("p1", "t", phase="Failed"), deleted=True)
    assert namespaces.usage("team") == (0, 0)


def test_a_withdrawn_reservation_is_taken_back() -> None:
    dra, namespaces, _ = usage()
    assert dra.admitted("team", ["t"], [template("t")]) == (2000, 20)
    dra.withdraw("team", ["t"])
    dra.withdraw("team", ["t"])  # nothing left: no change
    assert namespaces.usage("team") == (0, 0) and dra.reserved() == 0


@pytest.mark.parametrize(
    "pod",
    [
        {"metadata": {"uid": "x", "namespace": "team"}, "spec": {"resourceClaims": "junk"}},
        {
            "metadata": {"uid": "x", "namespace": "team"},
            "spec": {"resourceClaims": ["junk", {"resourceClaimTemplateName": 5}]},
        },
        {"metadata": {"uid": "x", "namespace": "team"}, "spec": "junk"},
        {"metadata": {"uid": "x", "namespace": "team"}},
    ],
    ids=["claims-not-a-list", "junk-claims", "spec-not-an-object", "no-spec"],
)
def test_garbage_pods_are_charged_nothing(pod: dict[str, Any]) -> None:
    dra, namespaces, _ = usage()
    dra.template(informer.Change("ADDED", template("t"), None))
    dra.pod(pod, deleted=False)
    assert namespaces.usage("team") == (0, 0)


async def test_a_pod_refused_for_its_template_leaves_no_reservation() -> None:
    c = Cluster(config.load({"webhook": {"defaultMode": "dra", "draTemplateWaitS": 0.05}}))
    c.api = HeldCreates(c.store, clock=c.clock.wall)
    c.store.create(
        "resourcequotas",
        {"metadata": {"name": "gpu"}, "spec": {"hard": {"limits.nvidia.com/gpumem": "5000"}}},
        namespace="team",
    )
    await c.start()
    try:
        refused = await admit(c, gpu_pod("a", 4000), "u-1")
        assert refused["allowed"] is False and refused["status"]["code"] == 503
        assert c.state.quota.namespace_gpu_usage("team") == (0, 0) and c.state.dra.reserved() == 0
    finally:
        assert isinstance(c.api, HeldCreates)
        c.api.release.set()
        await c.stop()


@pytest.mark.parametrize(("cores", "charged"), [(None, 0), ("0", 0), ("30", 30), ("100", 100)])
def test_cores_are_charged_as_the_template_asks_not_the_floor_consumed(
    cores: str | None, charged: int
) -> None:
    """Every share consumes at least 1 % of a GPU's cores (the slice's policy) but HAMi's quota
    counts ``gpucores`` as asked: a claim asking none is charged none."""
    requests: dict[str, str] = {"memory": "1000Mi"}
    if cores is not None:
        requests["cores"] = cores
    spec = {"devices": {"requests": [{"name": "gpu", "exactly": {"capacity": {"requests": requests}}}]}}
    dra, namespaces, _ = usage()
    dra.template(informer.Change("ADDED", template("t", spec), None))
    dra.pod(dra_pod("p1", "t"), deleted=False)
    assert namespaces.usage("team") == (1000, charged)
