"""Inventory: splitting, scaling, filtering and MIG strategies (the advertised resources, exactly)."""

import pytest
from vgpu.core import annotations
from vgpu.core.device import GpuUuid
from vgpu.gpu import fake
from vgpu_device_plugin import inventory

from tests.device_plugin.builders import GPU_A, GPU_B, config, fake_backend

MIG_GPUS = {
    "gpus": [
        {"uuid": "GPU-plain", "name": "NVIDIA A100-SXM4-40GB", "memoryMib": 40960},
        {
            "uuid": "GPU-mig",
            "name": "NVIDIA A100-SXM4-40GB",
            "memoryMib": 40960,
            "migEnabled": True,
            "migInstances": [
                {"uuid": "MIG-1", "profile": "1g.5gb", "memoryMib": 4864},
                {"uuid": "MIG-2", "profile": "1g.5gb", "memoryMib": 4864},
                {"uuid": "MIG-3", "profile": "3g.20gb", "memoryMib": 19968},
            ],
        },
    ]
}


def test_split_ids_and_register_values() -> None:
    inv = inventory.build(fake_backend().devices(), config(device_split_count=3))
    (res,) = inv.resources
    assert res.name == "nvidia.com/gpu" and res.socket_name == "nvidia-gpu.sock" and res.shared
    assert [d.id for d in res.devices] == [f"{GPU_A}-{i}" for i in range(3)] + [
        f"{GPU_B}-{i}" for i in range(3)
    ]
    assert all(d.numa is None for d in res.devices)  # NUMA topology off by default
    gpus = inventory.register_gpus(inv, config(device_split_count=3), {GpuUuid(GPU_B): False})
    assert annotations.encode_node_register(gpus) == (
        f'[{{"id":"{GPU_A}","count":3,"devmem":40960,"devcore":100,"type":"NVIDIA A100-SXM4-40GB",'
        f'"mode":"hami-core","health":true}},'
        f'{{"id":"{GPU_B}","index":1,"count":3,"devmem":32768,"devcore":100,'
        f'"type":"NVIDIA-Tesla V100-PCIE-32GB","numa":1,"mode":"hami-core"}}]'
    )


def test_scaling_and_numa_topology() -> None:
    cfg = config(device_memory_scaling=1.5, device_core_scaling=2.0, enable_numa_topology=True)
    inv = inventory.build(fake_backend().devices(), cfg)
    a, b = inventory.register_gpus(inv, cfg, {})
    assert (a.memory_mib, a.cores, b.memory_mib) == (61440, 200, 49152)
    assert {d.numa for d in inv.resources[0].devices if d.gpu == GPU_B} == {1}


@pytest.mark.parametrize(
    ("changes", "visible"),
    [
        ({"filter_device_uuids": (GPU_A,)}, [GPU_B]),
        ({"filter_device_indexes": (1,)}, [GPU_A]),
        ({"filter_device_uuids": (GPU_A,), "filter_device_indexes": (1,)}, []),
    ],
    ids=["by-uuid", "by-index", "both"],
)
def test_filtering_hides_from_kubelet_and_annotation(changes, visible) -> None:
    cfg = config(**changes)
    inv = inventory.build(fake_backend().devices(), cfg)
    assert sorted({d.gpu for d in inv.resources[0].devices}) == visible
    assert [g.uuid for g in inventory.register_gpus(inv, cfg, {})] == visible


@pytest.mark.parametrize(
    ("strategy", "want"),
    [
        ("none", {"nvidia.com/gpu": ["GPU-plain-0", "GPU-plain-1"]}),
        ("single", {"nvidia.com/gpu": ["MIG-1", "MIG-2", "MIG-3"]}),
        (
            "mixed",
            {
                "nvidia.com/gpu": ["GPU-plain-0", "GPU-plain-1"],
                "nvidia.com/mig-1g.5gb": ["MIG-1", "MIG-2"],
                "nvidia.com/mig-3g.20gb": ["MIG-3"],
            },
        ),
    ],
)
def test_mig_strategies_advertise_exactly(strategy: str, want: dict[str, list[str]]) -> None:
    cfg = config(mig_strategy=strategy, device_split_count=2)
    inv = inventory.build(fake.FakeGpuBackend.from_yaml(MIG_GPUS).devices(), cfg)
    assert {r.name: [d.id for d in r.devices] for r in inv.resources} == want
    # a MIG-enabled GPU is never split into HAMi slots, nor put in the register annotation
    assert [g.uuid for g in inventory.register_gpus(inv, cfg, {})] == (
        ["GPU-plain"] if strategy != "single" else []
    )
    shared = {r.name for r in inv.resources if r.shared}
    assert shared == ({"nvidia.com/gpu"} if strategy != "single" else set())
    assert inv.resource("nvidia.com/gpu").socket_name == "nvidia-gpu.sock"


def test_preconfigured_memory_for_gpus_without_memory_info() -> None:
    backend = fake.FakeGpuBackend.from_yaml({"gpus": [{"uuid": "GPU-u", "name": "GB10", "memoryMib": 0}]})
    cfg = config(preconfigured_device_memory_mib=8192)
    (gpu,) = inventory.register_gpus(inventory.build(backend.devices(), cfg), cfg, {})
    assert gpu.memory_mib == 8192 and gpu.type == "NVIDIA-GB10"
