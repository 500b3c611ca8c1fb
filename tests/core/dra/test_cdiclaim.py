"""What Prepare makes of a claim: its answer's devices and the CDI spec with HAMi-core's edits
(the extender's Allocate env and mounts), and every claim it must refuse, each with why."""

from __future__ import annotations

from typing import Any

import pytest
from vgpu.core import allocation as hami
from vgpu.core import cdispec
from vgpu.core.config import DevicePluginConfig
from vgpu.core.device import GpuUuid
from vgpu.core.dra import cdiclaim, names

NODE = "node-a"
UID = "0d6f3b1e-1111-2222-3333-444455556666"
UUID_0 = GpuUuid("GPU-aaaa")
UUID_1 = GpuUuid("GPU-bbbb")
GPUS = [
    cdiclaim.Gpu(ref=hami.GpuRef(UUID_0, 0, 0), memory_mib=40960),
    cdiclaim.Gpu(ref=hami.GpuRef(UUID_1, 1, 1), memory_mib=81920),
]
BY_INDEX = cdiclaim.gpus_by_index(GPUS)
REFS = {g.ref.uuid: g.ref for g in GPUS}
CONFIG = DevicePluginConfig()


def result(**extra: Any) -> dict[str, Any]:
    return {"request": "gpu", "driver": names.DRIVER, "pool": NODE, "device": "gpu-0", **extra}


def claim(*results: dict[str, Any], uid: str = UID) -> dict[str, Any]:
    return {
        "metadata": {"name": "c", "namespace": "ns", "uid": uid},
        "status": {"allocation": {"devices": {"results": list(results)}}},
    }


def envs(device: dict[str, Any]) -> dict[str, str]:
    return dict(e.split("=", 1) for e in device["containerEdits"]["env"])


def mounts(device: dict[str, Any]) -> dict[str, str]:
    return {m["containerPath"]: m["hostPath"] for m in device["containerEdits"]["mounts"]}


def test_two_gpus_of_one_request_are_one_cdi_device_named_on_the_first_result() -> None:
    c = claim(
        result(consumedCapacity={"memory": "4Gi", "cores": "30"}, shareID="s-0"),
        result(device="gpu-1", consumedCapacity={"memory": "2000Mi", "cores": "30"}, shareID="s-1"),
    )
    plan = cdiclaim.plan(c, node=NODE, gpus=BY_INDEX, config=CONFIG)
    cdi = f"kube-vgpu.io/claim={UID}-gpu"
    assert plan.devices == (
        cdiclaim.PreparedDevice(
            request="gpu", pool=NODE, device="gpu-0", share_id="s-0", cdi_device_ids=(cdi,)
        ),
        cdiclaim.PreparedDevice(request="gpu", pool=NODE, device="gpu-1", share_id="s-1", cdi_device_ids=()),
    )
    doc = cdiclaim.document(plan, config=DevicePluginConfig(), gpus=REFS, host=hami.HostFacts())
    assert cdispec.validate(doc) == []
    assert doc["kind"] == names.CDI_KIND and doc["cdiVersion"] == "0.5.0"
    (device,) = doc["devices"]
    assert device["name"] == f"{UID}-gpu"
    assert envs(device) == {
        "NVIDIA_VISIBLE_DEVICES": "GPU-aaaa,GPU-bbbb",
        "CUDA_DEVICE_MEMORY_LIMIT_0": "4096m",
        "CUDA_DEVICE_MEMORY_LIMIT_1": "2000m",
        "CUDA_DEVICE_SM_LIMIT": "30",
        "CUDA_DEVICE_MEMORY_SHARED_CACHE": "/usr/local/vgpu/vgpu.cache",
    }
    assert mounts(device) == {
        "/usr/local/vgpu/libvgpu.so": "/usr/local/vgpu/libvgpu.so",
        "/usr/local/vgpu": f"/usr/local/vgpu/claims/{UID}-gpu",
        "/tmp/vgpulock": "/usr/local/vgpu/vgpulock",
        "/etc/ld.so.preload": "/usr/local/vgpu/ld.so.preload",
    }


@pytest.mark.parametrize(
    ("strategy", "id_strategy", "visible", "nvidia_cdi"),
    [
        ("envvar", "uuid", "GPU-aaaa,GPU-bbbb", ()),
        ("envvar", "index", "0,1", ()),
        ("volume-mounts", "uuid", "/var/run/nvidia-container-devices", ()),
        ("cdi-cri", "uuid", None, ("nvidia.com/gpu=GPU-aaaa", "nvidia.com/gpu=GPU-bbbb")),
        ("cdi-annotations", "index", None, ("nvidia.com/gpu=0", "nvidia.com/gpu=1")),
    ],
)
def test_the_edits_are_the_extender_allocate_answer_for_the_same_gpus(
    strategy: str, id_strategy: str, visible: str | None, nvidia_cdi: tuple[str, ...]
) -> None:
    """Same env, mounts and device nodes as ``build_response`` gives a container with these GPUs
    under the same config (its extras included: oversubscription, log level, core policy, GDS,
    device nodes, license); under a CDI strategy NVIDIA's CDI devices ride on the answer's devices."""
    config = DevicePluginConfig(
        device_memory_scaling=2.0,
        lib_cuda_log_level="3",
        disable_core_limit=True,
        gds_enabled=True,
        pass_device_specs=True,
        device_list_strategy=strategy,
        device_id_strategy=id_strategy,
    )
    host = hami.HostFacts(license_present=True, control_devices=("/dev/nvidiactl",))
    c = claim(
        result(consumedCapacity={"memory": "1Gi", "cores": "50"}),
        result(device="gpu-1", consumedCapacity={"memory": "2Gi", "cores": "50"}),
    )
    plan = cdiclaim.plan(c, node=NODE, gpus=BY_INDEX, config=config)
    (device,) = cdiclaim.document(plan, config=config, gpus=REFS, host=host)["devices"]
    extender = hami.build_response(
        plan.requests[0].devices,
        config=config,
        gpus=REFS,
        cache_id="vgpu",
        cache_host_dir=f"/usr/local/vgpu/claims/{UID}-gpu",
        host=host,
    )
    assert envs(device) == extender.envs
    assert envs(device).get("NVIDIA_VISIBLE_DEVICES") == visible
    assert mounts(device) == {m.container_path: m.host_path for m in extender.mounts}
    assert device["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/nvidiactl", "hostPath": "/dev/nvidiactl", "permissions": "rw"},
        {"path": "/dev/nvidia0", "hostPath": "/dev/nvidia0", "permissions": "rw"},
        {"path": "/dev/nvidia1", "hostPath": "/dev/nvidia1", "permissions": "rw"},
    ]
    assert {"CUDA_OVERSUBSCRIBE", "LIBCUDA_LOG_LEVEL", "GPU_CORE_UTILIZATION_POLICY", "NVIDIA_GDS"} <= set(
        envs(device)
    )
    ours = f"kube-vgpu.io/claim={UID}-gpu"
    assert [d.cdi_device_ids for d in plan.devices] == [
        (ours, *nvidia_cdi[:1]),
        tuple(nvidia_cdi[1:]),
    ]


