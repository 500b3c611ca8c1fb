"""kube-vgpu's own CDI spec (vgpu.core.cdispec) and how the Allocate answer names it (allocation)."""

import copy
import dataclasses
from typing import Any

import pytest
from vgpu.core import allocation, annotations, cdispec
from vgpu.core.config import DevicePluginConfig
from vgpu.core.device import GpuUuid

REFS = {GpuUuid("GPU-a"): allocation.GpuRef(GpuUuid("GPU-a"), 0, 0)}
HOOK_FILES = {"/usr/local/vgpu/libvgpu.so", "/usr/local/vgpu/ld.so.preload", "/usr/local/vgpu/vgpulock"}


def cfg(**changes: Any) -> DevicePluginConfig:
    return dataclasses.replace(DevicePluginConfig(), **changes)


def test_names_follow_the_cdi_rules() -> None:
    assert cdispec.QUALIFIED_NAME == "kube-vgpu.io/hami-core=shared"
    assert cdispec.FILE_NAME == "kube-vgpu.io-hami-core.json"
    assert cdispec.CDI_VERSION == "0.3.0"  # what containerd 1.7's and CRI-O's CDI libraries read


def test_default_spec_carries_hami_cores_shared_mounts() -> None:
    edits, missing = cdispec.select(cfg(), present=HOOK_FILES)
    assert missing == [] and edits is not None
    doc = cdispec.document(edits)
    assert doc == {
        "cdiVersion": "0.3.0",
        "kind": "kube-vgpu.io/hami-core",
        "devices": [
            {
                "name": "shared",
                "containerEdits": {
                    "mounts": [
                        {
                            "hostPath": "/usr/local/vgpu/libvgpu.so",
                            "containerPath": "/usr/local/vgpu/libvgpu.so",
                            "options": ["ro", "nosuid", "nodev", "bind"],
                        },
                        {
                            "hostPath": "/usr/local/vgpu/vgpulock",
                            "containerPath": "/tmp/vgpulock",
                            "options": ["rw", "nosuid", "nodev", "bind"],
                        },
                        {
                            "hostPath": "/usr/local/vgpu/ld.so.preload",
                            "containerPath": "/etc/ld.so.preload",
                            "options": ["ro", "nosuid", "nodev", "bind"],
                        },
                    ]
                },
            }
        ],
    }
    assert cdispec.validate(doc) == []


def test_config_env_and_hook_path_go_into_the_spec() -> None:
    config = cfg(
        hook_path="/opt/hami/", device_memory_scaling=2.0, lib_cuda_log_level="3", disable_core_limit=True
    )
    edits, missing = cdispec.select(config, present={"/opt/hami/vgpu/libvgpu.so"})
    assert edits is not None
    doc = cdispec.document(edits)
    device_edits = doc["devices"][0]["containerEdits"]
    assert device_edits["env"] == [
        "CUDA_OVERSUBSCRIBE=true",
        "GPU_CORE_UTILIZATION_POLICY=disable",
        "LIBCUDA_LOG_LEVEL=3",
    ]
    assert [m["hostPath"] for m in device_edits["mounts"]] == ["/opt/hami/vgpu/libvgpu.so"]
    assert [m.host_path for m in missing] == ["/opt/hami/vgpu/vgpulock", "/opt/hami/vgpu/ld.so.preload"]
    assert cdispec.validate(doc) == []


def test_nothing_present_and_no_env_writes_no_spec() -> None:
    edits, missing = cdispec.select(cfg(), present=set())
    assert edits is None and len(missing) == 3


def valid() -> dict[str, Any]:
    edits, _ = cdispec.select(cfg(), present=HOOK_FILES)
    assert edits is not None
    return cdispec.document(edits)


