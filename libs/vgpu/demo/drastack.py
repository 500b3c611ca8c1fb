"""The demo stack's DRA mode: what the chart installs for it and how its nodes come up.

In DRA mode (``Stack(mode="dra")``) the local cluster's kubelets take DRA plugins and resolve CDI
devices, the chart's DeviceClass ``gpu.kube-vgpu.io`` is created, each node's
``vgpu-device-plugin`` runs as the DRA driver (``--mode dra``: it publishes the node's
ResourceSlice and registers its kubelet plugin in the kubelet's plugins_registry), and the emulated
kube-scheduler has the ``default-scheduler`` profile, which schedules the pods the webhook turned
into claim users. A node is ready when its ResourceSlice is published and its kubelet has the
driver registered."""

from __future__ import annotations

from typing import Any

from vgpu.core.dra import names
from vgpu.kube.port import JsonObj
from vgpu.localcluster.cluster import LocalCluster

MODES = ("extender", "dra")
DEFAULT_SCHEDULER = "default-scheduler"


def device_class() -> JsonObj:
    """The chart's DeviceClass: every device of our driver."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": names.DEVICE_CLASS},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{names.DRIVER}"'}}]},
    }


def plugin_args(cluster: LocalCluster, node: str) -> list[str]:
    """The device plugin's flags that make it the node's DRA driver."""
    return [
        "--mode", "dra",
        "--plugins-registry", str(cluster.registry_dirs[node]),
        "--dra-plugin-path", str(cluster.dra_plugin_dirs[node]),
    ]  # fmt: skip


def nodes_ready(cluster: LocalCluster) -> bool:
    """Every GPU node has our ResourceSlice and its kubelet has our DRA plugin registered."""
    published = {
        (s.get("spec") or {}).get("nodeName")
        for s in cluster.store.list("resourceslices").items
        if (s.get("spec") or {}).get("driver") == names.DRIVER
    }
    for spec in cluster.description.nodes:
        if not spec.gpus:
            continue
        kubelet = cluster.kubelets[spec.name]
        if (
            spec.name not in published
            or kubelet.dra is None
            or names.DRIVER not in kubelet.dra.registry.drivers
        ):
            return False
    return True


def with_mode_annotation(manifest: dict[str, Any]) -> dict[str, Any]:
    """``manifest`` asking the webhook for DRA mode (``kube-vgpu.io/mode: dra``) unless it says otherwise."""
    meta = manifest.setdefault("metadata", {})
    annotations = meta.get("annotations") or {}
    annotations.setdefault(names.MODE_ANNOTATION, names.MODE_DRA)
    meta["annotations"] = annotations
    return manifest
