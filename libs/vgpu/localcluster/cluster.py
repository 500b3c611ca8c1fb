"""``LocalCluster``: an API server, a kube-scheduler and one kubelet per node, in this process.

``async with LocalCluster(description) as cluster:`` starts a ``Store`` with its HTTP door
(``ApiServer`` on 127.0.0.1, a free port; ``cluster.url``, ``cluster.kubeconfig_path``) and its
direct door (``cluster.api``, a ``LocalKubeApi``), creates one Ready ``Node`` per described node
(labels, cpu/memory/pods allocatable), runs ``SchedulerEmulator`` for ``scheduler_name`` with the
given KubeSchedulerConfiguration (with DRA allocation: ``dynamicresources``), kube-controller-manager's
resourceclaim controller (``claimcontroller``), and one ``KubeletEmulator`` per node serving ``kubelet.sock`` in
``cluster.node_dirs[node]`` (a short directory under /tmp). ``token`` and ``users`` (bearer
tokens mapped to identities) are the API server's authentication (``ApiServer``). GPUs are not
served here: whoever composes the full stack starts a device plugin per node with
``description.node(n).fake_gpus`` and ``node_dirs[n]`` as its device-plugin directory. Leaving the block stops everything in
reverse order and removes the directories: no task, socket or port outlives it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import platform
import shutil
import tempfile
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vgpu.localcluster import description as descriptions
from vgpu.localcluster.apiserver import ApiServer
from vgpu.localcluster.claimcontroller import ResourceClaimController
from vgpu.localcluster.client import LocalKubeApi
from vgpu.localcluster.kubelet import KubeletEmulator
from vgpu.localcluster.scheduler import SchedulerEmulator
from vgpu.localcluster.statuswriter import StoreStatusWriter
from vgpu.localcluster.store import Store

log = logging.getLogger(__name__)


def node_object(spec: descriptions.NodeSpec) -> dict[str, Any]:
    """The Node a real kubelet would register for ``spec`` (GPU resources come from the plugin)."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": spec.name,
            "labels": {"kubernetes.io/hostname": spec.name, "kubernetes.io/os": "linux", **spec.labels},
        },
        "spec": {},
        "status": {
            "capacity": dict(spec.allocatable),
            "allocatable": dict(spec.allocatable),
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "kubelet is posting ready status",
                }
            ],
            "addresses": [
                {"type": "InternalIP", "address": "127.0.0.1"},
                {"type": "Hostname", "address": spec.name},
            ],
            "nodeInfo": {  # every field: the official client (pydantic models) requires them all
                "architecture": "amd64",
                "bootID": str(uuid.uuid5(uuid.NAMESPACE_URL, f"boot/{spec.name}")),
                "containerRuntimeVersion": "localcluster://0",
                "kernelVersion": platform.release(),
                "kubeProxyVersion": "",
                "kubeletVersion": "v1.30.0-localcluster",
                "machineID": uuid.uuid5(uuid.NAMESPACE_URL, f"machine/{spec.name}").hex,
                "operatingSystem": "linux",
                "osImage": "kube-vgpu local cluster",
                "systemUUID": str(uuid.uuid5(uuid.NAMESPACE_URL, f"system/{spec.name}")),
            },
        },
    }


