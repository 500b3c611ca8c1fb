"""Scenario builders for device-plugin tests: a local store with a node, pending pods, fake GPUs."""

import dataclasses
import pathlib
from collections.abc import Iterable
from typing import Any

from vgpu.core import annotations
from vgpu.core.config import DevicePluginConfig
from vgpu.gpu import fake
from vgpu.kube.port import JsonObj
from vgpu.localcluster.client import LocalKubeApi
from vgpu.localcluster.store import Store

KEYS = annotations.Keys()
NODE = "gpu-node-1"
GPU_A = "GPU-aaaaaaaa-0000-0000-0000-000000000001"
GPU_B = "GPU-bbbbbbbb-0000-0000-0000-000000000002"


def fake_backend(*, numa_b: int = 1) -> fake.FakeGpuBackend:
    return fake.FakeGpuBackend.from_yaml(
        {
            "gpus": [
                {"uuid": GPU_A, "name": "NVIDIA A100-SXM4-40GB", "memoryMib": 40960, "numa": 0},
                {
                    "uuid": GPU_B,
                    "name": "Tesla V100-PCIE-32GB",
                    "memoryMib": 32768,
                    "numa": numa_b,
                    "minor": 1,
                },
            ]
        }
    )


def config(**changes: Any) -> DevicePluginConfig:
    return dataclasses.replace(DevicePluginConfig(), **changes)


def cluster(node: str = NODE) -> tuple[Store, LocalKubeApi]:
    store = Store()
    store.create("nodes", {"metadata": {"name": node}})
    return store, LocalKubeApi(store)


def add_pod(
    store: Store,
    name: str,
    *,
    to_allocate: str | None,
    node: str = NODE,
    bind_time: int = 100,
    phase: str = "allocating",
    containers: Iterable[str] = ("main",),
    init: Iterable[str] = (),
    sidecars: Iterable[str] = (),
    env: dict[str, str] | None = None,
    namespace: str = "default",
    resources: dict[str, dict[str, Any]] | None = None,
) -> JsonObj:
    """A pod bound to ``node`` with the scheduler's decision; ``resources`` by container name (a
    pod's resources are set at its creation: a real API server refuses to change them); the init
    containers named in ``sidecars`` are restartable (``restartPolicy: Always``)."""
    notes = {
        KEYS.assigned_node: node,
        KEYS.bind_phase: phase,
        KEYS.bind_time: str(bind_time),
    }
    if to_allocate is not None:
        notes[KEYS.devices_to_allocate] = to_allocate
        notes[KEYS.devices_allocated] = to_allocate
    envs = [{"name": k, "value": v} for k, v in (env or {}).items()]
    return store.create(
        "pods",
        {
            "metadata": {"name": name, "annotations": notes},
            "spec": {
                "nodeName": node,
                "initContainers": [
                    {"name": c, "image": "x", **({"restartPolicy": "Always"} if c in sidecars else {})}
                    for c in init
                ],
                "containers": [
                    {
                        "name": c,
                        "image": "x",
                        "env": envs,
                        **({"resources": resources[c]} if c in (resources or {}) else {}),
                    }
                    for c in containers
                ],
            },
        },
        namespace=namespace,
    )


def lock_node(store: Store, pod: str, *, namespace: str = "default", node: str = NODE) -> None:
    value = f"2026-11-23T01:00:00Z,{namespace},{pod}"
    store.patch("nodes", node, {"metadata": {"annotations": {KEYS.node_lock: value}}})


def notes_of(store: Store, kind: str, name: str, namespace: str | None = None) -> dict[str, str]:
    return dict(store.get(kind, name, namespace=namespace)["metadata"].get("annotations") or {})


class StoreView:
    """ClusterView read straight from the store (always current), for direct-call tests."""

    def __init__(self, store: Store, node: str = NODE) -> None:
        self.store = store
        self.node_name = node

    def pods(self) -> list[JsonObj]:
        return self.store.list("pods", field_selector=f"spec.nodeName={self.node_name}").items

    def pod(self, namespace: str, name: str) -> JsonObj | None:
        return next(
            (
                p
                for p in self.pods()
                if (p["metadata"]["namespace"], p["metadata"]["name"]) == (namespace, name)
            ),
            None,
        )

    def node(self) -> JsonObj | None:
        return self.store.get("nodes", self.node_name)


def short_tmp() -> pathlib.Path:
    """A short directory for unix sockets (paths must stay under ~100 characters)."""
    import tempfile

    return pathlib.Path(tempfile.mkdtemp(dir="/tmp", prefix="vdp-"))


def node_reporter(api: Any, **changes: Any) -> Any:
    """The plugin's NodeReporter for NODE with the tests' defaults (lease in kube-system, 40 s)."""
    from vgpu_device_plugin import reporter

    settings: dict[str, Any] = {
        "node": NODE,
        "keys": KEYS,
        "lease_namespace": "kube-system",
        "lease_duration_s": 40,
        "register_interval_s": 300,
        **changes,
    }
    return reporter.NodeReporter(api, **settings)


def installed_host(root: pathlib.Path, *, hook_path: str = "/usr/local") -> Any:
    """A HostFs on ``root`` with HAMi-core's files put there by the chart's installer (stand-in
    source), as the demo and a node get them. Without them Allocate refuses."""
    from vgpu.demo import hamicore
    from vgpu_device_plugin.hostfs import HostFs

    hamicore.install_stand_in(root, hook_path=hook_path)
    return HostFs(root, hook_path=hook_path)
