"""The device plugin binary on the real driver (``--backend nvml``, marked ``gpu``): official client →
local HTTP API server, a test kubelet on real unix sockets. What kubelet and the scheduler see of the
machine's real GPUs: the device list, the register annotation, an Allocate's environment, and the
memory a process outside kube-vgpu holds, measured and published on the node."""

from __future__ import annotations

import asyncio
import pathlib
import signal

import pytest
import yaml
from vgpu.core import annotations, outside
from vgpu.kube.port import JsonObj
from vgpu.localcluster.store import Store

from tests.device_plugin.binary import allocate_envs, plugin_binary
from tests.device_plugin.builders import KEYS, NODE
from tests.device_plugin.test_process import notes_of_obj, register_health, wait_for_node, wait_for_pod
from tests.gpu.realgpu import MIB, holding_gpu_memory, open_backend

SPLIT = 4


def outside_mib(node: JsonObj) -> dict[str, int]:
    raw = (node["metadata"].get("annotations") or {}).get(KEYS.node_outside_usage)
    return dict(outside.decode(raw, field="outside")) if raw else {}


@pytest.mark.gpu
@pytest.mark.timeout(180)
async def test_plugin_binary_on_the_real_gpus(tmp_path: pathlib.Path) -> None:
    backend = open_backend()  # skips without a driver; the plugin opens its own
    try:
        real = backend.devices()
    finally:
        backend.close()
    first = real[0]

    store = Store()
    config = tmp_path / "vgpu.yaml"
    config.write_text(
        yaml.safe_dump({"devicePlugin": {"deviceSplitCount": SPLIT, "outsideUsageIntervalS": 1}})
    )
    args = ("--config", str(config), "--backend", "nvml")
    async with plugin_binary(store, tmp_path, *args, pending=f"{first.uuid},NVIDIA,2000,25:;") as run:
        kubelet = run.kubelet
        try:
            await kubelet.wait_registrations(1, timeout_s=60)
            listed = await kubelet.next_list(timeout_s=10)
            assert sorted(listed) == sorted(
                (f"{d.uuid}-{slot}", "Healthy") for d in real for slot in range(SPLIT)
            )
            node = await wait_for_node(store, lambda n: register_health(n) == [True] * len(real))
            register = annotations.decode_node_register(node["metadata"]["annotations"][KEYS.node_register])
            by_uuid = {g.uuid: g for g in register}
            assert set(by_uuid) == {d.uuid for d in real}
            for d in real:
                g = by_uuid[d.uuid]
                assert (g.index, g.count, g.memory_mib) == (d.index, SPLIT, d.memory_total_bytes // MIB)
                assert d.name in g.type
            print(f"register annotation: {node['metadata']['annotations'][KEYS.node_register]}")

            envs = await allocate_envs(kubelet, f"{first.uuid}-0")
            print(f"Allocate envs: {envs}")
            assert envs["NVIDIA_VISIBLE_DEVICES"] == first.uuid
            assert envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "2000m"
            assert envs["CUDA_DEVICE_SM_LIMIT"] == "25"
            # written after the answer
            await wait_for_pod(store, "p", lambda p: notes_of_obj(p).get(KEYS.bind_phase) == "success")

            # memory held by a process in no pod is outside kube-vgpu: the node says so
            node = await wait_for_node(store, lambda n: first.uuid in outside_mib(n), timeout_s=30)
            baseline = outside_mib(node)[first.uuid]
            async with holding_gpu_memory(first.uuid, 2048 * MIB):
                node = await wait_for_node(
                    store, lambda n: outside_mib(n).get(first.uuid, 0) >= baseline + 2048, timeout_s=30
                )
                print(f"outside usage: {baseline} MiB idle, {outside_mib(node)[first.uuid]} MiB held")

            run.proc.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(run.proc.wait(), 30) == 0, run.log_path.read_text()
            assert not (run.plugin_dir / "nvidia-gpu.sock").exists()
            assert register_health(store.get("nodes", NODE)) == [False] * len(real)
            assert f"starting on node {NODE}: backend nvml" in run.log_path.read_text()
        finally:
            print(run.log_path.read_text()[-3000:])
