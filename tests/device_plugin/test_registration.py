"""Registration with kubelet: MIG resource names kubelet accepts, one resource's failed Register
leaving the others serving, and the liveness Lease renewed only while kubelet has the plugin."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import pathlib
import shutil
from collections.abc import AsyncIterator
from typing import Any

import pytest
from vgpu.gpu import fake
from vgpu.localcluster import statuswriter
from vgpu.localcluster.kubelet import KubeletEmulator
from vgpu.localcluster.store import Store
from vgpu_device_plugin import inventory
from vgpu_device_plugin.manager import Deps, PluginManager

from tests.device_plugin.builders import (
    NODE,
    StoreView,
    cluster,
    config,
    installed_host,
    node_reporter,
    short_tmp,
)
from tests.device_plugin.fakekubelet import FakeKubelet

MIG_GPUS = {
    "gpus": [
        {"uuid": "GPU-plain", "name": "NVIDIA A100", "memoryMib": 40960},
        {
            "uuid": "GPU-mig",
            "name": "NVIDIA A100",
            "memoryMib": 40960,
            "migEnabled": True,
            "migInstances": [
                {"uuid": "MIG-1", "profile": "1g.10gb+me", "memoryMib": 9856, "start": 0},
                {"uuid": "MIG-2", "profile": "1g.5gb", "memoryMib": 4864, "start": 1},
            ],
        },
    ]
}


@pytest.mark.parametrize(
    ("profile", "want"),
    [
        ("1g.5gb", "nvidia.com/mig-1g.5gb"),
        ("1g.10gb+me", "nvidia.com/mig-1g.10gb.me"),  # NVIDIA's rule: + becomes .
        ("4g.40gb+gfx+me", "nvidia.com/mig-4g.40gb.gfx.me"),
        ("1c.2g.20gb", "nvidia.com/mig-1c.2g.20gb"),
        ("2g 20gb", "nvidia.com/mig-2g-20gb"),  # anything else kubelet refuses: -
        ("+1g.5gb+", "nvidia.com/mig-1g.5gb"),  # no trailing or leading separator
        ("ééé", None),  # garbage: nothing left
        ("", None),
        ("x" * 80, None),  # past kubelet's 63 characters
    ],
    ids=["plain", "plus", "two-plus", "compute", "space", "edges", "garbage", "empty", "too-long"],
)
def test_mig_resource_names_are_what_kubelet_accepts(profile: str, want: str | None) -> None:
    assert inventory.mig_resource_name("nvidia.com", profile) == want


def test_profiles_that_clean_to_one_name_are_not_merged() -> None:
    gpus = fake.FakeGpuBackend.from_yaml(
        {
            "gpus": [
                {
                    "uuid": "GPU-mig",
                    "name": "NVIDIA A100",
                    "memoryMib": 40960,
                    "migEnabled": True,
                    "migInstances": [
                        {"uuid": "MIG-1", "profile": "1g.10gb+me", "memoryMib": 9856, "start": 0},
                        {"uuid": "MIG-2", "profile": "1g.10gb.me", "memoryMib": 9856, "start": 1},
                    ],
                }
            ]
        }
    )
    inv = inventory.build(gpus.devices(), config(mig_strategy="mixed"))
    by_name = {r.name: [d.id for d in r.devices] for r in inv.resources}
    assert by_name == {"nvidia.com/gpu": [], "nvidia.com/mig-1g.10gb.me": ["MIG-1"]}  # the first in order


@contextlib.asynccontextmanager
async def plugin(
    store: Store, api: Any, plugin_dir: pathlib.Path, tmp_path: pathlib.Path, **cfg: Any
) -> AsyncIterator[PluginManager]:
    backend = fake.FakeGpuBackend.from_yaml(MIG_GPUS)
    settings = config(mig_strategy="mixed", device_split_count=2, kubelet_poll_s=0.02, **cfg)
    deps = Deps(
        backend=backend,
        api=api,
        view=StoreView(store),
        reporter=node_reporter(api),
        config=settings,
        node=NODE,
        plugin_dir=plugin_dir,
        host=installed_host(tmp_path),
    )
    manager = PluginManager(deps)
    task = asyncio.create_task(manager.run())
    try:
        yield manager
    finally:
        manager.request_stop()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, 10)
        backend.close()
        shutil.rmtree(plugin_dir, ignore_errors=True)


async def _node_reports(store: Store, resources: set[str]) -> None:
    watcher = store.watch("nodes", field_selector=f"metadata.name={NODE}")
    try:
        while True:
            event = await watcher.next_event(timeout_s=10)
            assert event is not None, f"node never reported {resources}"
            allocatable = (event.object.get("status") or {}).get("allocatable") or {}
            if all(int(allocatable.get(r, "0")) > 0 for r in resources):
                return
    finally:
        watcher.close()


async def test_a_plus_in_a_mig_profile_registers_cleaned_with_a_real_kubelets_checks(
    tmp_path: pathlib.Path,
) -> None:
    """The emulated kubelet refuses a ``+`` in a resource name as kubelet does."""
    plugin_dir = short_tmp()
    store, api = cluster()
    kubelet = KubeletEmulator(
        api, node=NODE, socket_dir=plugin_dir, status_writer=statuswriter.StoreStatusWriter(store)
    )
    await kubelet.start()
    try:
        async with plugin(store, api, plugin_dir, tmp_path):
            await _node_reports(
                store, {"nvidia.com/gpu", "nvidia.com/mig-1g.10gb.me", "nvidia.com/mig-1g.5gb"}
            )
    finally:
        await kubelet.stop()


async def test_one_resources_failed_register_leaves_the_others_serving(tmp_path: pathlib.Path) -> None:
    plugin_dir = short_tmp()
    store, api = cluster()
    kubelet = FakeKubelet(plugin_dir)
    kubelet.reject = {"nvidia.com/mig-1g.5gb"}
    await kubelet.start()
    try:
        async with plugin(store, api, plugin_dir, tmp_path, start_retry_s=0.05) as manager:
            await asyncio.wait_for(manager.wait_started(1), 10)
            await kubelet.wait_registrations(2)
            assert {r.resource_name for r in kubelet.registrations} == {
                "nvidia.com/gpu",
                "nvidia.com/mig-1g.10gb.me",
            }
            assert len(await kubelet.next_list()) in (2, 1)  # a served resource's devices
            assert (plugin_dir / "nvidia-gpu.sock").exists()
            kubelet.reject.clear()  # kubelet takes it now: the retry registers it, same session
            await kubelet.wait_registrations(3)
            assert manager.sessions_started == 1
            assert "nvidia.com/mig-1g.5gb" in kubelet.rejected
    finally:
        await kubelet.stop()


# --- the liveness Lease (issue 48 item 7) -------------------------------------------------------


def _lease(store: Store) -> dict[str, Any] | None:
    items = store.list("leases", namespace="kube-system").items
    return items[0] if items else None


async def _lease_written(store: Store, *, after: str | None = None) -> dict[str, Any]:
    watcher = store.watch("leases", namespace="kube-system")
    try:
        found = _lease(store)
        while found is None or found["metadata"]["resourceVersion"] == after:
            event = await watcher.next_event(timeout_s=10)
            assert event is not None, "the Lease was never written"
            found = event.object
        return found
    finally:
        watcher.close()


class _Said(logging.Handler):
    """Sets ``event`` when a record with ``words`` is logged (on the loop's thread, as the manager logs)."""

    def __init__(self, words: str) -> None:
        super().__init__()
        self.words = words
        self.event = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.words in record.getMessage():
            self.event.set()


async def test_no_lease_while_kubelet_has_not_opened_list_and_watch(tmp_path: pathlib.Path) -> None:
    said = _Said("no ListAndWatch stream open")
    logging.getLogger("vgpu_device_plugin.lease").addHandler(said)
    plugin_dir = short_tmp()
    store, api = cluster()
    kubelet = FakeKubelet(plugin_dir, watch=False)
    await kubelet.start()
    try:
        async with plugin(store, api, plugin_dir, tmp_path, lease_renew_s=0.02) as manager:
            await asyncio.wait_for(manager.wait_started(1), 10)
            await asyncio.wait_for(said.event.wait(), 10)
            assert _lease(store) is None
            assert not manager.alive
            channel, stub = await kubelet.call("nvidia-gpu.sock")  # now kubelet watches
            async with channel:
                from vgpu.kubeletapi.v1beta1 import api_pb2

                stream = stub.ListAndWatch(api_pb2.Empty())
                await stream.read()
                await _lease_written(store)
                assert manager.alive
                stream.cancel()
    finally:
        logging.getLogger("vgpu_device_plugin.lease").removeHandler(said)
        await kubelet.stop()


async def test_lease_stops_when_kubelet_loses_the_plugin_and_resumes_on_register(
    tmp_path: pathlib.Path,
) -> None:
    plugin_dir = short_tmp()
    store, api = cluster()
    kubelet = FakeKubelet(plugin_dir)
    await kubelet.start()
    try:
        async with plugin(
            store, api, plugin_dir, tmp_path, lease_renew_s=0.02, start_retry_s=0.02
        ) as manager:
            first = await _lease_written(store)
            await _lease_written(store, after=first["metadata"]["resourceVersion"])  # renewed
            said = _Said("no ListAndWatch stream open")
            logging.getLogger("vgpu_device_plugin.lease").addHandler(said)
            try:
                await kubelet.stop()  # kubelet gone: streams closed, kubelet.sock removed
                await asyncio.wait_for(said.event.wait(), 10)
            finally:
                logging.getLogger("vgpu_device_plugin.lease").removeHandler(said)
            held = _lease(store)
            assert held is not None and not manager.alive
            watcher = store.watch("leases", namespace="kube-system")
            try:  # many lease periods (0.02 s) pass with no write: the scheduler sees it expire
                event = await watcher.next_event(timeout_s=0.5)
                if event is not None and event.type == "ADDED":  # the watch's listing of the Lease
                    assert event.object == held
                    event = await watcher.next_event(timeout_s=0.5)
                assert event is None
            finally:
                watcher.close()
            assert _lease(store) == held
            await kubelet.start()  # a new kubelet.sock: registered again within the session
            await _lease_written(store, after=held["metadata"]["resourceVersion"])
            assert manager.alive and manager.sessions_started == 1
    finally:
        await kubelet.stop()
