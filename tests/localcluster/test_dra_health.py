"""The emulated kubelet's DRA device health (KEP-4680, as kubelet 1.36 does it): each registered
plugin's NodeWatchResources stream read into a cache, the pods holding a changed device synced,
``allocatedResourcesStatus`` written as kubelet writes it; a plugin without the service (Unimplemented)
or whose stream ends leaves its devices Unknown and is called again. Against small plugins and the
real kube-vgpu DRA plugin over real unix sockets."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from vgpu.core.dra import names
from vgpu.core.dra.cdiclaim import PreparedDevice
from vgpu.gpu.fake import FakeGpuBackend
from vgpu.kubeletapi.drahealth.v1alpha1 import api_pb2 as pb
from vgpu.localcluster import kubeletdrahealth as kh
from vgpu.localcluster.client import LocalKubeApi
from vgpu.localcluster.kubelet import KubeletEmulator
from vgpu.localcluster.statuswriter import StoreStatusWriter
from vgpu.localcluster.store import Store
from vgpu_device_plugin import dirwatch, inventory
from vgpu_device_plugin.dra import healthwatch, registrar, service, slicepub
from vgpu_device_plugin.dra.prepare import Prepared as Answer
from vgpu_device_plugin.health import HealthMonitor, HealthTracker

from tests.device_plugin.builders import GPU_A, fake_backend
from tests.device_plugin.builders import config as plugin_config
from tests.localcluster.conftest import make_node, wait_for
from tests.localcluster.draplugin import TestDraPlugin
from tests.localcluster.test_dra_kubelet import _allocated_pod


@pytest.fixture
async def kubelet(
    store: Store, api: LocalKubeApi, status_writer: StoreStatusWriter, sock_dir: Path
) -> AsyncIterator[KubeletEmulator]:
    store.create("nodes", make_node("n1"))
    emu = KubeletEmulator(
        api,
        node="n1",
        socket_dir=sock_dir / "dp",
        status_writer=status_writer,
        plugins_registry_dir=sock_dir / "reg",
        cdi_spec_dirs=[sock_dir / "cdi"],
        dra_retry_s=0.02,
        dra_health_retry_s=0.02,
    )
    await emu.start()
    yield emu
    await emu.stop()


@pytest.fixture
async def plugin(sock_dir: Path) -> AsyncIterator[TestDraPlugin]:
    p = TestDraPlugin(
        registry_dir=sock_dir / "reg", plugin_dir=sock_dir / "plugin", cdi_dir=sock_dir / "cdi", health=True
    )
    (sock_dir / "reg").mkdir(exist_ok=True)
    yield p
    await p.stop()


def resources(pod: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    return [
        (rs["name"], r["resourceID"], r["health"], r.get("message", ""))
        for cs in pod["status"].get("containerStatuses") or []
        for rs in cs.get("allocatedResourcesStatus") or []
        for r in rs["resources"]
    ]


def health_is(*expected: tuple[str, str]) -> Any:
    return lambda p: [(h, m) for _, _, h, m in resources(p)] == list(expected)


async def test_a_running_pod_shows_its_devices_health_as_the_plugin_streams_it(
    store: Store, api: LocalKubeApi, kubelet: KubeletEmulator, plugin: TestDraPlugin
) -> None:
    await plugin.start()
    await asyncio.wait_for(plugin.health_watched.wait(), 10)  # kubelet calls it once registered
    _allocated_pod(store, "p")
    running = await wait_for(api, "pods", "p", lambda p: p["status"].get("phase") == "Running")
    claim = store.get("resourceclaims", "p-claim", namespace="default")
    cdi_id = f"{names.CDI_KIND}={names.cdi_device(claim['metadata']['uid'], 'gpu')}"
    # nothing heard yet: Unknown, under the pod's claim entry name, named by the first CDI id
    assert resources(running) == [("claim:vgpu-0", cdi_id, "Unknown", "")]
    plugin.send_health(("gpu-0", pb.HEALTHY, ""))
    await wait_for(api, "pods", "p", health_is(("Healthy", "")))
    plugin.send_health(("gpu-0", pb.UNHEALTHY, "XID 79 critical error"))
    await wait_for(api, "pods", "p", health_is(("Unhealthy", "XID 79 critical error")))
    plugin.send_health(("gpu-1", pb.UNHEALTHY, "not this pod's"), ("gpu-0", pb.HEALTHY, ""))
    pod = await wait_for(api, "pods", "p", health_is(("Healthy", "")))
    assert pod["status"]["phase"] == "Running" and pod["status"]["containerStatuses"][0]["ready"]
    # the stream ends: kubelet forgets the driver's health and calls again
    plugin.health_watched.clear()
    plugin.end_health_streams()
    await asyncio.wait_for(plugin.health_watched.wait(), 10)
    assert kubelet.dra is not None
    assert kubelet.dra.registry.health.cache.get(names.DRIVER, "n1", "gpu-0") == ("Unknown", "")


async def test_a_plugin_without_the_health_service_leaves_the_devices_unknown(
    store: Store, api: LocalKubeApi, kubelet: KubeletEmulator, plugin: TestDraPlugin
) -> None:
    plugin.health = False  # kubelet's calls get Unimplemented, again and again
    await plugin.start()
    await asyncio.wait_for(plugin.registered.wait(), 10)
    _allocated_pod(store, "p")
    running = await wait_for(api, "pods", "p", lambda p: p["status"].get("phase") == "Running")
    assert [h for _, _, h, _ in resources(running)] == ["Unknown"]


async def test_the_real_plugins_xid_reaches_the_pod_status(
    store: Store, api: LocalKubeApi, kubelet: KubeletEmulator, sock_dir: Path
) -> None:
    """kube-vgpu's DRA plugin (its health watcher on the fake backend) behind the emulated kubelet."""

    class Prepared:
        """Prepare answers the claim with the device the allocation names (gpu-0)."""

        async def prepare(self, claims: Sequence[Any]) -> dict[str, Any]:
            device = PreparedDevice(
                request="gpu", pool="n1", device="gpu-0", cdi_device_ids=(), share_id=None
            )
            return {c.uid: Answer(devices=(device,), error="") for c in claims}

        async def unprepare(self, claims: Sequence[Any]) -> dict[str, str]:
            return {c.uid: "" for c in claims}

    backend: FakeGpuBackend = fake_backend()
    backend.open()
    cfg = plugin_config()
    inv = inventory.build(backend.devices(), cfg)
    tracker = HealthTracker([g.uuid for g in inv.gpus], clock=lambda: 0.0, recovery_s=60, ignored_xids=())
    monitor = HealthMonitor(backend, tracker, probe_interval_s=3600)
    server = service.DraServer(
        Prepared(),
        sock_dir / "plugin" / names.DRA_SOCKET,
        health=healthwatch.MonitorHealth(slicepub.MonitorSource("n1", inv, cfg, monitor)),
    )
    await server.start()
    reg = registrar.Registrar(
        registrar.RegistrationService(driver=names.DRIVER, endpoint=server.socket_path),
        sock_dir / "reg" / names.REGISTRATION_SOCKET,
        watcher=dirwatch.NoWatcher(),
        node="n1",
    )
    await reg.start()
    watching = asyncio.create_task(monitor.run())
    try:
        _allocated_pod(store, "p")
        await wait_for(api, "pods", "p", health_is(("Healthy", "")))
        backend.inject_xid(GPU_A, 79)
        pod = await wait_for(api, "pods", "p", health_is(("Unhealthy", "XID 79 critical error")))
        assert [rid for _, rid, _, _ in resources(pod)] == [f"{names.DRIVER}/n1/gpu-0"]  # no CDI id
    finally:
        watching.cancel()
        await asyncio.gather(watching, return_exceptions=True)
        await reg.stop()
        await server.stop(grace_s=0)
        backend.close()
        shutil.rmtree(sock_dir / "plugin", ignore_errors=True)


