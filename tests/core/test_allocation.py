"""Pure Allocate decisions: pending-pod choice, container entry selection, preferred IDs, responses."""

import dataclasses
from typing import Any

import pytest
from vgpu.core import allocation, annotations, errors
from vgpu.core.config import DevicePluginConfig
from vgpu.core.device import GpuUuid

KEYS = annotations.Keys()
REFS = {
    GpuUuid("GPU-a"): allocation.GpuRef(GpuUuid("GPU-a"), 0, 0),
    GpuUuid("GPU-b"): allocation.GpuRef(GpuUuid("GPU-b"), 1, 3),
}


def pod(
    name: str = "p",
    *,
    to_allocate: str | None = "GPU-a,NVIDIA,3000,50:;",
    phase: str = "allocating",
    node: str = "n1",
    bind_time: str | None = "100",
    containers: tuple[str, ...] = ("main",),
    init: tuple[str, ...] = (),
    status: str = "Pending",
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    notes = {KEYS.bind_phase: phase, KEYS.assigned_node: node}
    if bind_time is not None:
        notes[KEYS.bind_time] = bind_time
    if to_allocate is not None:
        notes[KEYS.devices_to_allocate] = to_allocate
    envs = [{"name": k, "value": v} for k, v in (env or {}).items()]
    return {
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}", "annotations": notes},
        "spec": {
            "nodeName": node,
            "initContainers": [{"name": c} for c in init],
            "containers": [{"name": c, "env": envs} for c in containers],
        },
        "status": {"phase": status},
    }


@pytest.mark.parametrize(
    ("changes", "pending"),
    [
        ({}, True),
        ({"phase": "success"}, False),
        ({"phase": "failed"}, False),
        ({"node": "n2"}, False),
        ({"bind_time": None}, False),
        ({"status": "Running"}, False),
    ],
    ids=["pending", "success", "failed", "other-node", "no-bind-time", "running"],
)
def test_is_pending_on(changes: dict[str, Any], pending: bool) -> None:
    assert allocation.is_pending_on(pod(**changes), node="n1", keys=KEYS) is pending


@pytest.mark.parametrize(
    "status",
    [
        pytest.param({}, id="no-phase"),
        pytest.param(None, id="status-null"),
        pytest.param({"phase": ""}, id="empty-phase"),
        pytest.param({"phase": "pending"}, id="lowercase"),
        pytest.param("Pending", id="status-not-an-object"),
        pytest.param(["Pending"], id="status-a-list"),
    ],
)
def test_a_pod_without_a_pending_phase_is_not_pending(status: Any) -> None:
    body = pod()
    body["status"] = status
    assert allocation.is_pending_on(body, node="n1", keys=KEYS) is False
    without = pod()
    del without["status"]
    assert allocation.is_pending_on(without, node="n1", keys=KEYS) is False
    assert allocation.oldest_pending([body, without], node="n1", keys=KEYS) is None


def test_oldest_pending_by_bind_time() -> None:
    pods = [
        pod("new", bind_time="300"),
        pod("old", bind_time="100"),
        pod("done", phase="success", bind_time="1"),
    ]
    chosen = allocation.oldest_pending(pods, node="n1", keys=KEYS)
    assert chosen is not None and chosen["metadata"]["name"] == "old"
    assert allocation.oldest_pending([pod(phase="success")], node="n1", keys=KEYS) is None


def test_select_target_pops_the_first_non_empty_entry() -> None:
    p = pod(
        to_allocate=";GPU-a,NVIDIA,1000,30:;GPU-b,NVIDIA,2000,30:;", init=("init",), containers=("c1", "c2")
    )
    target = allocation.select_target(p, keys=KEYS, device_count=1)
    assert (target.container, target.entry_index, target.pod_uid) == ("c1", 1, "uid-p")
    assert target.devices == (annotations.ContainerDevice(GpuUuid("GPU-a"), 1000, 30),)
    assert annotations.encode_pod_devices(target.remaining) == ";;GPU-b,NVIDIA,2000,30:;"
    assert not target.done
    last = allocation.select_target(
        pod(to_allocate=annotations.encode_pod_devices(target.remaining), containers=("a", "b", "c")),
        keys=KEYS,
        device_count=1,
    )
    assert last.container == "c" and last.done


