"""A kubelet restart against the emulated kubelet ≥ 1.27, which admits the pods it runs again shortly
after re-creating kubelet.sock: a pod whose GPU init container has finished survives only if the
plugin registered again and sent its devices by then (kubernetes #124345, #133382)."""

import asyncio
import contextlib
import pathlib
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from vgpu.localcluster import kubeletadmit, statuswriter
from vgpu.localcluster.kubelet import KubeletEmulator
from vgpu.localcluster.store import Store
from vgpu_device_plugin import dirwatch
from vgpu_device_plugin.manager import Deps, PluginManager
from vgpu_device_plugin.podcache import InformerView

from tests.device_plugin.builders import (
    GPU_A,
    KEYS,
    NODE,
    cluster,
    config,
    fake_backend,
    installed_host,
    node_reporter,
    short_tmp,
)
from tests.device_plugin.test_kubelet_emulation import gpu_allocatable, settled, wait_for

READMIT_DELAY_S = 2.0  # generous for a loaded machine; polling (every 60 s here) never makes it


@dataclass
class Rig:
    store: Store
    kubelet: KubeletEmulator
    manager: PluginManager


@contextlib.asynccontextmanager
async def rig(
    tmp_path: pathlib.Path,
    watcher: dirwatch.DirWatcher,
    *,
    topology_hint: kubeletadmit.TopologyHint | None = None,
    kubelet_version: str | None = None,
    cdi_spec_dirs: list[pathlib.Path] | None = None,
    **cfg: Any,
) -> AsyncIterator[Rig]:
    """The emulated kubelet (re-admitting ``READMIT_DELAY_S`` after a restart; a CDI-capable
    runtime with ``cdi_spec_dirs``; containers started on ``tmp_path``) and the plugin (polling
    every 60 s unless ``cfg`` says otherwise), real sockets, watch-fed caches; ``tmp_path`` is the
    host root of both."""
    plugin_dir = short_tmp()
    store, api = cluster()
    if kubelet_version is not None:  # as kubelet writes it, before the plugin's watch lists the node
        store.patch(
            "nodes", NODE, {"status": {"nodeInfo": {"kubeletVersion": kubelet_version}}}, subresource="status"
        )
    kubelet = KubeletEmulator(
        api,
        node=NODE,
        socket_dir=plugin_dir,
        status_writer=statuswriter.StoreStatusWriter(store),
        readmit_delay_s=READMIT_DELAY_S,
        topology_hint=topology_hint,
        cdi_spec_dirs=cdi_spec_dirs,
        host_root=tmp_path,  # the plugin's host root: the runtime prepares the answers' mounts there
    )
    await kubelet.start()
    cfg = config(**{"device_split_count": 2, "kubelet_poll_s": 60, "outside_usage_enabled": False, **cfg})
    view = InformerView(api, node=NODE)
    deps = Deps(
        backend=fake_backend(),
        api=api,
        view=view,
        reporter=node_reporter(api),
        config=cfg,
        node=NODE,
        plugin_dir=plugin_dir,
        host=installed_host(tmp_path, hook_path=cfg.hook_path),
        dir_watcher=watcher,
    )
    manager = PluginManager(deps)
    view_task = asyncio.create_task(view.run())
    await asyncio.wait_for(view.wait_synced(), 10)
    task = asyncio.create_task(manager.run())
    try:
        await wait_for(store, "nodes", NODE, gpu_allocatable(4))
        yield Rig(store, kubelet, manager)
    finally:
        manager.request_stop()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, 10)
        view_task.cancel()
        await asyncio.gather(view_task, return_exceptions=True)
        await kubelet.stop()
        shutil.rmtree(plugin_dir, ignore_errors=True)


def init_and_main_pod(store: Store, name: str) -> None:
    """A GPU init container (it finishes) and a GPU app container, each one virtual device."""
    entry = f"{GPU_A},NVIDIA,1000,10:"
    gpu = {"limits": {"nvidia.com/gpu": "1"}}
    store.create(
        "pods",
        {
            "metadata": {
                "name": name,
                "annotations": {
                    KEYS.assigned_node: NODE,
                    KEYS.bind_phase: "allocating",
                    KEYS.bind_time: "100",
                    KEYS.devices_to_allocate: f"{entry};{entry};",
                    KEYS.devices_allocated: f"{entry};{entry};",
                },
            },
            "spec": {
                "nodeName": NODE,
                "initContainers": [{"name": "prep", "image": "x", "resources": gpu}],
                "containers": [{"name": "train", "image": "x", "resources": gpu}],
            },
        },
        namespace="default",
    )


def phase_of(store: Store, name: str) -> str:
    return str(store.get("pods", name, namespace="default")["status"].get("phase"))


async def test_inotify_registers_again_before_kubelet_readmits_and_the_pod_survives(
    tmp_path: pathlib.Path,
) -> None:
    async with rig(tmp_path, dirwatch.InotifyWatcher()) as r:
        init_and_main_pod(r.store, "p")
        pod = await wait_for(r.store, "pods", "p", settled, namespace="default")
        assert pod["status"]["phase"] == "Running"
        await r.kubelet.restart()
        await asyncio.wait_for(r.manager.wait_registered(2), READMIT_DELAY_S)  # before re-admission
        assert r.manager.sessions_started == 1  # no new session: the inventory stayed in memory
        await asyncio.wait_for(r.kubelet.readmitted.wait(), 10)
        assert phase_of(r.store, "p") == "Running"


async def test_polling_alone_registers_too_late_and_kubelet_rejects_the_pod(tmp_path: pathlib.Path) -> None:
    """Where inotify is unavailable the plugin polls: with a poll slower than kubelet's re-admission
    the pod is lost, as it was with the 1 s poll before the watch."""
    async with rig(tmp_path, dirwatch.NoWatcher()) as r:
        init_and_main_pod(r.store, "p")
        await wait_for(r.store, "pods", "p", settled, namespace="default")
        await r.kubelet.restart()
        await asyncio.wait_for(r.kubelet.readmitted.wait(), 10)
        pod = r.store.get("pods", "p", namespace="default")
        assert pod["status"]["phase"] == "Failed"
        assert pod["status"]["reason"] == "UnexpectedAdmissionError"
        assert pod["status"]["message"] == (
            "Pod was rejected: Allocate failed due to no healthy devices present; cannot allocate "
            "unhealthy devices nvidia.com/gpu, which is unexpected"
        )


async def test_without_inotify_polling_still_registers_again_within_the_session(
    tmp_path: pathlib.Path,
) -> None:
    async with rig(tmp_path, dirwatch.NoWatcher(), kubelet_poll_s=0.02) as r:
        await r.kubelet.restart()
        await asyncio.wait_for(r.manager.wait_registered(2), 10)
        assert r.manager.sessions_started == 1


async def test_our_socket_removed_alone_is_served_and_registered_again(tmp_path: pathlib.Path) -> None:
    """kubelet.sock unchanged: a restart under way is waited for one check, then the socket is
    served again and registered (kubelet replaces the endpoint)."""
    async with rig(tmp_path, dirwatch.InotifyWatcher(), kubelet_poll_s=0.05) as r:
        (r.kubelet.socket_dir / "nvidia-gpu.sock").unlink()
        await asyncio.wait_for(r.manager.wait_registered(2), 10)
        assert (r.kubelet.socket_dir / "nvidia-gpu.sock").exists()
        assert r.manager.sessions_started == 1