def _device(name: str, *, request: str = "gpu", cdi: tuple[str, ...] = ()) -> kh.PreparedDevice:
    return kh.PreparedDevice(names.DRIVER, (request,), "n1", name, cdi)


def _message(name: str, health: int, message: str = "", timeout_s: int = 0) -> pb.DeviceHealth:
    return pb.DeviceHealth(
        device=pb.DeviceIdentifier(pool_name="n1", device_name=name),
        health=health,  # type: ignore[arg-type]
        message=message,
        health_check_timeout_seconds=timeout_s,
    )


def test_the_cache_times_devices_out_as_kubelet_does() -> None:
    now = [0.0]
    cache = kh.HealthCache(clock=lambda: now[0])
    assert cache.update(
        "d", [_message("gpu-0", pb.HEALTHY), _message("gpu-1", pb.HEALTHY, timeout_s=60)]
    ) == {
        ("n1", "gpu-0"),
        ("n1", "gpu-1"),
    }
    assert cache.update("d", [_message("gpu-0", pb.HEALTHY)]) == set()  # no change: no pod sync
    now[0] = 31.0  # past the 30 s default for gpu-0 (received at 0), within gpu-1's 60 s
    assert cache.get("d", "n1", "gpu-0") == ("Unknown", "")
    assert cache.get("d", "n1", "gpu-1") == ("Healthy", "")
    now[0] = 61.0  # a message without gpu-1 after its timeout turns it Unknown, a change
    assert cache.update("d", [_message("gpu-0", pb.UNHEALTHY, "x" * 2000)]) == {
        ("n1", "gpu-0"),
        ("n1", "gpu-1"),
    }
    health, message = cache.get("d", "n1", "gpu-0")
    assert health == "Unhealthy" and len(message) == 1024 and message.endswith("...")
    assert cache.get("d", "n1", "gpu-1") == ("Unknown", "")
    assert cache.update("d", [_message("gpu-2", 7)]) == {("n1", "gpu-2")}  # an unknown value
    assert cache.get("d", "n1", "gpu-2") == ("Unknown", "")
    cache.clear("d")
    assert cache.get("d", "n1", "gpu-0") == ("Unknown", "")