@pytest.mark.parametrize(
    ("to_allocate", "count", "message"),
    [
        (None, 1, "is missing"),
        ("GPU-a,NVIDIA,lots,50:;", 1, "invalid integer"),
        ("GPU-a,NVIDIA:;", 1, "missing fields"),
        (";;", 1, "no container is waiting"),
        ("GPU-a,NVIDIA,1,1:;", 2, "device number not matched"),
        (";;GPU-a,NVIDIA,1,1:;", 1, "has no container"),
    ],
    ids=["missing", "garbage-mem", "short", "nothing-left", "count-mismatch", "beyond-containers"],
)
def test_select_target_errors_name_the_pod(to_allocate: str | None, count: int, message: str) -> None:
    with pytest.raises(errors.AllocationError, match="pod default/p") as info:
        allocation.select_target(pod(to_allocate=to_allocate), keys=KEYS, device_count=count)
    assert message in str(info.value)


DIGITS = "GPU-11111111-2222-3333-4444-123456789012"
DIGITS_HEAD = "GPU-11111111-2222-3333-4444"


def cd(uuid: str, mem: int = 1000, cores: int = 30) -> annotations.ContainerDevice:
    return annotations.ContainerDevice(GpuUuid(uuid), mem, cores)


@pytest.mark.parametrize(
    ("entry", "available", "must", "size", "want"),
    [
        ((cd("GPU-a"),), ["GPU-b-0", "GPU-a-3", "GPU-a-1"], [], 1, ["GPU-a-3"]),
        ((cd("GPU-a"), cd("GPU-b")), ["GPU-a-0", "GPU-b-0"], [], 2, ["GPU-a-0", "GPU-b-0"]),
        ((cd("GPU-a"),), ["GPU-a-0", "GPU-a-1"], ["GPU-a-1"], 1, ["GPU-a-1"]),
        ((cd("GPU-a"),), ["GPU-b-0"], [], 1, []),
        ((cd("GPU-a"),), ["GPU-a-0"], [], 2, []),
        # a plain UUID whose last group is all digits is a whole GPU, not slot 123456789012 of
        # "GPU-1111...-1111": only IDs built from an assigned UUID have a slot suffix
        ((cd(DIGITS),), [DIGITS_HEAD + "-0", DIGITS], [], 1, [DIGITS]),
        ((cd("GPU-a"),), ["GPU-a-01", "GPU-a--1", "GPU-a-x"], [], 1, []),
    ],
    ids=[
        "one",
        "two",
        "must-include",
        "no-match",
        "size-mismatch",
        "digit-uuid-is-whole",
        "not-our-ids",
    ],
)
def test_preferred_ids(entry, available, must, size, want) -> None:
    assert allocation.preferred_ids(entry, available=available, must_include=must, size=size) == want


def response(devices, **config_changes) -> allocation.ContainerAllocation:
    cfg = dataclasses.replace(DevicePluginConfig(), **config_changes)
    return allocation.build_response(
        tuple(devices),
        config=cfg,
        gpus=REFS,
        cache_id="cid",
        cache_host_dir="/usr/local/vgpu/containers/uid_main",
        host=allocation.HostFacts(control_devices=("/dev/nvidiactl", "/dev/nvidia-uvm")),
    )


def test_one_gpu_response_env_and_mounts() -> None:
    r = response([cd("GPU-a", 3000, 50)])
    assert r.envs == {
        "NVIDIA_VISIBLE_DEVICES": "GPU-a",
        "CUDA_DEVICE_MEMORY_LIMIT_0": "3000m",
        "CUDA_DEVICE_SM_LIMIT": "50",
        "CUDA_DEVICE_MEMORY_SHARED_CACHE": "/usr/local/vgpu/cid.cache",
    }
    assert r.mounts == (
        allocation.Mount("/usr/local/vgpu/libvgpu.so", "/usr/local/vgpu/libvgpu.so", True),
        allocation.Mount("/usr/local/vgpu", "/usr/local/vgpu/containers/uid_main", False),
        allocation.Mount("/tmp/vgpulock", "/usr/local/vgpu/vgpulock", False),
        allocation.Mount("/etc/ld.so.preload", "/usr/local/vgpu/ld.so.preload", True),
    )
    assert r.devices == () and r.annotations == {} and r.cdi_devices == ()


