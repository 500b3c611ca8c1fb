"""Against a real NVIDIA driver (marked ``gpu``; skipped cleanly where NVML cannot initialise)."""

from __future__ import annotations

import pytest

from tests.gpu.realgpu import MIB, holding_gpu_memory, open_backend


@pytest.mark.gpu
def test_real_nvml_lists_gpus() -> None:
    import pynvml

    backend = open_backend()
    try:
        devices = backend.devices()
        assert devices, "NVML initialised but reported no GPU"
        for d in devices:
            handle = pynvml.nvmlDeviceGetHandleByIndex(d.index)  # the library itself, not our reading
            assert d.uuid == pynvml.nvmlDeviceGetUUID(handle) and d.uuid.startswith("GPU-")
            assert d.name == pynvml.nvmlDeviceGetName(handle)
            assert d.memory_total_bytes == pynvml.nvmlDeviceGetMemoryInfo(handle).total > 0
            assert backend.probe(d.uuid)
            print(
                f"GPU {d.index}: {d.uuid} {d.name} {d.memory_mib} MiB bus {d.pci_bus_id} "
                f"NUMA {d.numa_node} MIG {d.mig_enabled}"
            )
            used = backend.memory_usage(d.uuid)  # NVML's own reply must read as a memory reading
            assert 0 <= used.used_bytes <= d.memory_total_bytes
            assert all(p.pid >= 0 for p in used.processes)
            print(f"  used {used.used_bytes // MIB} MiB by {len(used.processes)} processes")
            assert 0 <= backend.utilization_percent(d.uuid) <= 100
        assert backend.wait_event(0.1) is None  # no XID on a healthy GPU in 0.1 s; it must not raise
    finally:
        backend.close()


@pytest.mark.gpu
async def test_real_nvml_sees_a_process_holding_gpu_memory() -> None:
    """What the device plugin's outside-usage measurement reads: the driver's used memory grows by
    what a process allocates, and the process is listed with its memory."""
    backend = open_backend()
    try:
        gpu = backend.devices()[0]
        before = backend.memory_usage(gpu.uuid)
        async with holding_gpu_memory(gpu.uuid, 1024 * MIB) as pid:
            during = backend.memory_usage(gpu.uuid)
        after = backend.memory_usage(gpu.uuid)
    finally:
        backend.close()
    print(
        f"GPU {gpu.uuid}: used {before.used_bytes // MIB} MiB before, {during.used_bytes // MIB} MiB "
        f"while pid {pid} held 1024 MiB ({[(p.pid, p.used_memory_bytes) for p in during.processes]}), "
        f"{after.used_bytes // MIB} MiB after"
    )
    assert during.used_bytes - before.used_bytes >= 1024 * MIB
    held = {p.pid: p.used_memory_bytes for p in during.processes}
    assert pid in held, f"pid {pid} not among the GPU's processes {held}"
    assert held[pid] is None or held[pid] >= 1024 * MIB
    assert pid not in {p.pid for p in after.processes}
