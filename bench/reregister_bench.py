"""kubelet restart → the plugin registered again and its devices healthy in kubelet (emulation).

The local cluster's kubelet (``KubeletEmulator``, real unix sockets and gRPC) and the real
``PluginManager`` (fake GPUs, the pod cache fed by watches of an in-memory store). Each round
calls ``kubelet.restart()`` (connections dropped, the socket directory wiped, kubelet.sock
re-created) and measures from kubelet.sock's re-creation until kubelet has the plugin's devices
as healthy again (the node's ``allocatable`` written from the first ListAndWatch answer, seen on a
store watch): the window in which a restarted kubelet ≥ 1.27 rejects pods whose containers are not
running. Modes: ``inotify`` (the default) and ``poll`` (no watch: the ``kubeletPollS`` fallback).

    .venv/bin/python -m bench.reregister_bench [--rounds 30] [--mode inotify|poll] [--poll-s 1] [--json]
"""

import argparse
import asyncio
import contextlib
import json
import pathlib
import shutil
import statistics
import tempfile
import time
from typing import Any

from vgpu.core import annotations
from vgpu.core.config import DevicePluginConfig
from vgpu.demo import hamicore
from vgpu.gpu import fake
from vgpu.localcluster import statuswriter
from vgpu.localcluster.client import LocalKubeApi
from vgpu.localcluster.kubelet import KubeletEmulator
from vgpu.localcluster.store import Store
from vgpu_device_plugin import dirwatch, reporter
from vgpu_device_plugin.hostfs import HostFs
from vgpu_device_plugin.manager import Deps, PluginManager
from vgpu_device_plugin.podcache import InformerView

from bench.percentile import pct

NODE = "bench-node"
RESOURCE = "nvidia.com/gpu"


async def _allocatable(store: Store, want: str, deadline_s: float, *, since: str | None = None) -> None:
    watcher = store.watch("nodes", field_selector=f"metadata.name={NODE}", resource_version=since)
    try:
        while True:
            event = await watcher.next_event(timeout_s=deadline_s)
            if event is None:
                raise TimeoutError(f"allocatable never became {want}")
            if (event.object.get("status") or {}).get("allocatable", {}).get(RESOURCE) == want:
                return
    finally:
        watcher.close()


async def bench(*, rounds: int, mode: str, poll_s: float) -> dict[str, Any]:
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="rr", dir="/tmp"))
    plugin_dir = tmp / "dp"
    store = Store()
    store.create("nodes", {"metadata": {"name": NODE}})
    api = LocalKubeApi(store)
    kubelet = KubeletEmulator(
        api,
        node=NODE,
        socket_dir=plugin_dir,
        status_writer=statuswriter.StoreStatusWriter(store),
        readmit_delay_s=None,
    )
    await kubelet.start()
    backend = fake.FakeGpuBackend.from_yaml(
        {
            "gpus": [
                {
                    "uuid": f"GPU-{i:08x}-0000-0000-0000-000000000000",
                    "name": "NVIDIA H100",
                    "memoryMib": 81920,
                }
                for i in range(8)
            ]
        },
        seed=NODE,
    )
    backend.open()
    cfg = DevicePluginConfig(kubelet_poll_s=poll_s, outside_usage_enabled=False, device_split_count=10)
    keys = annotations.Keys()
    view = InformerView(api, node=NODE)
    host_root = tmp / "host"
    hamicore.install_stand_in(host_root, hook_path=cfg.hook_path)  # as the chart's installer leaves a node
    deps = Deps(
        backend=backend,
        api=api,
        view=view,
        reporter=reporter.NodeReporter(
            api,
            node=NODE,
            keys=keys,
            lease_namespace="kube-system",
            lease_duration_s=40,
            register_interval_s=300,
        ),
        config=cfg,
        node=NODE,
        plugin_dir=plugin_dir,
        host=HostFs(host_root, hook_path=cfg.hook_path),
        keys=keys,
        dir_watcher=dirwatch.InotifyWatcher() if mode == "inotify" else dirwatch.NoWatcher(),
    )
    manager = PluginManager(deps)
    view_task = asyncio.create_task(view.run())
    await view.wait_synced()
    task = asyncio.create_task(manager.run())
    want = str(8 * cfg.device_split_count)
    times_s: list[float] = []
    try:
        await _allocatable(store, want, 10)
        for _ in range(rounds):
            done = asyncio.create_task(
                _allocatable(store, want, 10 + 2 * poll_s, since=store.resource_version)
            )
            await kubelet.restart()
            start = time.perf_counter()
            await done
            times_s.append(time.perf_counter() - start)
    finally:
        manager.request_stop()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, 10)
        view_task.cancel()
        await asyncio.gather(view_task, return_exceptions=True)
        await kubelet.stop()
        backend.close()
        shutil.rmtree(tmp, ignore_errors=True)
    ms = [t * 1000 for t in times_s]
    return {
        "mode": mode,
        "poll_s": poll_s,
        "rounds": rounds,
        "sessions": manager.sessions_started,
        "p50_ms": round(pct(ms, 0.5), 2),
        "p99_ms": round(pct(ms, 0.99), 2),
        "max_ms": round(max(ms), 2),
        "mean_ms": round(statistics.fmean(ms), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--mode", choices=("inotify", "poll"), default="inotify")
    parser.add_argument("--poll-s", type=float, default=1.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = asyncio.run(bench(rounds=args.rounds, mode=args.mode, poll_s=args.poll_s))
    if args.json:
        print(json.dumps(result))
    else:
        print(
            f"kubelet restart → devices healthy again ({result['mode']}, poll {result['poll_s']:g} s, "
            f"{result['rounds']} rounds): p50 {result['p50_ms']} ms, p99 {result['p99_ms']} ms, "
            f"max {result['max_ms']} ms (sessions {result['sessions']})"
        )


if __name__ == "__main__":
    main()
