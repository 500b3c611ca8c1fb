"""Container and pod GPU requests parsed from resources and annotations."""

from __future__ import annotations

from typing import Any

import pytest
from vgpu.core import config, errors, request
from vgpu.core.request import ContainerRequest

CFG = config.load(None)


def ctr(
    name: str = "main", limits: dict[str, Any] | None = None, requests: dict[str, Any] | None = None
) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if limits is not None:
        resources["limits"] = limits
    if requests is not None:
        resources["requests"] = requests
    return {"name": name, "resources": resources}


@pytest.mark.parametrize(
    ("container", "expected"),
    [
        (ctr(limits={"cpu": "1"}), None),
        (ctr(limits={"nvidia.com/gpu": "1"}), ContainerRequest("main", 1, 0, 100, 0)),
        (
            ctr(limits={"nvidia.com/gpu": 2, "nvidia.com/gpumem": "3000"}),
            ContainerRequest("main", 2, 3000, None, 0),
        ),
        (
            ctr(limits={"nvidia.com/gpu": 1, "nvidia.com/gpumem": "4Gi"}),
            ContainerRequest("main", 1, 4096, None, 0),
        ),
        (
            ctr(
                limits={
                    "nvidia.com/gpu": 1,
                    "nvidia.com/gpumem-percentage": "50",
                    "nvidia.com/gpucores": "30",
                }
            ),
            ContainerRequest("main", 1, 0, 50, 30),
        ),
        # memory wins over percentage
        (
            ctr(limits={"nvidia.com/gpu": 1, "nvidia.com/gpumem": 100, "nvidia.com/gpumem-percentage": 50}),
            ContainerRequest("main", 1, 100, None, 0),
        ),
        # requests are read when limits lack the resource
        (
            ctr(requests={"nvidia.com/gpu": "1", "nvidia.com/gpumem": "10"}),
            ContainerRequest("main", 1, 10, None, 0),
        ),
        (
            ctr(limits={"nvidia.com/gpu": 1, "nvidia.com/priority": 1}),
            ContainerRequest("main", 1, 0, 100, 0, 1),
        ),
        (ctr(limits={"nvidia.com/priority": 1}), None),
        (ctr(limits={"nvidia.com/gpu": 0}), None),
    ],
    ids=[
        "cpu-only",
        "bare-count",
        "mib",
        "gi-suffix",
        "percent-cores",
        "mib-wins",
        "requests",
        "priority",
        "priority-only",
        "zero-count",
    ],
)
def test_parse_container(container: dict[str, Any], expected: ContainerRequest | None) -> None:
    assert request.parse_container(container, CFG) == expected


