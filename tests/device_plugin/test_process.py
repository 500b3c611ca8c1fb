"""The real binary in its own process: official client → local HTTP API server, fake GPUs, a test
kubelet on real unix sockets; Allocate end to end; SIGTERM → clean exit, socket gone, lease released."""

import asyncio
import pathlib
import shutil
import signal
import sys

import yaml
from vgpu.core import annotations
from vgpu.kube.port import JsonObj
from vgpu.kubeletapi.v1beta1 import api_pb2
from vgpu.localcluster.apiserver import ApiServer
from vgpu.localcluster.store import Store

from tests.device_plugin.builders import KEYS, NODE, add_pod, lock_node, notes_of, short_tmp
from tests.device_plugin.fakekubelet import FakeKubelet

GPU = "GPU-proc-0000-0000-0000-000000000001"


async def wait_for_node(store: Store, check, timeout_s: float = 30.0) -> JsonObj:
    watcher = store.watch("nodes", field_selector=f"metadata.name={NODE}")
    try:
        while True:
            event = await watcher.next_event(timeout_s=timeout_s)
            assert event is not None, "the node never reached the expected state"
            if check(event.object):
                return event.object
    finally:
        watcher.close()


def register_health(node: JsonObj) -> list[bool]:
    raw = (node["metadata"].get("annotations") or {}).get(KEYS.node_register)
    return [g.health for g in annotations.decode_node_register(raw)] if raw else []


async def test_binary_serves_allocates_and_stops_on_sigterm(tmp_path: pathlib.Path) -> None:
    store = Store()
    store.create("nodes", {"metadata": {"name": NODE}})
    plugin_dir = short_tmp()
    kubelet = FakeKubelet(plugin_dir)
    gpus = tmp_path / "gpus.yaml"
    gpus.write_text(yaml.safe_dump({"gpus": [{"uuid": GPU, "name": "NVIDIA L4", "memoryMib": 23034}]}))
    log_path = tmp_path / "plugin.log"
    async with ApiServer(store) as server:
        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
        await kubelet.start()
        # pending before the plugin starts: its cache is filled before it registers with kubelet
        add_pod(store, "p", to_allocate=f"{GPU},NVIDIA,2000,25:;")
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
                "--backend",
                "fake",
                "--fake-gpus",
                str(gpus),
                "--device-plugin-path",
                str(plugin_dir),
                "--host-root",
                str(tmp_path / "host"),
                stdout=log,
                stderr=log,
            )
        try:
            await kubelet.wait_registrations(1, timeout_s=30)
            assert len(await kubelet.next_list(timeout_s=10)) == 10
            await wait_for_node(store, lambda n: register_health(n) == [True])
            assert store.get("leases", f"vgpu-device-plugin-{NODE}", namespace="kube-system")
            channel, stub = await kubelet.call("nvidia-gpu.sock")
            async with channel:
                resp = await stub.Allocate(
                    api_pb2.AllocateRequest(
                        container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=[f"{GPU}-0"])]
                    ),
                    timeout=10,
                )
            assert resp.container_responses[0].envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "2000m"
            assert notes_of(store, "pods", "p", "default")[KEYS.bind_phase] == "success"
            proc.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(proc.wait(), 20) == 0, log_path.read_text()
            assert not (plugin_dir / "nvidia-gpu.sock").exists()
            assert register_health(store.get("nodes", NODE)) == [False]
            assert store.list("leases", namespace="kube-system").items == []
            text = log_path.read_text()
            assert f"starting on node {NODE}" in text and '"deviceSplitCount": 10' in text
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            await kubelet.stop()
            shutil.rmtree(plugin_dir, ignore_errors=True)
