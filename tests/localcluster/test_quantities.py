"""The emulated API server stores quantities as kube-apiserver does: in canonical form, in every
Quantity field of the kinds it serves; a string that is not a quantity is a 400."""

from __future__ import annotations

import pytest
from vgpu.core import errors
from vgpu.localcluster.store import Store


def _pod(limits: dict[str, object], *, init: bool = False) -> dict[str, object]:
    container = {"name": "c", "image": "x", "resources": {"limits": limits, "requests": dict(limits)}}
    spec = {"containers": [container], "initContainers": [dict(container, name="i")] if init else []}
    return {"metadata": {"name": "p"}, "spec": spec}


def test_pod_limits_and_requests_are_stored_canonical() -> None:
    store = Store()
    got = store.create(
        "pods",
        _pod({"nvidia.com/gpumem": "2000", "cpu": "0.5", "memory": "2048Mi"}, init=True),
        namespace="d",
    )
    for container in got["spec"]["containers"] + got["spec"]["initContainers"]:
        for field in ("limits", "requests"):
            assert container["resources"][field] == {
                "nvidia.com/gpumem": "2k",
                "cpu": "500m",
                "memory": "2Gi",
            }
    assert (
        store.get("pods", "p", namespace="d")["spec"]["containers"][0]["resources"]["limits"]["cpu"] == "500m"
    )


def test_node_status_and_quota_are_stored_canonical_through_every_write() -> None:
    store = Store()
    store.create("nodes", {"metadata": {"name": "n"}})
    store.patch(
        "nodes",
        "n",
        {"status": {"allocatable": {"nvidia.com/gpu": "20", "memory": "1024Ki"}}},
        subresource="status",
    )
    assert store.get("nodes", "n")["status"]["allocatable"] == {"nvidia.com/gpu": "20", "memory": "1Mi"}
    quota = {"metadata": {"name": "q"}, "spec": {"hard": {"limits.nvidia.com/gpumem": "100000"}}}
    store.create("resourcequotas", quota, namespace="d")
    assert store.get("resourcequotas", "q", namespace="d")["spec"]["hard"] == {
        "limits.nvidia.com/gpumem": "100k"
    }
    updated = store.get("resourcequotas", "q", namespace="d")
    updated["spec"]["hard"]["limits.nvidia.com/gpumem"] = 3000
    assert store.update("resourcequotas", updated, namespace="d")["spec"]["hard"] == {
        "limits.nvidia.com/gpumem": "3k"
    }


@pytest.mark.parametrize("garbage", ["x", "4GB", "", "1.2.3", True, None, [1], {"a": 1}])
def test_a_value_that_is_not_a_quantity_is_refused_with_400_and_nothing_stored(garbage: object) -> None:
    store = Store()
    with pytest.raises(errors.KubeError) as refused:
        store.create("pods", _pod({"nvidia.com/gpu": garbage}), namespace="d")
    assert refused.value.status == 400
    assert "spec.containers[0].resources.limits[nvidia.com/gpu]" in str(refused.value)
    assert store.list("pods", namespace="d").items == []


def test_shapes_that_carry_no_quantities_are_left_alone() -> None:
    """Wrong shapes are validation's to judge (or kube-apiserver's decoder's), not this pass's."""
    store = Store()
    got = store.create(
        "pods",
        {
            "metadata": {"name": "p"},
            "spec": {"containers": [{"name": "c", "image": "x", "resources": {"limits": None}}]},
        },
        namespace="d",
    )
    assert got["spec"]["containers"][0]["resources"] == {"limits": None}
