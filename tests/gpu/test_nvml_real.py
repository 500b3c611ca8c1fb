"""Against a real NVIDIA driver (marked ``gpu``; skipped cleanly where NVML cannot initialise)."""

from __future__ import annotations

import pytest
from vgpu.core.errors import GpuBackendError
from vgpu.gpu import nvml


@pytest.mark.gpu
def test_real_nvml_lists_gpus() -> None:
    import pynvml

    backend = nvml.NvmlBackend(pynvml)
    try:
        backend.open()
    except GpuBackendError as exc:
        pytest.skip(f"no usable NVIDIA driver here: {exc}")
    try:
        devices = backend.devices()
        assert devices, "NVML initialised but reported no GPU"
        for d in devices:
            assert d.uuid.startswith("GPU-") and d.memory_total_bytes > 0
            assert backend.probe(d.uuid)
            print(
                f"GPU {d.index}: {d.uuid} {d.name} {d.memory_mib} MiB NUMA {d.numa_node} MIG {d.mig_enabled}"
            )
            used = backend.memory_usage(d.uuid)  # NVML's own reply must read as a memory reading
            assert 0 <= used.used_bytes <= d.memory_total_bytes
            assert all(p.pid >= 0 for p in used.processes)
            print(f"  used {used.used_bytes >> 20} MiB by {len(used.processes)} processes")
        backend.wait_event(0.1)  # an event or None; it must not raise
    finally:
        backend.close()