@pytest.mark.parametrize(
    ("container", "field", "message"),
    [
        (ctr(limits={"nvidia.com/gpu": "-1"}), "nvidia.com/gpu", "must not be negative"),
        (ctr(limits={"nvidia.com/gpu": "1.5"}), "nvidia.com/gpu", "whole number"),
        (ctr(limits={"nvidia.com/gpu": "lots"}), "nvidia.com/gpu", "invalid quantity"),
        (
            ctr(limits={"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 101}),
            "gpumem-percentage",
            "between 0 and 100",
        ),
        (
            ctr(limits={"nvidia.com/gpu": 1, "nvidia.com/gpucores": 150}),
            "nvidia.com/gpucores",
            "between 0 and 100",
        ),
        (
            ctr(limits={"nvidia.com/gpu": 1, "nvidia.com/gpumem": "16GB"}),
            "nvidia.com/gpumem",
            "invalid quantity",
        ),
        (ctr(limits={"nvidia.com/gpu": 0, "nvidia.com/gpumem": 10}), "nvidia.com/gpu", "with 0 GPUs"),
        ({"name": "main", "resources": "lots"}, "resources", "expected an object"),
        (ctr(limits={"nvidia.com/gpu": 1, "nvidia.com/priority": 2}), "nvidia.com/priority", "0 (high) or 1"),
        (
            ctr(limits={"nvidia.com/gpu": 1, "nvidia.com/priority": "1e308"}),
            "nvidia.com/priority",
            "out of range",
        ),
        (ctr(limits={"nvidia.com/gpu": 1, "nvidia.com/gpumem": "1e999999999"}), "gpumem", "out of range"),
    ],
)
def test_parse_container_garbage_names_container_and_field(
    container: dict[str, Any], field: str, message: str
) -> None:
    with pytest.raises(errors.ParseError) as info:
        request.parse_container(container, CFG)
    assert "container main" in info.value.field
    assert field in info.value.field
    assert message in str(info.value)


def test_memory_without_gpu_is_an_error_when_default_count_is_zero() -> None:
    cfg = config.load({"webhook": {"defaultGpuCount": 0}})
    with pytest.raises(errors.RequestError, match="without any GPU"):
        request.parse_container(ctr(limits={"nvidia.com/gpumem": 10}), cfg, default_count=True)


@pytest.mark.parametrize(
    "limits",
    [{"nvidia.com/gpumem": "1000"}, {"nvidia.com/gpucores": "30"}, {"nvidia.com/gpumem-percentage": "50"}],
    ids=["memory", "cores", "percent"],
)
def test_a_gpu_resource_without_a_count_gets_the_default_only_as_the_webhook_reads_it(
    limits: dict[str, str],
) -> None:
    """The webhook gives such a container the default count (and writes it into the pod). Kubelet
    calls Allocate only for a container with the count in its limits, so read as the scheduler
    reads it, a pod the webhook never saw is refused, not placed."""
    got = request.parse_container(ctr(limits=limits), CFG, default_count=True)
    assert got is not None and got.count == 1
    with pytest.raises(errors.RequestError, match="without a GPU count") as info:
        request.parse_container(ctr(limits=limits), CFG)
    assert info.value.field == "container main: nvidia.com/gpu"
    with pytest.raises(errors.RequestError, match="without a GPU count"):
        request.parse_pod({"spec": {"containers": [ctr(limits=limits)]}}, CFG)


def test_defaults_and_memory_factor_apply() -> None:
    cfg = config.load({"webhook": {"defaultMemoryMib": 2048, "defaultCores": 20, "memoryFactor": 2}})
    assert request.parse_container(ctr(limits={"nvidia.com/gpu": 1}), cfg) == ContainerRequest(
        "main", 1, 2048, None, 20
    )
    assert request.parse_container(ctr(limits={"nvidia.com/gpu": 1, "nvidia.com/gpumem": 100}), cfg) == (
        ContainerRequest("main", 1, 200, None, 20)
    )


def test_memory_on_a_gpu() -> None:
    assert ContainerRequest("c", 1, memory_mib=3000).memory_on(40960) == 3000
    assert ContainerRequest("c", 1, memory_percent=25).memory_on(40960) == 10240
    assert ContainerRequest("c", 1, memory_percent=None).memory_on(15109) == 15109


def test_parse_pod_aligns_init_and_app_containers_and_reads_annotations() -> None:
    pod = {
        "metadata": {
            "annotations": {
                "nvidia.com/use-gputype": "A100, H100",
                "nvidia.com/nouse-gputype": "mig",
                "nvidia.com/use-gpuuuid": "GPU-a,GPU-b",
                "nvidia.com/nouse-gpuuuid": "GPU-b",
                "hami.io/node-scheduler-policy": "spread",
                "hami.io/gpu-scheduler-policy": "binpack",
            }
        },
        "spec": {
            "initContainers": [ctr("init", limits={"nvidia.com/gpu": 1, "nvidia.com/gpumem": 100})],
            "containers": [
                ctr("sidecar"),
                ctr("main", limits={"nvidia.com/gpu": 1, "nvidia.com/gpucores": 50}),
            ],
        },
    }
    req = request.parse_pod(pod, CFG)
    assert req.init_count == 1
    assert [c.name if c else None for c in req.containers] == ["init", None, "main"]
    assert req.wants_gpu
    sel = req.selectors
    assert sel.type_ok("NVIDIA-A100-SXM4-40GB") and sel.type_ok("NVIDIA H100 80GB")
    assert not sel.type_ok("NVIDIA-Tesla T4") and not sel.type_ok("NVIDIA A100 MIG 1g.5gb")
    assert sel.uuid_ok("GPU-a") and not sel.uuid_ok("GPU-b") and not sel.uuid_ok("GPU-c")
    assert req.node_policy is config.Policy.SPREAD and req.gpu_policy is config.Policy.BINPACK


def test_parse_pod_marks_restartable_init_containers_as_sidecars() -> None:
    gpu = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 100}
    pod = {
        "spec": {
            "initContainers": [
                ctr("setup", limits=gpu),
                {**ctr("proxy", limits=gpu), "restartPolicy": "Always"},
                {**ctr("odd"), "restartPolicy": "Never"},  # only Always makes a sidecar
            ],
            "containers": [ctr("main", limits=gpu)],
        }
    }
    req = request.parse_pod(pod, CFG)
    assert req.init_count == 3 and req.sidecars == frozenset({1})
    assert request.parse_pod({"spec": {"containers": [ctr("main", limits=gpu)]}}, CFG).sidecars == frozenset()
    assert request.sidecar_indices("garbage") == frozenset()
    assert request.sidecar_indices([5, {"restartPolicy": "Always"}]) == frozenset({1})


def test_parse_pod_garbage() -> None:
    with pytest.raises(errors.RequestError, match="unknown policy"):
        request.parse_pod(
            {"metadata": {"annotations": {"hami.io/node-scheduler-policy": "x"}}, "spec": {}}, CFG
        )
    with pytest.raises(errors.RequestError):
        request.parse_pod({"spec": {"containers": "nope"}}, CFG)
    with pytest.raises(errors.RequestError):
        request.parse_pod({"spec": {"containers": [5]}}, CFG)
    assert not request.parse_pod({"spec": {"containers": [ctr()]}}, CFG).wants_gpu
    with pytest.raises(errors.RequestError, match=r"annotations\['nvidia.com/use-gputype'\].*got int"):
        request.parse_pod({"metadata": {"annotations": {"nvidia.com/use-gputype": 3}}, "spec": {}}, CFG)
