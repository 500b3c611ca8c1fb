"""Helpers for the tests marked ``gpu``: NVML opened on the real driver (or a clean skip), and a
child process that holds GPU memory through the CUDA driver API (``libcuda.so.1`` via ctypes: no
CUDA toolkit or framework needed, only the driver)."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator

import pytest
from vgpu.core.errors import GpuBackendError
from vgpu.gpu import nvml

MIB = 1 << 20

# Runs in the child: a primary context on CUDA device 0 (the parent picks the GPU with
# CUDA_VISIBLE_DEVICES), one allocation of argv[1] bytes, "ready", then it holds until stdin closes.
_HOLDER = r"""
import ctypes, sys
cuda = ctypes.CDLL("libcuda.so.1")
def check(result, what):
    if result != 0:
        print(f"error {what}: CUresult {result}", flush=True)
        sys.exit(1)
check(cuda.cuInit(0), "cuInit")
device = ctypes.c_int()
check(cuda.cuDeviceGet(ctypes.byref(device), 0), "cuDeviceGet")
context = ctypes.c_void_p()
check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device), "cuDevicePrimaryCtxRetain")
check(cuda.cuCtxSetCurrent(context), "cuCtxSetCurrent")
pointer = ctypes.c_uint64()
check(cuda.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(int(sys.argv[1]))), "cuMemAlloc")
print("ready", flush=True)
sys.stdin.read()
"""


def open_backend() -> nvml.NvmlBackend:
    """NVML on this machine's driver, opened; skips the test where there is none."""
    backend = nvml.load()
    try:
        backend.open()
    except GpuBackendError as exc:
        pytest.skip(f"no usable NVIDIA driver here: {exc}")
    return backend


@contextlib.asynccontextmanager
async def holding_gpu_memory(uuid: str, nbytes: int) -> AsyncIterator[int]:
    """A child process holding ``nbytes`` of GPU ``uuid`` until the block ends; yields its pid.
    Skips the test where the CUDA driver library cannot be loaded or gives no context. The child
    runs under asyncio, so a test's in-process API server keeps answering while CUDA starts."""
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _HOLDER,
        str(nbytes),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={"CUDA_VISIBLE_DEVICES": uuid, "PATH": "/usr/bin:/bin"},
    )
    assert child.stdout is not None and child.stdin is not None
    try:
        first = (await child.stdout.readline()).decode().strip()
        if first != "ready":
            rest = (await child.stdout.read()).decode()
            pytest.skip(f"cannot hold GPU memory through libcuda here: {first} {rest}".strip())
        yield child.pid
    finally:
        child.stdin.close()
        try:
            await asyncio.wait_for(child.wait(), 30)
        except TimeoutError:
            child.kill()
            await child.wait()
