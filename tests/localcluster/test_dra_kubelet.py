"""The emulated kubelet's DRA: plugin registration through plugins_registry, NodePrepareResources
before a pod's containers start (its CDI devices applied by the runtime emulation), and
NodeUnprepareResources when the pod is gone; against a small DRA plugin over real unix sockets."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from vgpu.core.dra import names
from vgpu.localcluster.client import LocalKubeApi
from vgpu.localcluster.kubelet import ALLOCATIONS_ANNOTATION, KubeletEmulator
from vgpu.localcluster.statuswriter import StoreStatusWriter
from vgpu.localcluster.store import Store

from tests.localcluster import draobjects as dra
from tests.localcluster.conftest import make_node, wait_event, wait_for
from tests.localcluster.draplugin import TestDraPlugin


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
    )
    await emu.start()
    yield emu
    await emu.stop()


@pytest.fixture
async def plugin(sock_dir: Path) -> AsyncIterator[TestDraPlugin]:
    p = TestDraPlugin(registry_dir=sock_dir / "reg", plugin_dir=sock_dir / "plugin", cdi_dir=sock_dir / "cdi")
    (sock_dir / "reg").mkdir(exist_ok=True)
    yield p
    await p.stop()


def _allocated_pod(store: Store, name: str, *, reserve: bool = True) -> dict[str, Any]:
    """A pod bound to n1 with one allocated claim (what kube-scheduler leaves behind)."""
    claim = store.create(
        "resourceclaims", dra.claim(f"{name}-claim", dra.gpu_request(memory_mib=100)), namespace="default"
    )
    body = dra.dra_pod(name, "unused")
    body["spec"]["resourceClaims"] = [{"name": "vgpu-0", "resourceClaimName": f"{name}-claim"}]
    body["spec"]["nodeName"] = "n1"
    pod = store.create("pods", body, namespace="default")
    status: dict[str, Any] = {
        "allocation": {
            "devices": {
                "results": [{"request": "gpu", "driver": names.DRIVER, "pool": "n1", "device": "gpu-0"}]
            }
        }
    }
    if reserve:
        status["reservedFor"] = [{"resource": "pods", "name": name, "uid": pod["metadata"]["uid"]}]
    store.patch(
        "resourceclaims",
        claim["metadata"]["name"],
        {"status": status},
        namespace="default",
        subresource="status",
    )
    return pod


async def test_a_dra_plugin_registers_and_prepared_claims_reach_the_container(
    store: Store, api: LocalKubeApi, kubelet: KubeletEmulator, plugin: TestDraPlugin
) -> None:
    await plugin.start()
    await asyncio.wait_for(plugin.registered.wait(), 10)
    assert plugin.statuses == [(True, "")]
    assert kubelet.dra is not None and kubelet.dra.registry.drivers == [names.DRIVER]
    pod = _allocated_pod(store, "p")
    running = await wait_for(api, "pods", "p", lambda p: p["status"].get("phase") == "Running")
    claim = store.get("resourceclaims", "p-claim", namespace="default")
    assert plugin.prepared == [[claim["metadata"]["uid"]]]
    recorded = json.loads(running["metadata"]["annotations"][ALLOCATIONS_ANNOTATION])
    device = f"{names.CDI_KIND}={names.cdi_device(claim['metadata']['uid'], 'gpu')}"
    assert recorded["c0"]["cdiDevices"] == [device]
    assert recorded["c0"]["cdi"]["env"] == ["CLAIM=default/p-claim"]  # the runtime applied the spec

    store.delete("pods", "p", namespace="default")
    async with asyncio.timeout(10):
        while not plugin.unprepared:
            plugin.calls.clear()
            await plugin.calls.wait()
    assert plugin.unprepared == [[claim["metadata"]["uid"]]]
    assert not plugin.spec_path(claim["metadata"]["uid"]).exists()
    assert pod["metadata"]["uid"]


async def test_a_v1beta1_only_plugin_is_called_on_v1beta1(
    store: Store, api: LocalKubeApi, kubelet: KubeletEmulator, plugin: TestDraPlugin
) -> None:
    plugin.versions = ("v1beta1.DRAPlugin",)
    await plugin.start()
    await asyncio.wait_for(plugin.registered.wait(), 10)
    _allocated_pod(store, "p")
    await wait_for(api, "pods", "p", lambda p: p["status"].get("phase") == "Running")
    assert kubelet.dra is not None and kubelet.dra.registry.get(names.DRIVER).service == "v1beta1.DRAPlugin"


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"versions": ("v2.DRAPlugin",)}, "none of services supported by the plugin"),
        ({"versions": ()}, "empty list of supported gRPC services"),
        ({"plugin_type": "CSIPlugin"}, "no handler registered for plugin type: CSIPlugin"),
    ],
    ids=["unknown-version", "no-version", "wrong-type"],
)
async def test_a_plugin_kubelet_cannot_use_is_told_why(
    kubelet: KubeletEmulator, plugin: TestDraPlugin, kwargs: dict[str, Any], error: str
) -> None:
    for key, value in kwargs.items():
        setattr(plugin, key, value)
    await plugin.start()
    await asyncio.wait_for(plugin.registered.wait(), 10)
    ((ok, message),) = plugin.statuses
    assert not ok and message.startswith("RegisterPlugin error -- ") and error in message
    assert kubelet.dra is not None and kubelet.dra.registry.drivers == []


async def test_prepare_failures_keep_the_pod_pending_with_kubelets_event_and_are_retried(
    store: Store, api: LocalKubeApi, kubelet: KubeletEmulator, plugin: TestDraPlugin
) -> None:
    _allocated_pod(store, "early")  # no plugin yet
    event = await wait_event(api, "early", reason="FailedPrepareDynamicResources")
    assert event["message"] == (
        f"Failed to prepare dynamic resources: prepare dynamic resources: DRA driver {names.DRIVER} is not registered"
    )
    plugin.fail_prepare = "no such GPU"
    await plugin.start()
    async with asyncio.timeout(10):
        while not plugin.prepared:
            plugin.calls.clear()
            await plugin.calls.wait()
    assert (await api.get("pods", "early", namespace="default"))["status"]["phase"] == "Pending"
    plugin.fail_prepare = ""
    await wait_for(api, "pods", "early", lambda p: p["status"].get("phase") == "Running")


async def test_a_claim_not_reserved_for_the_pod_is_refused(
    store: Store, api: LocalKubeApi, kubelet: KubeletEmulator, plugin: TestDraPlugin
) -> None:
    await plugin.start()
    pod = _allocated_pod(store, "sneaky", reserve=False)
    event = await wait_event(api, "sneaky", reason="FailedPrepareDynamicResources")
    claim = store.get("resourceclaims", "sneaky-claim", namespace="default")
    assert event["message"].endswith(
        f"pod sneaky ({pod['metadata']['uid']}) is not allowed to use ResourceClaim sneaky-claim ({claim['metadata']['uid']})"
    )
    assert plugin.prepared == []


async def test_prepared_claims_survive_a_kubelet_restart_and_the_plugin_registers_again(
    store: Store, api: LocalKubeApi, kubelet: KubeletEmulator, plugin: TestDraPlugin
) -> None:
    await plugin.start()
    await asyncio.wait_for(plugin.registered.wait(), 10)
    _allocated_pod(store, "p")
    await wait_for(api, "pods", "p", lambda p: p["status"].get("phase") == "Running")
    plugin.registered.clear()
    await kubelet.restart()
    await asyncio.wait_for(plugin.registered.wait(), 10)
    assert plugin.statuses == [(True, ""), (True, "")]
    store.delete("pods", "p", namespace="default")
    async with asyncio.timeout(10):
        while not plugin.unprepared:
            plugin.calls.clear()
            await plugin.calls.wait()


async def test_a_hidden_socket_is_ignored(
    kubelet: KubeletEmulator, plugin: TestDraPlugin, sock_dir: Path
) -> None:
    plugin.registry_socket = sock_dir / "reg" / ".hidden-reg.sock"
    await plugin.start()
    assert kubelet.dra is not None
    await kubelet.dra.registry.scan()
    assert plugin.statuses == [] and kubelet.dra.registry.drivers == []
