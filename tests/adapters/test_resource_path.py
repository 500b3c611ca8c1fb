"""port.resource_path: the REST paths both API adapters (official client, aiohttp) build from one table."""

from __future__ import annotations

import pytest
from vgpu.core import errors
from vgpu.kube import aioapi, port


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("nodes", None), "/api/v1/nodes"),
        (("nodes", None, "n1"), "/api/v1/nodes/n1"),
        (("pods", "ns", "p/1", "binding"), "/api/v1/namespaces/ns/pods/p%2F1/binding"),
        (("pods", None), "/api/v1/pods"),  # every namespace
        (("leases", "kube-vgpu", "l"), "/apis/coordination.k8s.io/v1/namespaces/kube-vgpu/leases/l"),
        (("poddisruptionbudgets", "a b"), "/apis/policy/v1/namespaces/a%20b/poddisruptionbudgets"),
        (
            ("resourceslices", None, "n1-gpu.kube-vgpu.io"),
            "/apis/resource.k8s.io/v1/resourceslices/n1-gpu.kube-vgpu.io",
        ),
        (("deviceclasses", None), "/apis/resource.k8s.io/v1/deviceclasses"),
    ],
)
def test_paths(args: tuple[str, ...], expected: str) -> None:
    assert port.resource_path(*args) == expected


def test_an_unknown_kind_and_a_namespaced_object_without_namespace_are_refused() -> None:
    with pytest.raises(errors.KubeError) as unknown:
        port.resource_path("secrets", "ns", "s")
    with pytest.raises(errors.KubeError) as no_namespace:
        port.resource_path("pods", None, "p")
    assert (unknown.value.status, no_namespace.value.status) == (404, 400)


async def test_the_aiohttp_adapter_refuses_before_sending() -> None:
    api = aioapi.AioKubeApi("http://127.0.0.1:9")  # nothing listens: a request would fail with status 0
    try:
        with pytest.raises(errors.KubeError) as exc:
            await api.get("pods", "p")
        assert exc.value.status == 400
    finally:
        await api.close()


def test_resource_claim_path_is_resource_k8s_io_v1_and_quoted() -> None:
    assert (
        port.resource_claim_path("ns", "vgpu-0")
        == "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/vgpu-0"
    )
    assert (
        port.resource_claim_path("a b", "c/d")
        == "/apis/resource.k8s.io/v1/namespaces/a%20b/resourceclaims/c%2Fd"
    )
