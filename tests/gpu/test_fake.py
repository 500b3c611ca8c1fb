"""The fake GPU backend: YAML parsing (with garbage), devices, events, vanishing and failures."""

from __future__ import annotations

import threading

import pytest
import yaml
from vgpu.core.device import GpuUuid
from vgpu.core.errors import GpuBackendError
from vgpu.gpu import fake
from vgpu.gpu.port import EventKind

TWO_GPUS = """
gpus:
  - uuid: GPU-aaaa
    name: NVIDIA A100-SXM4-40GB
    memoryMib: 40960
    numa: 1
  - name: Tesla T4
    memoryMib: 15360
    migEnabled: true
    migInstances:
      - {profile: 1g.5gb, memoryMib: 4864}
"""


def test_parses_devices_with_defaults() -> None:
    backend = fake.FakeGpuBackend.from_yaml(yaml.safe_load(TWO_GPUS), seed="node-a")
    a, b = backend.devices()
    assert (a.uuid, a.index, a.name, a.memory_mib, a.numa_node, a.minor_number) == (
        "GPU-aaaa",
        0,
        "NVIDIA A100-SXM4-40GB",
        40960,
        1,
        0,
    )
    assert a.pci_bus_id == "00000000:01:00.0"
    assert b.uuid.startswith("GPU-") and b.index == 1 and b.numa_node is None
    assert b.mig_enabled and b.mig_instances[0].profile == "1g.5gb"
    assert b.mig_instances[0].memory_total_bytes == 4864 << 20
    assert b.mig_instances[0].uuid.startswith("MIG-")


def test_generated_uuids_depend_on_the_seed() -> None:
    doc = {"gpus": [{"name": "x", "memoryMib": 1}]}
    one = fake.FakeGpuBackend.from_yaml(doc, seed="n1").devices()[0].uuid
    again = fake.FakeGpuBackend.from_yaml(doc, seed="n1").devices()[0].uuid
    other = fake.FakeGpuBackend.from_yaml(doc, seed="n2").devices()[0].uuid
    assert one == again != other


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ("[1, 2]", "expected a mapping"),
        ("gpus: 3", "gpus: expected a list"),
        ("gpus: [{memoryMib: 10}]", "gpus[0].name"),
        ("gpus: [{name: x, memoryMib: -1}]", "gpus[0].memoryMib"),
        ("gpus: [{name: x, memoryMib: ten}]", "gpus[0].memoryMib"),
        ("gpus: [{name: x, memoryMib: 1, colour: red}]", "unknown keys ['colour']"),
        ("gpus: [{name: x, memoryMib: 1, migEnabled: maybe}]", "migEnabled"),
        ("gpus: [{name: x, memoryMib: 1, migInstances: [{memoryMib: 1}]}]", "migInstances[0].profile"),
        ("gpus: [{uuid: G, name: x, memoryMib: 1}, {uuid: G, name: y, memoryMib: 1}]", "duplicate"),
        ("failInit: 3", "failInit"),
        ("frob: 1", "unknown keys"),
    ],
    ids=[
        "list",
        "gpus-int",
        "no-name",
        "negative",
        "text-mem",
        "unknown",
        "bad-bool",
        "mig-no-profile",
        "dup",
        "failinit",
        "topkey",
    ],
)
def test_garbage_yaml_is_a_clear_error(doc: str, message: str) -> None:
    with pytest.raises(GpuBackendError, match="fake GPUs") as info:
        fake.FakeGpuBackend.from_yaml(yaml.safe_load(doc))
    assert message in str(info.value)


def test_empty_document_means_no_gpus() -> None:
    assert fake.FakeGpuBackend.from_yaml(None).devices() == []


def test_fail_init_and_heal() -> None:
    backend = fake.FakeGpuBackend.from_yaml({"failInit": "driver missing"})
    with pytest.raises(GpuBackendError, match="NVML not available: driver missing"):
        backend.open()
    with pytest.raises(GpuBackendError, match="NVML not available: driver missing"):
        backend.devices()
    backend.fail_devices("")
    assert backend.devices() == []


def test_events_are_delivered_in_order_and_wait_times_out() -> None:
    backend = fake.FakeGpuBackend.from_yaml(yaml.safe_load(TWO_GPUS))
    assert backend.wait_event(0.01) is None
    backend.inject_xid("GPU-aaaa", 79)
    backend.inject_lost(None)
    first = backend.wait_event(1)
    second = backend.wait_event(1)
    assert first is not None and (first.kind, first.uuid, first.xid) == (EventKind.XID, "GPU-aaaa", 79)
    assert second is not None and (second.kind, second.uuid) == (EventKind.LOST, None)


def test_vanish_hides_the_gpu_fails_probes_and_emits_lost() -> None:
    backend = fake.FakeGpuBackend.from_yaml(yaml.safe_load(TWO_GPUS))
    assert backend.probe(GpuUuid("GPU-aaaa"))
    backend.vanish("GPU-aaaa")
    assert [d.uuid for d in backend.devices()] == [backend.devices()[0].uuid] != ["GPU-aaaa"]
    assert not backend.probe(GpuUuid("GPU-aaaa"))
    event = backend.wait_event(1)
    assert event is not None and event.kind == EventKind.LOST and event.uuid == "GPU-aaaa"
    backend.restore("GPU-aaaa")
    assert backend.probe(GpuUuid("GPU-aaaa"))
    assert not backend.probe(GpuUuid("GPU-unknown"))


def test_probe_failure_switch() -> None:
    backend = fake.FakeGpuBackend.from_yaml(yaml.safe_load(TWO_GPUS))
    backend.set_probe_ok("GPU-aaaa", False)
    assert not backend.probe(GpuUuid("GPU-aaaa"))
    backend.set_probe_ok("GPU-aaaa", True)
    assert backend.probe(GpuUuid("GPU-aaaa"))


def test_interrupt_wakes_a_blocked_wait() -> None:
    backend = fake.FakeGpuBackend.from_yaml(None)
    result: list[object] = []
    started = threading.Event()

    def waiter() -> None:
        started.set()
        result.append(backend.wait_event(30))

    thread = threading.Thread(target=waiter)
    thread.start()
    started.wait(5)
    backend.interrupt()
    thread.join(5)
    assert not thread.is_alive() and result == [None]