def test_defaulted_capacity_is_the_whole_memory_and_no_sm_limit() -> None:
    plan = cdiclaim.plan(claim(result(device="gpu-1")), node=NODE, gpus=BY_INDEX, config=CONFIG)
    (device,) = cdiclaim.document(plan, config=DevicePluginConfig(), gpus=REFS, host=hami.HostFacts())[
        "devices"
    ]
    assert envs(device)["CUDA_DEVICE_MEMORY_LIMIT_0"] == "81920m"
    assert "CUDA_DEVICE_SM_LIMIT" not in envs(device)


def test_each_request_is_its_own_cdi_device_and_subrequests_answer_their_request() -> None:
    c = claim(
        result(request="small/mem-40960", consumedCapacity={"memory": "1Gi"}),
        result(request="big", device="gpu-1", consumedCapacity={"memory": "8Gi"}),
        result(request="other", driver="gpu.nvidia.com"),  # another driver's result: not ours
    )
    plan = cdiclaim.plan(c, node=NODE, gpus=BY_INDEX, config=CONFIG)
    assert [(d.request, d.cdi_device_ids) for d in plan.devices] == [
        ("small", (f"kube-vgpu.io/claim={UID}-small-mem-40960",)),
        ("big", (f"kube-vgpu.io/claim={UID}-big",)),
    ]
    doc = cdiclaim.document(plan, config=DevicePluginConfig(), gpus=REFS, host=hami.HostFacts())
    assert [d["name"] for d in doc["devices"]] == [f"{UID}-small-mem-40960", f"{UID}-big"]
    assert cdiclaim.cache_dirs(plan, hook_path="/opt/h") == [
        f"/opt/h/vgpu/claims/{UID}-small-mem-40960",
        f"/opt/h/vgpu/claims/{UID}-big",
    ]


def test_results_in_another_pool_are_left_to_that_node() -> None:
    c = claim(result(), result(pool="node-b", device="gpu-1"))
    assert [d.pool for d in cdiclaim.plan(c, node=NODE, gpus=BY_INDEX, config=CONFIG).devices] == [NODE]


def test_spec_file_name_is_the_kind_then_the_uid() -> None:
    assert cdiclaim.spec_file_name(UID) == f"kube-vgpu.io-claim_{UID}.json"


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        ({"metadata": {}}, "no metadata.uid"),
        (claim(uid="../etc"), "not a Kubernetes UID"),
        ({"metadata": {"uid": UID}}, "not allocated"),
        (claim(result(pool="node-b")), "allocated in pool(s) ['node-b']"),
        (claim(result(driver="gpu.nvidia.com")), f"no device of driver {names.DRIVER}"),
        (claim(result(device="gpu-7")), "'gpu-7' (request gpu) is not a GPU of this node"),
        (claim(result(device="gpu-01")), "is not a GPU of this node"),
        (claim(result(device="mig-0")), "is not a GPU of this node"),
        (claim(result(consumedCapacity={"memory": "50Gi"})), "51200 MiB consumed, the GPU has 40960 MiB"),
        (claim(result(consumedCapacity={"memory": "0"})), "0 MiB consumed"),
        (claim(result(consumedCapacity={"cores": "101"})), "cores 101 is not 0-100"),
        (claim(result(consumedCapacity={"memory": "lots"})), "unreadable allocation"),
        ({"metadata": {"uid": UID}, "status": {"allocation": []}}, "unreadable allocation"),
    ],
    ids=[
        "no-uid",
        "unsafe-uid",
        "unallocated",
        "other-node",
        "other-driver",
        "unknown-index",
        "leading-zero",
        "not-a-gpu-name",
        "more-memory-than-the-gpu",
        "no-memory",
        "cores-over-100",
        "bad-quantity",
        "bad-allocation",
    ],
)
def test_garbage_claims_are_refused_with_why(bad: dict[str, Any], why: str) -> None:
    with pytest.raises(cdiclaim.ClaimError, match=None) as caught:
        cdiclaim.plan(bad, node=NODE, gpus=BY_INDEX, config=CONFIG)
    assert why in str(caught.value)
