"""NvmlBackend against a fake pynvml module: inventory, NUMA from sysfs, MIG, events, probes, errors."""

from __future__ import annotations

import pathlib

import pytest
from vgpu.core.device import GpuUuid
from vgpu.core.errors import GpuBackendError
from vgpu.gpu import nvml
from vgpu.gpu.port import EventKind

from tests.gpu.fake_pynvml import FakeGpu, NVMLError, NVMLError_LibraryNotFound, make_module


def _sysfs(tmp_path: pathlib.Path, bus: str, value: str) -> pathlib.Path:
    d = tmp_path / "bus" / "pci" / "devices" / bus
    d.mkdir(parents=True)
    (d / "numa_node").write_text(value)
    return tmp_path


def test_devices_with_numa_and_mig(tmp_path: pathlib.Path) -> None:
    sysfs = _sysfs(tmp_path, "0000:3b:00.0", "1\n")
    mig = FakeGpu("MIG-1", name="NVIDIA A100-SXM4-40GB MIG 1g.5gb", memory=4864 << 20, gi=3, ci=0)
    gpus = [
        FakeGpu("GPU-a", bus_id=b"00000000:3B:00.0", minor=2),
        FakeGpu("GPU-b", bus_id="00000000:AF:00.0", mig_mode=(1, 1), migs=[mig], minor=5),
    ]
    backend = nvml.NvmlBackend(make_module(gpus), sysfs_root=sysfs)
    backend.open()
    a, b = backend.devices()
    assert (a.uuid, a.index, a.memory_mib, a.minor_number, a.numa_node, a.mig_enabled) == (
        "GPU-a",
        0,
        40960,
        2,
        1,
        False,
    )
    assert a.pci_bus_id == "00000000:3B:00.0"
    assert b.numa_node is None  # no sysfs entry
    assert b.mig_enabled
    (inst,) = b.mig_instances
    assert (inst.uuid, inst.profile, inst.gpu_instance_id, inst.memory_total_bytes) == (
        "MIG-1",
        "1g.5gb",
        3,
        4864 << 20,
    )


@pytest.mark.parametrize(("raw", "want"), [("-1", None), ("junk", None), ("0", 0), ("3", 3)])
def test_numa_node_values(tmp_path: pathlib.Path, raw: str, want: int | None) -> None:
    assert nvml.read_numa_node(_sysfs(tmp_path, "0000:3b:00.0", raw), "00000000:3B:00.0") == want


def test_missing_library_is_a_clear_error() -> None:
    backend = nvml.NvmlBackend(
        make_module([], init_error=NVMLError_LibraryNotFound("NVML Shared Library Not Found"))
    )
    with pytest.raises(GpuBackendError, match="NVML not available: NVML Shared Library Not Found"):
        backend.open()
    with pytest.raises(GpuBackendError, match="NVML not available"):
        backend.devices()
    assert backend.probe(GpuUuid("GPU-a")) is False


def test_nvml_errors_are_translated() -> None:
    module = make_module([FakeGpu("GPU-a")])

    def no_count() -> int:
        raise NVMLError("Unknown Error")

    module.nvmlDeviceGetCount = no_count
    backend = nvml.NvmlBackend(module)
    backend.open()
    with pytest.raises(GpuBackendError, match="NVML device count failed: Unknown Error"):
        backend.devices()


def test_a_gpu_off_the_bus_is_left_out_and_the_others_still_listed() -> None:
    """Every NVML call on a lost GPU's handle fails; that must not take the node's other GPUs down
    (a session restart would otherwise never start again)."""
    mig = FakeGpu("MIG-1", name="NVIDIA A100-SXM4-40GB MIG 1g.5gb")
    bad_mig = FakeGpu("GPU-c", mig_mode=(1, 1), migs=[mig])
    module = make_module([FakeGpu("GPU-a"), FakeGpu("GPU-b", broken=True), bad_mig])

    def no_mig_count(handle: FakeGpu) -> int:
        raise NVMLError("Unknown Error")

    module.nvmlDeviceGetMaxMigDeviceCount = no_mig_count
    backend = nvml.NvmlBackend(module)
    backend.open()
    assert [(d.uuid, d.index) for d in backend.devices()] == [("GPU-a", 0)]


