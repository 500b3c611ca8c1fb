"""Graceful deletion in the store: a bound pod is marked, then removed by a delete with grace 0."""

from __future__ import annotations

import datetime

import pytest
from vgpu.core import errors
from vgpu.localcluster.client import LocalKubeApi
from vgpu.localcluster.store import Store

T0 = datetime.datetime(2027, 1, 1, tzinfo=datetime.UTC)


def _pod(node: str | None) -> dict[str, object]:
    spec: dict[str, object] = {"containers": [{"name": "c"}]}
    if node:
        spec["nodeName"] = node
    return {"metadata": {"name": "p"}, "spec": spec}


async def test_bound_pod_is_marked_then_removed() -> None:
    store = Store(clock=lambda: T0)
    api = LocalKubeApi(store)
    store.create("pods", _pod("n1"), namespace="default")
    watch = store.watch("pods", resource_version=store.resource_version, namespace="default")
    try:
        await api.delete("pods", "p", namespace="default", grace_period_s=30)
        marked = store.get("pods", "p", namespace="default")
        assert marked["metadata"]["deletionTimestamp"] == "2027-01-01T00:00:30Z"
        assert marked["metadata"]["deletionGracePeriodSeconds"] == 30
        rv = marked["metadata"]["resourceVersion"]
        await api.delete("pods", "p", namespace="default", grace_period_s=10)  # already terminating
        assert store.get("pods", "p", namespace="default")["metadata"]["resourceVersion"] == rv
        await api.delete("pods", "p", namespace="default", grace_period_s=0)
        with pytest.raises(errors.NotFound):
            store.get("pods", "p", namespace="default")
        types = []
        async for event in watch:
            types.append(event.type)
            if event.type == "DELETED":
                break
        assert types == ["MODIFIED", "MODIFIED", "DELETED"]  # marked with grace 30, then with 0, then gone
    finally:
        watch.close()


@pytest.mark.parametrize("grace", [None, 0, 30])
async def test_unbound_pod_or_no_grace_is_removed_at_once(grace: int | None) -> None:
    store = Store(clock=lambda: T0)
    store.create("pods", _pod(None if grace else "n1"), namespace="default")
    await LocalKubeApi(store).delete("pods", "p", namespace="default", grace_period_s=grace)
    assert store.list("pods").items == []


def test_priority_class_resolves_spec_priority_and_unknown_class_is_forbidden() -> None:
    store = Store(clock=lambda: T0)
    store.create(
        "priorityclasses", {"metadata": {"name": "high"}, "value": 1000, "preemptionPolicy": "Never"}
    )
    body = _pod(None)
    body["spec"]["priorityClassName"] = "high"  # type: ignore[index]
    pod = store.create("pods", body, namespace="default")
    assert (pod["spec"]["priority"], pod["spec"]["preemptionPolicy"]) == (1000, "Never")
    body = _pod(None)
    body["metadata"] = {"name": "q"}
    body["spec"]["priorityClassName"] = "missing"  # type: ignore[index]
    with pytest.raises(errors.KubeError, match="no PriorityClass with name missing"):
        store.create("pods", body, namespace="default")
    store.create("priorityclasses", {"metadata": {"name": "default"}, "value": 5, "globalDefault": True})
    body = _pod(None)
    body["metadata"] = {"name": "r"}
    assert store.create("pods", body, namespace="default")["spec"]["priority"] == 5
