# mypy: disable-error-code="union-attr,no-untyped-call,arg-type,index"
"""The pods/eviction subresource as kube-apiserver's EvictionREST answers it: budgets checked
(429 when one allows no disruption, used up when one does), over HTTP and directly."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from vgpu.core import errors
from vgpu.kube import aioapi
from vgpu.localcluster.apiserver import ApiServer
from vgpu.localcluster.client import LocalKubeApi
from vgpu.localcluster.store import Store


def running(
    store: Store, name: str, *, labels: dict[str, str] | None = None, grace: int | None = None
) -> Any:
    spec: dict[str, Any] = {"nodeName": "n1", "containers": [{"name": "c", "image": "busybox"}]}
    if grace is not None:
        spec["terminationGracePeriodSeconds"] = grace
    pod = store.create(
        "pods", {"metadata": {"name": name, "labels": labels or {}}, "spec": spec}, namespace="default"
    )
    store.update("pods", {**pod, "status": {"phase": "Running"}}, namespace="default", subresource="status")
    return pod


def budget(store: Store, name: str, allowed: int, selector: dict[str, Any] | None) -> None:
    spec: dict[str, Any] = {"minAvailable": 1}
    if selector is not None:
        spec["selector"] = selector
    made = store.create(
        "poddisruptionbudgets", {"metadata": {"name": name}, "spec": spec}, namespace="default"
    )
    store.update(
        "poddisruptionbudgets",
        {**made, "status": {"disruptionsAllowed": allowed, "observedGeneration": 1}},
        namespace="default",
        subresource="status",
    )


@pytest.fixture
async def server() -> AsyncIterator[ApiServer]:
    async with ApiServer(Store()) as srv:
        yield srv


async def test_an_eviction_a_budget_allows_uses_it_up_and_deletes_with_the_pods_grace(
    server: ApiServer,
) -> None:
    store = server.store
    running(store, "a", labels={"app": "web"}, grace=7)
    running(store, "b", labels={"app": "web"})
    budget(store, "web", 1, {"matchLabels": {"app": "web"}})
    async with aioapi.AioKubeApi(server.url) as api:
        await api.evict_pod("default", "a")
        gone = store.get("pods", "a", namespace="default")["metadata"]
        assert gone["deletionTimestamp"] and gone["deletionGracePeriodSeconds"] == 7
        status = store.get("poddisruptionbudgets", "web", namespace="default")["status"]
        assert status["disruptionsAllowed"] == 0 and list(status["disruptedPods"]) == ["a"]
        with pytest.raises(errors.TooManyRequests, match="would violate the pod's disruption budget") as exc:
            await api.evict_pod("default", "b")
        assert exc.value.status == 429
        assert not store.get("pods", "b", namespace="default")["metadata"].get("deletionTimestamp")


@pytest.mark.parametrize(
    ("selector", "labels", "evicted"),
    [
        (None, {"app": "web"}, True),  # a null selector selects nothing
        ({}, {"app": "web"}, False),  # an empty one selects every pod of the namespace
        ({"matchLabels": {"app": "db"}}, {"app": "web"}, True),
        ({"matchExpressions": [{"key": "app", "operator": "In", "values": ["web"]}]}, {"app": "web"}, False),
        ({"matchLabels": {"app": "web"}}, {}, True),  # no labels: no budget
    ],
    ids=["null-selector", "empty-selector", "other-labels", "expression", "unlabelled"],
)
async def test_which_budgets_guard_a_pod(selector: Any, labels: dict[str, str], evicted: bool) -> None:
    store = Store()
    api = LocalKubeApi(store)
    running(store, "a", labels=labels)
    budget(store, "guard", 0, selector)
    if evicted:
        await api.evict_pod("default", "a", grace_period_s=0)
        with pytest.raises(errors.NotFound):
            store.get("pods", "a", namespace="default")
    else:
        with pytest.raises(errors.TooManyRequests):
            await api.evict_pod("default", "a", grace_period_s=0)


async def test_pending_finished_and_terminating_pods_skip_the_budget() -> None:
    store = Store()
    api = LocalKubeApi(store)
    budget(store, "all", 0, {})
    store.create(
        "pods", {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c"}]}}, namespace="default"
    )
    await api.evict_pod("default", "p")  # Pending
    with pytest.raises(errors.NotFound):
        store.get("pods", "p", namespace="default")


async def test_two_budgets_uid_preconditions_and_garbage(server: ApiServer) -> None:
    store = server.store
    running(store, "a", labels={"app": "web"})
    budget(store, "one", 1, {"matchLabels": {"app": "web"}})
    budget(store, "two", 1, {})
    async with aioapi.AioKubeApi(server.url) as api:
        with pytest.raises(errors.KubeError, match="more than one PodDisruptionBudget") as exc:
            await api.evict_pod("default", "a")
        assert exc.value.status == 500
        with pytest.raises(errors.Conflict, match="Precondition failed: UID"):
            await api.evict_pod("default", "a", uid="not-its-uid")
        with pytest.raises(errors.NotFound):
            await api.evict_pod("default", "nobody")
        for body, why in (
            ([1], "Eviction body must be a JSON object"),
            ({"metadata": {"name": "other"}}, "does not match name in Eviction"),
            ({"deleteOptions": "now"}, "deleteOptions must be an object"),
            ({"deleteOptions": {"gracePeriodSeconds": -1}}, "gracePeriodSeconds"),
        ):
            with pytest.raises(errors.KubeError, match=why) as bad:
                await api.request("POST", "/api/v1/namespaces/default/pods/a/eviction", body=body)
            assert bad.value.status == 400
        with pytest.raises(errors.NotFound):  # only pods have the subresource, only POST
            await api.request("POST", "/api/v1/nodes/n1/eviction", body={})