def test_allocated_resources_status_follows_kubelets_naming() -> None:
    cache = kh.HealthCache(clock=lambda: 0.0)
    cache.update(names.DRIVER, [_message("gpu-0", pb.HEALTHY), _message("gpu-1", pb.UNHEALTHY, "lost")])
    pod = {
        "spec": {
            "containers": [
                {
                    "name": "a",
                    "resources": {"claims": [{"name": "vgpu-0"}, {"name": "other", "request": "b"}]},
                },
                {"name": "b", "resources": {"claims": [{"name": "unprepared"}]}},
                {"name": "c"},
            ]
        }
    }
    claims = {
        "vgpu-0": [
            _device("gpu-0", cdi=("k/c=1", "k/c=2")),
            _device("gpu-1"),
            _device("gpu-0", cdi=("k/c=1",)),
        ],
        "other": [_device("gpu-0", request="a"), _device("gpu-1", request="b")],
    }
    statuses = [{"name": "a", "allocatedResourcesStatus": [{"name": "stale"}]}, {"name": "b"}, {"name": "c"}]
    out = kh.container_statuses(pod, statuses, claims=claims, cache=cache)
    assert out[0]["allocatedResourcesStatus"] == [
        {
            "name": "claim:vgpu-0",
            "resources": [  # the first CDI id names a device; a duplicate id is dropped
                {"resourceID": "k/c=1", "health": "Healthy"},
                {"resourceID": f"{names.DRIVER}/n1/gpu-1", "health": "Unhealthy", "message": "lost"},
            ],
        },
        {
            "name": "claim:other/b",  # only the devices of the request named
            "resources": [
                {"resourceID": f"{names.DRIVER}/n1/gpu-1", "health": "Unhealthy", "message": "lost"}
            ],
        },
    ]
    assert out[1] == {"name": "b"} and out[2] == {"name": "c"}  # no prepared claim: no entry
    assert statuses[0]["allocatedResourcesStatus"] == [{"name": "stale"}]  # the input is not changed