def changed(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    doc = copy.deepcopy(valid())
    target: Any = doc
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value
    return doc


@pytest.mark.parametrize(
    ("doc", "problem"),
    [
        ("not a spec", "not an object"),
        (changed(("cdiVersion",), "0.2.0"), "cdiVersion '0.2.0' is not one of"),
        (changed(("cdiVersion",), 3), "cdiVersion 3"),
        (changed(("kind",), "hami-core"), "is not <vendor>/<class>"),
        (changed(("kind",), "kube-vgpu.io/a/b"), "is not <vendor>/<class>"),
        (changed(("kind",), "Kube_vgpu.io/hami"), "is not a DNS subdomain"),
        (changed(("kind",), "kube-vgpu.io/hami.core"), "a dot in the class needs cdiVersion 0.6.0"),
        (changed(("kind",), "kube-vgpu.io/-hami"), "class '-hami'"),
        (changed(("devices",), []), "devices must be a non-empty list"),
        (changed(("devices",), "shared"), "devices must be a non-empty list"),
        (changed(("devices", 0, "name"), "-x"), "device name '-x'"),
        (changed(("devices", 0, "name"), None), "device name None"),
        (changed(("devices", 0, "name"), "0gpu"), "a name starting with a digit needs cdiVersion 0.5.0"),
        (changed(("devices", 0, "containerEdits"), {}), "has no containerEdits"),
        (changed(("devices", 0, "containerEdits"), None), "has no containerEdits"),
        (changed(("devices", 0, "containerEdits", "env"), ["=x"]), "env entry '=x' is not NAME=value"),
        (changed(("devices", 0, "containerEdits", "env"), ["NOVALUE"]), "env entry 'NOVALUE'"),
        (changed(("devices", 0, "containerEdits", "env"), "A=b"), "env 'A=b' is not a list"),
        (changed(("devices", 0, "containerEdits", "mounts", 0, "hostPath"), "lib.so"), "hostPath 'lib.so'"),
        (changed(("devices", 0, "containerEdits", "mounts", 0, "options"), "ro"), "mount options 'ro'"),
        (changed(("devices", 0, "containerEdits", "mounts", 1), "x"), "mount 'x' is not an object"),
        (changed(("devices",), [valid()["devices"][0]] * 2), "device 'shared' is defined twice"),
        (changed(("containerEdits",), []), "containerEdits is not an object"),
    ],
    ids=lambda v: v if isinstance(v, str) and len(v) < 40 else None,
)
def test_garbage_specs_are_invalid(doc: object, problem: str) -> None:
    problems = cdispec.validate(doc)
    assert any(problem in p for p in problems), problems


@pytest.mark.parametrize(
    "change",
    [
        {"cdiVersion": "0.5.0", "devices": [{"name": "0gpu", "containerEdits": {"env": ["A=1"]}}]},
        {"cdiVersion": "0.6.0", "kind": "nvidia.com/gpu.x"},
        {"containerEdits": {"env": ["A=b=c"]}},
    ],
    ids=["digit-name-0.5.0", "dotted-class-0.6.0", "top-level-edits"],
)
def test_newer_features_are_valid_from_their_version(change: dict[str, Any]) -> None:
    assert cdispec.validate({**valid(), **change}) == []


def test_device_edits_are_the_specs_then_the_devices() -> None:
    doc = {**valid(), "containerEdits": {"env": ["A=1"]}}
    assert cdispec.device_edits(doc, "shared") == [{"env": ["A=1"]}, valid()["devices"][0]["containerEdits"]]
    assert cdispec.device_edits(doc, "other") == []


def answer(
    strategy: str, *, shared: allocation.SharedEdits | None, **changes: Any
) -> allocation.ContainerAllocation:
    return allocation.build_response(
        (annotations.ContainerDevice(GpuUuid("GPU-a"), 3000, 50),),
        config=cfg(device_list_strategy=strategy, **changes),
        gpus=REFS,
        cache_id="rid",
        cache_host_dir="/usr/local/vgpu/containers/uid_main",
        host=allocation.HostFacts(cdi=shared),
    )


def test_cdi_answers_name_the_spec_and_keep_only_per_container_edits() -> None:
    edits, _ = cdispec.select(cfg(device_memory_scaling=2.0), present=HOOK_FILES)
    cri = answer("cdi-cri", shared=edits, device_memory_scaling=2.0)
    assert cri.cdi_devices == ("nvidia.com/gpu=GPU-a", "kube-vgpu.io/hami-core=shared")
    assert cri.mounts == (allocation.Mount("/usr/local/vgpu", "/usr/local/vgpu/containers/uid_main", False),)
    assert cri.envs == {
        "CUDA_DEVICE_MEMORY_LIMIT_0": "3000m",
        "CUDA_DEVICE_SM_LIMIT": "50",
        "CUDA_DEVICE_MEMORY_SHARED_CACHE": "/usr/local/vgpu/rid.cache",
    }
    notes = answer("cdi-annotations", shared=edits, device_memory_scaling=2.0).annotations
    assert notes == {
        "cdi.k8s.io/vgpu-device-plugin_rid": "nvidia.com/gpu=GPU-a,kube-vgpu.io/hami-core=shared"
    }


@pytest.mark.parametrize("strategy", ["cdi-cri", "cdi-annotations", "envvar", "volume-mounts"])
@pytest.mark.parametrize(
    "present", [HOOK_FILES, {"/usr/local/vgpu/vgpulock"}], ids=["all-files", "lock-dir-only"]
)
def test_answer_and_spec_together_carry_every_edit(strategy: str, present: set[str]) -> None:
    """Nothing is lost or doubled: the spec's edits plus the answer's are those of an answer
    without a spec; a strategy that is not CDI ignores the spec."""
    edits, _ = cdispec.select(cfg(lib_cuda_log_level="4"), present=present)
    assert edits is not None
    plain = answer(strategy, shared=None, lib_cuda_log_level="4")
    with_spec = answer(strategy, shared=edits, lib_cuda_log_level="4")
    if strategy.startswith("cdi"):
        assert set(with_spec.mounts).isdisjoint(edits.mounts)
        assert set(with_spec.mounts) | set(edits.mounts) == set(plain.mounts)
        assert {**with_spec.envs, **dict(edits.envs)} == plain.envs
        assert not set(with_spec.envs) & set(dict(edits.envs))
    else:
        assert with_spec == plain


def test_no_spec_written_keeps_every_edit_and_names_only_gpus() -> None:
    r = answer("cdi-cri", shared=None)
    assert r.cdi_devices == ("nvidia.com/gpu=GPU-a",)
    assert "/etc/ld.so.preload" in [m.container_path for m in r.mounts]