class LocalCluster:
    """See the module docstring. Attributes are valid inside the ``async with`` block."""

    def __init__(
        self,
        description: descriptions.ClusterDescription | Mapping[str, Any] | str | Path,
        *,
        scheduler_config: Mapping[str, Any] | None = None,
        scheduler_name: str = "vgpu-scheduler",
        admission_delay_s: float = 0.0,
        token: str | None = None,
        users: Mapping[str, Any] | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        tls_ca: str | None = None,
        scheduler_initial_backoff_s: float = 1.0,
        scheduler_max_backoff_s: float = 10.0,
        termination_s: float = 0.0,
        scheduler_version: str = "1.36",
        dra: bool = False,
    ) -> None:
        """``termination_s``: how long a gracefully deleted pod takes to stop on its kubelet;
        ``scheduler_version``: the kube-scheduler whose preemption is emulated (1.N or pr135486);
        ``dra``: each kubelet also takes DRA plugins (``registry_dirs[node]`` is its
        plugins_registry, ``dra_plugin_dirs[node]`` a directory for the plugin's socket) and its
        runtime resolves CDI devices from ``<host root>/etc/cdi`` and ``<host root>/var/run/cdi``."""
        self.description = (
            description
            if isinstance(description, descriptions.ClusterDescription)
            else descriptions.load(description)
        )
        self.scheduler_config = scheduler_config
        self.scheduler_name = scheduler_name
        self._admission_delay_s = admission_delay_s
        self._termination_s = termination_s
        self.dra = dra
        self.registry_dirs: dict[str, Path] = {}
        self.dra_plugin_dirs: dict[str, Path] = {}
        self._backoff = (scheduler_initial_backoff_s, scheduler_max_backoff_s)
        self.scheduler_version = scheduler_version
        self.store = Store()
        self.api = LocalKubeApi(self.store)
        self.status_writer = StoreStatusWriter(self.store)
        self.server = ApiServer(
            self.store,
            host="127.0.0.1",
            port=0,
            token=token,
            users=users,
            tls_cert=tls_cert,
            tls_key=tls_key,
            tls_ca=tls_ca,
        )
        self.workdir = Path()
        self.kubeconfig_path = Path()
        self.node_dirs: dict[str, Path] = {}
        self.host_roots: dict[str, Path] = {}  # each node's stand-in "/" (kubeletruntime)
        self.kubelets: dict[str, KubeletEmulator] = {}
        self.scheduler: SchedulerEmulator | None = None
        self._scheduler_task: asyncio.Task[None] | None = None
        self.claim_controller = ResourceClaimController(self.api, status_writer=self.status_writer)
        self._controller_task: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        return self.server.url

    async def __aenter__(self) -> LocalCluster:
        try:
            await self._start()
        except BaseException:
            await self._stop()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stop()

    async def _start(self) -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix="vgpu-lc-", dir="/tmp"))
        await self.server.start()
        self.kubeconfig_path = self.server.write_kubeconfig(self.workdir / "kubeconfig")
        self._controller_task = asyncio.create_task(self.claim_controller.run(), name="localcluster-claims")
        for index, spec in enumerate(self.description.nodes):
            body = node_object(spec)
            await self.api.create("nodes", body)
            await self.status_writer.merge_patch_status("nodes", spec.name, {"status": body["status"]})
            node_dir = self.workdir / f"n{index}"  # short: unix socket paths must stay < 108 bytes
            host_root = self.workdir / "host" / spec.name  # the node's stand-in "/"
            host_root.mkdir(parents=True)
            dra_options: dict[str, Any] = {}
            if self.dra:
                self.registry_dirs[spec.name] = self.workdir / f"r{index}"
                self.dra_plugin_dirs[spec.name] = self.workdir / f"p{index}"
                dra_options = {
                    "plugins_registry_dir": self.registry_dirs[spec.name],
                    "cdi_spec_dirs": [host_root / "etc" / "cdi", host_root / "var" / "run" / "cdi"],
                }
            kubelet = KubeletEmulator(
                self.api,
                node=spec.name,
                socket_dir=node_dir,
                admission_delay_s=self._admission_delay_s,
                status_writer=self.status_writer,
                termination_s=self._termination_s,
                host_root=host_root,
                **dra_options,
            )
            self.node_dirs[spec.name] = node_dir
            self.host_roots[spec.name] = host_root
            self.kubelets[spec.name] = kubelet
            await kubelet.start()
        await self.start_scheduler(self.scheduler_config)
        log.info(
            "local cluster up at %s: nodes %s, scheduler %r, dirs under %s",
            self.url,
            [n.name for n in self.description.nodes],
            self.scheduler_name,
            self.workdir,
        )

    async def start_scheduler(self, scheduler_config: Mapping[str, Any] | None) -> SchedulerEmulator:
        """(Re)start the scheduler emulation with ``scheduler_config`` (e.g. once the extender's URL is
        known). Pending pods are picked up again by the new one."""
        await self.stop_scheduler()
        self.scheduler_config = scheduler_config
        self.scheduler = SchedulerEmulator(
            self.api,
            scheduler_config=scheduler_config,
            scheduler_name=self.scheduler_name,
            status_writer=self.status_writer,
            initial_backoff_s=self._backoff[0],
            max_backoff_s=self._backoff[1],
            version=self.scheduler_version,
        )
        self._scheduler_task = asyncio.create_task(self.scheduler.run(), name="localcluster-scheduler")
        return self.scheduler

    async def stop_scheduler(self) -> None:
        if self.scheduler is not None:
            await self.scheduler.stop()
        if self._scheduler_task is not None:
            self._scheduler_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._scheduler_task
        self.scheduler = None
        self._scheduler_task = None

    async def _stop(self) -> None:
        await self.stop_scheduler()
        if self._controller_task is not None:
            self._controller_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._controller_task
        for kubelet in reversed(list(self.kubelets.values())):
            await kubelet.stop()
        await self.server.stop()
        self.store.close_watchers()
        if self.workdir != Path():
            shutil.rmtree(self.workdir, ignore_errors=True)
