"""The real binary in its own process: official client → local HTTP API server, fake GPUs, a test
kubelet on real unix sockets; Allocate end to end; SIGTERM → clean exit, socket gone, lease released."""

import asyncio
import pathlib
import signal

import yaml
from vgpu.core import annotations
from vgpu.kube.port import JsonObj
from vgpu.localcluster.store import Store

from tests.device_plugin.binary import allocate_envs, plugin_binary
from tests.device_plugin.builders import KEYS, NODE

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


async def wait_for_pod(store: Store, name: str, check, timeout_s: float = 30.0) -> JsonObj:
    """The pod's bind phase is written after Allocate answers: wait on a watch for it."""
    watcher = store.watch("pods", namespace="default", field_selector=f"metadata.name={name}")
    try:
        while True:
            event = await watcher.next_event(timeout_s=timeout_s)
            assert event is not None, f"pod {name} never reached the expected state"
            if check(event.object):
                return event.object
    finally:
        watcher.close()


def notes_of_obj(obj: JsonObj) -> dict[str, str]:
    return dict(obj["metadata"].get("annotations") or {})


def register_health(node: JsonObj) -> list[bool]:
    raw = (node["metadata"].get("annotations") or {}).get(KEYS.node_register)
    return [g.health for g in annotations.decode_node_register(raw)] if raw else []


async def test_binary_serves_allocates_and_stops_on_sigterm(tmp_path: pathlib.Path) -> None:
    store = Store()
    gpus = tmp_path / "gpus.yaml"
    gpus.write_text(yaml.safe_dump({"gpus": [{"uuid": GPU, "name": "NVIDIA L4", "memoryMib": 23034}]}))
    args = ("--backend", "fake", "--fake-gpus", str(gpus))
    async with plugin_binary(store, tmp_path, *args, pending=f"{GPU},NVIDIA,2000,25:;") as run:
        kubelet = run.kubelet
        await kubelet.wait_registrations(1, timeout_s=30)
        assert len(await kubelet.next_list(timeout_s=10)) == 10
        await wait_for_node(store, lambda n: register_health(n) == [True])
        watcher = store.watch("leases", namespace="kube-system")  # renewed once kubelet watches
        try:
            while not store.list("leases", namespace="kube-system").items:
                assert await watcher.next_event(timeout_s=10) is not None, "no Lease written"
        finally:
            watcher.close()
        assert store.get("leases", f"vgpu-device-plugin-{NODE}", namespace="kube-system")
        assert (await allocate_envs(kubelet, f"{GPU}-0"))["CUDA_DEVICE_MEMORY_LIMIT_0"] == "2000m"
        await wait_for_pod(store, "p", lambda p: notes_of_obj(p).get(KEYS.bind_phase) == "success")
        run.proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(run.proc.wait(), 20) == 0, run.log_path.read_text()
        assert not (run.plugin_dir / "nvidia-gpu.sock").exists()
        assert register_health(store.get("nodes", NODE)) == [False]
        assert store.list("leases", namespace="kube-system").items == []
        text = run.log_path.read_text()
        assert f"starting on node {NODE}" in text and '"deviceSplitCount": 10' in text