def test_two_gpus_and_hami_switches() -> None:
    r = response(
        [cd("GPU-a", 4000, 30), cd("GPU-b", 5000, 30)],
        device_memory_scaling=2.0,
        lib_cuda_log_level="3",
        disable_core_limit=True,
        hook_path="/opt/hami/",
    )
    assert r.envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-a,GPU-b"
    assert (r.envs["CUDA_DEVICE_MEMORY_LIMIT_0"], r.envs["CUDA_DEVICE_MEMORY_LIMIT_1"]) == ("4000m", "5000m")
    assert r.envs["CUDA_OVERSUBSCRIBE"] == "true"
    assert r.envs["LIBCUDA_LOG_LEVEL"] == "3"
    assert r.envs["GPU_CORE_UTILIZATION_POLICY"] == "disable"
    assert r.envs["CUDA_DEVICE_MEMORY_SHARED_CACHE"] == "/opt/hami/vgpu/cid.cache"
    assert r.mounts[0].container_path == "/opt/hami/vgpu/libvgpu.so"


def test_preload_is_always_mounted_and_license_adds_mounts() -> None:
    r = allocation.build_response(
        (cd("GPU-a"),),
        config=DevicePluginConfig(),
        gpus=REFS,
        cache_id="c",
        cache_host_dir="/h",
        host=allocation.HostFacts(license_present=True),
    )
    paths = [m.container_path for m in r.mounts]
    assert "/etc/ld.so.preload" in paths  # nothing of the pod's can leave HAMi-core out
    assert "/tmp/license" in paths and "/usr/bin/vgpuvalidator" in paths


def test_unknown_gpu_is_an_error() -> None:
    with pytest.raises(errors.AllocationError, match="GPU-zzz is not on this node"):
        response([cd("GPU-zzz")])


# issue 9: device list strategy and ID strategy, device specs, GDS/MOFED/GDRCOPY
@pytest.mark.parametrize(
    ("changes", "envs", "mounts", "notes", "cdi"),
    [
        ({}, {"NVIDIA_VISIBLE_DEVICES": "GPU-a,GPU-b"}, [], {}, ()),
        ({"device_id_strategy": "index"}, {"NVIDIA_VISIBLE_DEVICES": "0,1"}, [], {}, ()),
        (
            {"device_list_strategy": "volume-mounts"},
            {"NVIDIA_VISIBLE_DEVICES": "/var/run/nvidia-container-devices"},
            [
                allocation.Mount("/var/run/nvidia-container-devices/GPU-a", "/dev/null", False),
                allocation.Mount("/var/run/nvidia-container-devices/GPU-b", "/dev/null", False),
            ],
            {},
            (),
        ),
        (
            {"device_list_strategy": "cdi-annotations", "device_id_strategy": "index"},
            {},
            [],
            {"cdi.k8s.io/vgpu-device-plugin_rid": "nvidia.com/gpu=0,nvidia.com/gpu=1"},
            (),
        ),
        (
            {"device_list_strategy": "cdi-cri"},
            {},
            [],
            {},
            ("nvidia.com/gpu=GPU-a", "nvidia.com/gpu=GPU-b"),
        ),
        (
            {"gds_enabled": True, "mofed_enabled": True, "gdrcopy_enabled": True},
            {
                "NVIDIA_VISIBLE_DEVICES": "GPU-a,GPU-b",
                "NVIDIA_GDS": "enabled",
                "NVIDIA_MOFED": "enabled",
                "NVIDIA_GDRCOPY": "enabled",
            },
            [],
            {},
            (),
        ),
    ],
    ids=[
        "envvar-uuid",
        "envvar-index",
        "volume-mounts",
        "cdi-annotations-index",
        "cdi-cri",
        "gds-mofed-gdrcopy",
    ],
)
def test_device_list_options(changes, envs, mounts, notes, cdi) -> None:
    cfg = dataclasses.replace(DevicePluginConfig(), **changes)
    ids = [str(r.index) if cfg.device_id_strategy == "index" else r.uuid for r in REFS.values()]
    r = allocation.passthrough_response(ids, list(REFS.values()), config=cfg, response_id="rid")
    assert (r.envs, list(r.mounts), r.annotations, r.cdi_devices) == (envs, mounts, notes, cdi)


def test_pass_device_specs_lists_present_control_nodes_and_gpu_minors() -> None:
    cfg = dataclasses.replace(DevicePluginConfig(), pass_device_specs=True)
    r = allocation.passthrough_response(
        ["GPU-a", "GPU-b"],
        list(REFS.values()),
        config=cfg,
        response_id="x",
        host=allocation.HostFacts(control_devices=("/dev/nvidia-uvm", "/dev/nvidiactl")),
    )
    assert [d.container_path for d in r.devices] == [
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia0",
        "/dev/nvidia3",
    ]
    assert all(d.permissions == "rw" and d.host_path == d.container_path for d in r.devices)
