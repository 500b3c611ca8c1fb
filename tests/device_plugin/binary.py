"""The ``vgpu-device-plugin`` binary in its own process against a local API server and a test
kubelet on real unix sockets (the harness of ``test_process`` and of the real-GPU test)."""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
import shutil
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass

from vgpu.kubeletapi.v1beta1 import api_pb2
from vgpu.localcluster.apiserver import ApiServer
from vgpu.localcluster.store import Store

from tests.device_plugin.builders import NODE, add_pod, installed_host, lock_node, short_tmp
from tests.device_plugin.fakekubelet import FakeKubelet


@dataclass
class PluginRun:
    proc: asyncio.subprocess.Process
    kubelet: FakeKubelet
    plugin_dir: pathlib.Path
    log_path: pathlib.Path


@contextlib.asynccontextmanager
async def plugin_binary(
    store: Store, tmp_path: pathlib.Path, *args: str, pending: str | None = None
) -> AsyncIterator[PluginRun]:
    """Start the plugin for ``NODE`` with ``args`` (backend, config) once the test kubelet listens.
    ``pending``: a ``devices-to-allocate`` value for a pod ``p`` holding the node lock, created
    before the plugin starts (its cache is filled before it registers with kubelet). The process
    is killed at the end if the test has not stopped it."""
    store.create("nodes", {"metadata": {"name": NODE}})
    plugin_dir = short_tmp()
    kubelet = FakeKubelet(plugin_dir)
    log_path = tmp_path / "plugin.log"
    host_root = tmp_path / "host"
    installed_host(host_root)
    async with ApiServer(store) as server:
        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
        await kubelet.start()
        if pending is not None:
            add_pod(store, "p", to_allocate=pending)
            lock_node(store, "p")
        with log_path.open("wb") as log:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "vgpu_device_plugin.main",
                "--node-name",
                NODE,
                "--kubeconfig",
                str(kubeconfig),
                "--device-plugin-path",
                str(plugin_dir),
                "--host-root",
                str(host_root),
                *args,
                stdout=log,
                stderr=log,
            )
        try:
            yield PluginRun(proc, kubelet, plugin_dir, log_path)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            await kubelet.stop()
            shutil.rmtree(plugin_dir, ignore_errors=True)


async def allocate_envs(kubelet: FakeKubelet, *device_ids: str) -> dict[str, str]:
    """kubelet's Allocate of ``device_ids`` for one container, over the plugin's socket: its envs."""
    channel, stub = await kubelet.call("nvidia-gpu.sock")
    async with channel:
        resp = await stub.Allocate(
            api_pb2.AllocateRequest(
                container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=list(device_ids))]
            ),
            timeout=10,
        )
    return dict(resp.container_responses[0].envs)
