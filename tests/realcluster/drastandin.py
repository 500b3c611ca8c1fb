"""A minimal DRA driver for the real-cluster tests: it proves the node's path from a ResourceClaim to
a container through CDI (kubelet's DRA manager → NodePrepareResources → CDI device id → containerd
resolves the spec → the container's env and mounts), independent of kube-vgpu's own kubelet plugin.

It registers with kubelet through ``<kubelet root>/plugins_registry`` and answers NodePrepare with
one fixed CDI device per claim, whose spec the caller writes (``cdi_spec``). It is test scaffolding,
not our plugin: no checkpoint, no inventory, no claim lookup."""

from __future__ import annotations

import dataclasses
import json
import pathlib
import threading
from concurrent import futures
from typing import Any

import grpc
from vgpu.kubeletapi.dra.v1 import api_pb2 as dra_pb2
from vgpu.kubeletapi.dra.v1 import api_pb2_grpc as dra_grpc
from vgpu.kubeletapi.pluginregistration.v1 import api_pb2 as reg_pb2
from vgpu.kubeletapi.pluginregistration.v1 import api_pb2_grpc as reg_grpc

DRIVER = "cdi-probe.kube-vgpu.io"
CDI_KIND = f"{DRIVER}/probe"
DEVICE = "dev-0"


def cdi_spec(*, env: dict[str, str], mounts: dict[pathlib.Path, str]) -> dict[str, Any]:
    """A CDI spec with one device, ``dev-0``, giving a container ``env`` and read-only bind ``mounts``
    (host path → container path)."""
    return {
        "cdiVersion": "0.6.0",
        "kind": CDI_KIND,
        "devices": [
            {
                "name": DEVICE,
                "containerEdits": {
                    "env": [f"{k}={v}" for k, v in env.items()],
                    "mounts": [
                        {"hostPath": str(h), "containerPath": c, "options": ["ro", "bind"]}
                        for h, c in mounts.items()
                    ],
                },
            }
        ],
    }


def objects(*, node: str, namespace: str, claim: str) -> list[dict[str, Any]]:
    """The cluster objects the probe needs: a DeviceClass, the node's ResourceSlice with one device
    and a ResourceClaim asking for it."""
    return [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": DRIVER},
            "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{DRIVER}'"}}]},
        },
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-{DRIVER}"},
            "spec": {
                "driver": DRIVER,
                "nodeName": node,
                "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                "devices": [{"name": DEVICE}],
            },
        },
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": claim, "namespace": namespace},
            "spec": {"devices": {"requests": [{"name": "probe", "exactly": {"deviceClassName": DRIVER}}]}},
        },
    ]


@dataclasses.dataclass
class Calls:
    """What kubelet asked of the probe driver."""

    registered: threading.Event = dataclasses.field(default_factory=threading.Event)
    prepared: list[str] = dataclasses.field(default_factory=list)
    unprepared: list[str] = dataclasses.field(default_factory=list)


class _Registration(reg_grpc.RegistrationServicer):
    def __init__(self, *, endpoint: pathlib.Path, calls: Calls) -> None:
        self._endpoint = endpoint
        self._calls = calls

    def GetInfo(self, request: reg_pb2.InfoRequest, context: grpc.ServicerContext) -> reg_pb2.PluginInfo:
        return reg_pb2.PluginInfo(
            type="DRAPlugin", name=DRIVER, endpoint=str(self._endpoint), supported_versions=["v1.DRAPlugin"]
        )

    def NotifyRegistrationStatus(
        self, request: reg_pb2.RegistrationStatus, context: grpc.ServicerContext
    ) -> reg_pb2.RegistrationStatusResponse:
        if request.plugin_registered:
            self._calls.registered.set()
        return reg_pb2.RegistrationStatusResponse()


class _Plugin(dra_grpc.DRAPluginServicer):
    def __init__(self, *, calls: Calls, pool: str) -> None:
        self._calls = calls
        self._pool = pool

    def NodePrepareResources(
        self, request: dra_pb2.NodePrepareResourcesRequest, context: grpc.ServicerContext
    ) -> dra_pb2.NodePrepareResourcesResponse:
        out = dra_pb2.NodePrepareResourcesResponse()
        for claim in request.claims:
            self._calls.prepared.append(claim.name)
            out.claims[claim.uid].devices.append(
                dra_pb2.Device(
                    request_names=["probe"],
                    pool_name=self._pool,
                    device_name=DEVICE,
                    cdi_device_ids=[f"{CDI_KIND}={DEVICE}"],
                )
            )
        return out

    def NodeUnprepareResources(
        self, request: dra_pb2.NodeUnprepareResourcesRequest, context: grpc.ServicerContext
    ) -> dra_pb2.NodeUnprepareResourcesResponse:
        out = dra_pb2.NodeUnprepareResourcesResponse()
        for claim in request.claims:
            self._calls.unprepared.append(claim.name)
            out.claims[claim.uid].error = ""
        return out


class Driver:
    """The probe driver serving on kubelet's sockets under ``kubelet_root`` until ``stop``."""

    def __init__(self, *, kubelet_root: pathlib.Path, node: str) -> None:
        self.calls = Calls()
        plugin_dir = kubelet_root / "plugins" / DRIVER
        plugin_dir.mkdir(parents=True, exist_ok=True)
        self._endpoint = plugin_dir / "dra.sock"
        self._registration = kubelet_root / "plugins_registry" / f"{DRIVER}-reg.sock"
        for sock in (self._endpoint, self._registration):
            sock.unlink(missing_ok=True)
        self._plugin = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        dra_grpc.add_DRAPluginServicer_to_server(_Plugin(calls=self.calls, pool=node), self._plugin)  # type: ignore[no-untyped-call]
        self._plugin.add_insecure_port(f"unix://{self._endpoint}")
        self._reg = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        reg_grpc.add_RegistrationServicer_to_server(  # type: ignore[no-untyped-call]
            _Registration(endpoint=self._endpoint, calls=self.calls), self._reg
        )
        self._reg.add_insecure_port(f"unix://{self._registration}")

    def start(self) -> None:
        self._plugin.start()
        self._reg.start()  # last: kubelet dials the endpoint as soon as it sees this socket

    def stop(self) -> None:
        self._reg.stop(grace=None).wait(5)
        self._plugin.stop(grace=None).wait(5)
        for sock in (self._endpoint, self._registration):
            sock.unlink(missing_ok=True)


def write_spec(spec: dict[str, Any], *, cdi_dir: pathlib.Path) -> pathlib.Path:
    path = cdi_dir / f"{DRIVER}.json"
    path.write_text(json.dumps(spec))
    return path