def test_a_gpu_unreadable_at_event_registration_is_lost_under_its_listed_uuid() -> None:
    a, b, c = FakeGpu("GPU-a"), FakeGpu("GPU-b"), FakeGpu("GPU-c", broken=True)
    module = make_module([a, b, c])
    backend = nvml.NvmlBackend(module)
    backend.open()
    assert [d.uuid for d in backend.devices()] == ["GPU-a", "GPU-b"]  # GPU-c never readable
    b.broken = True  # falls off the bus before the event set is made
    lost = backend.wait_event(0.0)
    assert lost is not None and (lost.kind, lost.uuid) == (EventKind.LOST, "GPU-b")
    assert "reading GPU 1 failed: Unknown Error" in lost.detail
    assert backend.wait_event(0.0) is None  # nothing for GPU-c: no GPU of ours to mark
    assert [c for c in module.calls if c[0] == "register"] == [("register", "GPU-a", 8)]


def test_xid_events_and_timeouts() -> None:
    a, b = FakeGpu("GPU-a"), FakeGpu("GPU-b")
    module = make_module([a, b])
    module.register_fail.add("GPU-b")
    backend = nvml.NvmlBackend(module)
    backend.open()
    module.events += [(a, 8, 79), (a, 1, 0), NVMLError("Unknown Error")]
    lost = backend.wait_event(0.01)
    assert lost is not None and (lost.kind, lost.uuid) == (EventKind.LOST, "GPU-b")
    xid = backend.wait_event(0.01)
    assert xid is not None and (xid.kind, xid.uuid, xid.xid) == (EventKind.XID, "GPU-a", 79)
    assert backend.wait_event(0.01) is None  # not an XID event type
    with pytest.raises(GpuBackendError, match="NVML event wait failed: Unknown Error"):
        backend.wait_event(0.01)  # raised, so the health loop backs off (returned, it would spin)
    assert backend.wait_event(0.01) is None  # timeout
    assert ("register", "GPU-a", 8) in module.calls


def test_probe_and_close() -> None:
    module = make_module([FakeGpu("GPU-a")])
    backend = nvml.NvmlBackend(module)
    backend.open()
    assert backend.probe(GpuUuid("GPU-a")) and not backend.probe(GpuUuid("GPU-zzz"))
    backend.wait_event(0.0)
    backend.close()
    backend.close()
    assert module.calls.count("shutdown") == 1 and "free" in module.calls


@pytest.mark.parametrize(
    ("bus", "want"),
    [
        ("00000000:3B:00.0", "0000:3b:00.0"),
        ("0000:af:00.0", "0000:af:00.0"),
        (" 00000001:01:00.0 ", "0001:01:00.0"),
    ],
)
def test_bus_id_normalised_for_sysfs(bus: str, want: str) -> None:
    assert nvml.normalize_bus_id(bus) == want


@pytest.mark.parametrize(
    ("gpu", "ok"),
    [
        (FakeGpu("GPU-a"), True),
        (FakeGpu("GPU-a", pages_pending=None, remapped=None), True),
        (FakeGpu("GPU-a", pages_pending=1), False),
        (FakeGpu("GPU-a", pages_pending=None, remapped=(0, 1, 1, 0)), False),
        (FakeGpu("GPU-a", remapped=(0, 0, 0, 1)), False),
    ],
    ids=["clean", "not-supported", "pages-pending", "remap-pending", "remap-failed"],
)
def test_probe_fails_while_a_reset_is_needed(gpu: FakeGpu, ok: bool) -> None:
    backend = nvml.NvmlBackend(make_module([gpu]))
    backend.open()
    assert backend.probe(GpuUuid("GPU-a")) is ok
