"""The emulated kubelet's Dynamic Resource Allocation: the plugin manager's DRA handler
(``pkg/kubelet/pluginmanager``, ``pkg/kubelet/cm/dra/plugin``) and the DRA manager
(``pkg/kubelet/cm/dra/manager.go``).

**Registration** (``PluginRegistry``): a socket appearing in the ``plugins_registry`` directory is
dialled and asked ``GetInfo``; a plugin of type ``DRAPlugin`` whose ``supported_versions`` list
``v1.DRAPlugin`` or ``v1beta1.DRAPlugin`` (the first one kubelet knows wins) is registered under its
``name`` (the driver) with its ``endpoint`` socket, and told ``NotifyRegistrationStatus(true)``;
anything else is told ``false`` with kubelet's error (``RegisterPlugin error -- ...``). A socket that
goes away deregisters its driver; a name starting with ``.`` is ignored. Kubelet notices sockets with fsnotify; this one looks every
``poll_s``.

**Prepare** (``DraManager.prepare``, before a pod's containers start): every claim of the pod is read
from the API server and must be reserved for the pod (``pod <name> (<uid>) is not allowed to use
ResourceClaim <claim> (<uid>)``); the drivers of its allocation results must be registered (``DRA
driver <name> is not registered``); claims not yet prepared go to their driver's
``NodePrepareResources`` (v1, or v1beta1 with the same messages), in one call per driver. A claim's
error, an unknown or missing claim in the answer, or a gRPC error fails the preparation with
kubelet's wording, wrapped in ``prepare dynamic resources: ``. The answer's CDI device ids are what
each container that references the claim (``resources.claims``, optionally one ``request``) gets.

**Health** (``kubeletdrahealth``): each registered plugin's ``NodeWatchResources`` stream runs in
a task of the registry's ``health`` (cancelled when the plugin goes).

**Unprepare** (``DraManager.unprepare``, when the pod is gone): a claim no running pod references
any more goes to ``NodeUnprepareResources``; on failure it stays prepared and is retried on the
next call. The prepared claims are this kubelet's memory (its checkpoint): they survive ``restart``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import grpc

from vgpu.core import errors
from vgpu.core.dra import names
from vgpu.kube.port import JsonObj, KubeApi
from vgpu.kubeletapi.dra.v1 import api_pb2 as v1_pb2
from vgpu.kubeletapi.dra.v1 import api_pb2_grpc as v1_grpc
from vgpu.kubeletapi.dra.v1beta1 import api_pb2 as v1beta1_pb2
from vgpu.kubeletapi.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc
from vgpu.kubeletapi.pluginregistration.v1 import api_pb2 as reg_pb2
from vgpu.kubeletapi.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from vgpu.localcluster import kubeletdrahealth as health
from vgpu.localcluster.kubeletdrahealth import PreparedDevice

log = logging.getLogger(__name__)

PLUGIN_TYPE = "DRAPlugin"
SERVICES = names.KUBELET_SERVICES  # kubelet's servicesSupportedByKubelet, newest first
CALL_TIMEOUT_S = 45.0


class DraError(errors.VgpuError):
    """A preparation or unpreparation failure; the message is kubelet's."""


def _rpc_error(err: grpc.aio.AioRpcError) -> str:
    return f"rpc error: code = {err.code().name.title().replace('_', '')} desc = {err.details()}"


@dataclasses.dataclass
class Plugin:
    driver: str
    endpoint: str
    service: str  # the chosen one, e.g. "v1.DRAPlugin"
    channel: grpc.aio.Channel
    registration_socket: Path

    async def call(self, method: str, claims: list[JsonObj]) -> Any:
        """``NodePrepareResources``/``NodeUnprepareResources`` for ``claims`` on the chosen service."""
        pb2, grpc_mod = (v1_pb2, v1_grpc) if self.service == SERVICES[0] else (v1beta1_pb2, v1beta1_grpc)
        stub = grpc_mod.DRAPluginStub(self.channel)
        request_type = getattr(pb2, f"{method}Request")
        request = request_type(
            claims=[pb2.Claim(namespace=c["namespace"], uid=c["uid"], name=c["name"]) for c in claims]
        )
        return await getattr(stub, method)(request, timeout=CALL_TIMEOUT_S)


class PluginRegistry:
    """The DRA plugins registered through ``registry_dir``; ``run()`` watches it until cancelled."""

    def __init__(
        self,
        registry_dir: Path,
        *,
        poll_s: float = 0.05,
        dial_timeout_s: float = 10.0,
        health_retry_s: float = health.RETRY_S,
    ) -> None:
        """``health_retry_s``: how soon a health stream that ended is opened again."""
        self.registry_dir = Path(registry_dir)
        self.health = health.HealthWatch(retry_s=health_retry_s)
        self._poll_s = poll_s
        self._dial_timeout_s = dial_timeout_s
        self._plugins: dict[str, Plugin] = {}
        self._seen: set[Path] = set()
        self.changed = asyncio.Event()  # set on every (de)registration (tests wait on it)

    def get(self, driver: str) -> Plugin:
        if not driver:
            raise DraError("DRA driver name is empty")
        plugin = self._plugins.get(driver)
        if plugin is None:
            raise DraError(f"DRA driver {driver} is not registered")
        return plugin

    @property
    def drivers(self) -> list[str]:
        return sorted(self._plugins)

    async def run(self) -> None:
        self.registry_dir.mkdir(parents=True, exist_ok=True)
        try:
            while True:
                await self.scan()
                await asyncio.sleep(self._poll_s)  # kubelet's fsnotify, emulated by looking
        finally:
            await self.close()

    async def scan(self) -> None:
        """Register new sockets, deregister vanished ones."""
        present = (  # the plugin watcher ignores names starting with "."
            {p for p in self.registry_dir.iterdir() if p.is_socket() and not p.name.startswith(".")}
            if self.registry_dir.exists()
            else set()
        )
        for gone in self._seen - present:
            self._seen.discard(gone)
            for driver, plugin in list(self._plugins.items()):
                if plugin.registration_socket == gone:
                    del self._plugins[driver]
                    await self._drop(plugin)
                    log.info("DRA plugin %s deregistered (%s removed)", driver, gone)
                    self.changed.set()
        for new in sorted(present - self._seen):
            self._seen.add(new)
            await self._register(new)

    async def forget(self) -> None:
        """A kubelet restart: every plugin registers again from the sockets present."""
        await self.close()
        self._seen.clear()

    async def close(self) -> None:
        for plugin in self._plugins.values():
            await self._drop(plugin)
        self._plugins.clear()

    async def _drop(self, plugin: Plugin) -> None:
        """Stop the plugin's health stream (its devices read Unknown) and close its connection."""
        await self.health.stop(plugin.driver)
        await plugin.channel.close(None)

    async def _register(self, socket: Path) -> None:
        channel = grpc.aio.insecure_channel(f"unix://{socket}")
        try:
            client = reg_grpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]
            try:
                await asyncio.wait_for(channel.channel_ready(), self._dial_timeout_s)
                info = await client.GetInfo(reg_pb2.InfoRequest(), timeout=self._dial_timeout_s)
            except (TimeoutError, grpc.aio.AioRpcError) as err:
                log.info(
                    "RegisterPlugin error -- failed to get plugin info using RPC GetInfo at socket %s, err: %s",
                    socket,
                    err,
                )
                return
            error = self._validate(info)
            if error is None:
                service = next(s for s in info.supported_versions if s in SERVICES)
                endpoint = grpc.aio.insecure_channel(f"unix://{info.endpoint}")
                old = self._plugins.get(info.name)
                if old is not None and old.endpoint == info.endpoint and old.registration_socket != socket:
                    error = f"RegisterPlugin error -- plugin registration failed with err: endpoint {info.endpoint} already registered for DRA driver plugin {info.name}"
                    await endpoint.close(None)
                else:
                    if old is not None:
                        await self._drop(old)
                    self._plugins[info.name] = Plugin(info.name, info.endpoint, service, endpoint, socket)
                    self.health.start(info.name, endpoint)
            try:
                await client.NotifyRegistrationStatus(
                    reg_pb2.RegistrationStatus(plugin_registered=error is None, error=error or ""),
                    timeout=self._dial_timeout_s,
                )
            except grpc.aio.AioRpcError as err:
                log.info(
                    "RegisterPlugin error -- failed to send registration status at socket %s, err: %s",
                    socket,
                    err,
                )
            if error is None:
                log.info(
                    "DRA plugin %s registered at %s (%s)",
                    info.name,
                    info.endpoint,
                    self._plugins[info.name].service,
                )
            else:
                log.info("%s", error)
            self.changed.set()
        finally:
            await channel.close(None)

    @staticmethod
    def _validate(info: reg_pb2.PluginInfo) -> str | None:
        if info.type != PLUGIN_TYPE:
            return f"RegisterPlugin error -- no handler registered for plugin type: {info.type}"
        if not info.supported_versions:
            return (
                "RegisterPlugin error -- plugin validation failed with err: invalid supported gRPC versions of DRA "
                f"driver plugin {info.name} at endpoint {info.endpoint}: empty list of supported gRPC services (aka supported versions)"
            )
        if not any(s in SERVICES for s in info.supported_versions):
            return (
                "RegisterPlugin error -- plugin validation failed with err: invalid supported gRPC versions of DRA "
                f"driver plugin {info.name} at endpoint {info.endpoint}: none of services supported by the plugin "
                f"({list(info.supported_versions)}) are supported by the kubelet ({list(SERVICES)})"
            )
        return None


@dataclasses.dataclass
class ClaimInfo:
    """One prepared claim: its identity, drivers, the devices each driver answered, its pods."""

    namespace: str
    name: str
    uid: str
    drivers: list[str]
    devices: list[PreparedDevice] = dataclasses.field(default_factory=list)
    pods: set[str] = dataclasses.field(default_factory=set)
    prepared: bool = False

    def cdi_ids(self, request: str) -> list[str]:
        """``cdiDevicesAsList``: the ids for ``request`` ("" for all)."""
        return [
            i
            for d in self.devices
            if not request or not d.requests or request in d.requests
            for i in d.cdi_ids
        ]

    def wire(self) -> JsonObj:
        return {"namespace": self.namespace, "uid": self.uid, "name": self.name}


def claim_name(pod: Mapping[str, Any], entry: Mapping[str, Any]) -> tuple[str | None, bool]:
    """``resourceclaim.Name``: the claim of pod claim ``entry`` and whether ownership must be checked."""
    if entry.get("resourceClaimName"):
        return str(entry["resourceClaimName"]), False
    if entry.get("resourceClaimTemplateName"):
        for status in (pod.get("status") or {}).get("resourceClaimStatuses") or ():
            if status.get("name") == entry.get("name"):
                return status.get("resourceClaimName"), True
        meta = pod.get("metadata") or {}
        raise DraError(f'pod "{meta.get("namespace")}/{meta.get("name")}": ResourceClaim not created yet')
    raise DraError(f"pod claim {entry.get('name')}: none of the supported fields are set")


def claim_name_or_none(pod: Mapping[str, Any], entry: Mapping[str, Any]) -> str | None:
    """:func:`claim_name`'s claim, None when there is none (yet)."""
    try:
        return claim_name(pod, entry)[0]
    except DraError:
        return None


class DraManager:
    """kubelet's DRA manager for one node; see the module docstring."""

    def __init__(self, api: KubeApi, registry: PluginRegistry) -> None:
        self._api = api
        self.registry = registry
        self.claims: dict[tuple[str, str], ClaimInfo] = {}  # (namespace, name) -> prepared claim

    @staticmethod
    def uses_claims(pod: Mapping[str, Any]) -> bool:
        return bool((pod.get("spec") or {}).get("resourceClaims"))

    async def prepare(self, pod: Mapping[str, Any]) -> dict[str, list[str]]:
        """Prepare ``pod``'s claims; each container's CDI device ids. ``DraError`` on failure."""
        try:
            return await self._prepare(pod)
        except DraError as err:
            raise DraError(f"prepare dynamic resources: {err}") from None

    async def _prepare(self, pod: Mapping[str, Any]) -> dict[str, list[str]]:
        meta = pod.get("metadata") or {}
        ns, uid = meta.get("namespace") or "default", str(meta.get("uid"))
        infos: dict[str, ClaimInfo] = {}
        for entry in (pod.get("spec") or {}).get("resourceClaims") or ():
            name, check_owner = claim_name(pod, entry)
            if name is None:
                continue
            try:
                claim = await self._api.get("resourceclaims", name, namespace=ns)
            except errors.KubeError as err:
                raise DraError(f"fetch ResourceClaim {name}: {err}") from None
            cmeta = claim.get("metadata") or {}
            if check_owner and not any(
                r.get("uid") == uid and r.get("controller") for r in cmeta.get("ownerReferences") or ()
            ):
                raise DraError(
                    f"ResourceClaim {ns}/{name} was not created for Pod {ns}/{meta.get('name')} (Pod is not owner)"
                )
            status = claim.get("status") or {}
            if not any(r.get("uid") == uid for r in status.get("reservedFor") or ()):
                raise DraError(
                    f"pod {meta.get('name')} ({uid}) is not allowed to use ResourceClaim {name} ({cmeta.get('uid')})"
                )
            results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or []
            drivers = sorted({str(r.get("driver")) for r in results})
            for driver in drivers:
                self.registry.get(driver)
            info = self.claims.get((ns, name))
            if info is not None and info.uid != cmeta.get("uid"):
                raise DraError(
                    f"old ResourceClaim with same name {name} and different UID {info.uid} still exists (previous pod force-deleted?!)"
                )
            if info is None:
                info = ClaimInfo(ns, name, str(cmeta.get("uid")), drivers)
                self.claims[(ns, name)] = info
            info.pods.add(uid)
            infos[str(entry.get("name"))] = info
        batches: dict[str, list[ClaimInfo]] = {}
        for info in infos.values():
            if not info.prepared:
                for driver in info.drivers:
                    batches.setdefault(driver, []).append(info)
        for driver, batch in batches.items():
            await self._prepare_batch(self.registry.get(driver), batch)
        return self._container_ids(pod, infos)

    async def _prepare_batch(self, plugin: Plugin, batch: list[ClaimInfo]) -> None:
        try:
            response = await plugin.call("NodePrepareResources", [i.wire() for i in batch])
        except grpc.aio.AioRpcError as err:
            raise DraError(f"NodePrepareResources: {_rpc_error(err)}") from None
        by_uid = {i.uid: i for i in batch}
        for claim_uid, result in response.claims.items():
            info = by_uid.get(claim_uid)
            if info is None:
                raise DraError(f"NodePrepareResources returned result for unknown claim UID {claim_uid}")
            if result.error:
                raise DraError(f"NodePrepareResources failed for ResourceClaim {info.name}: {result.error}")
            info.devices += [
                PreparedDevice(
                    plugin.driver,
                    tuple(d.request_names),
                    d.pool_name,
                    d.device_name,
                    tuple(d.cdi_device_ids),
                )
                for d in result.devices
            ]
        unfinished = [i for i in batch if i.uid not in response.claims]
        if unfinished:
            raise DraError(f"NodePrepareResources skipped {len(unfinished)} ResourceClaims")
        for info in batch:
            info.prepared = True

    @staticmethod
    def _container_ids(pod: Mapping[str, Any], infos: Mapping[str, ClaimInfo]) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for group in ("initContainers", "containers"):
            for container in (pod.get("spec") or {}).get(group) or ():
                ids: list[str] = []
                for ref in (container.get("resources") or {}).get("claims") or ():
                    info = infos.get(str(ref.get("name")))
                    if info is not None:
                        ids += info.cdi_ids(str(ref.get("request") or ""))
                if ids:
                    out[str(container.get("name"))] = ids
        return out

    async def unprepare(self, pod_uid: str) -> None:
        """Release ``pod_uid``'s references; unprepare the claims no pod references any more."""
        batches: dict[str, list[ClaimInfo]] = {}
        for info in list(self.claims.values()):
            info.pods.discard(pod_uid)
            if info.pods:
                continue
            if not info.prepared:
                del self.claims[(info.namespace, info.name)]
                continue
            for driver in info.drivers:
                batches.setdefault(driver, []).append(info)
        failures = []
        for driver, batch in batches.items():
            try:
                plugin = self.registry.get(driver)
                response = await plugin.call("NodeUnprepareResources", [i.wire() for i in batch])
            except (DraError, grpc.aio.AioRpcError) as err:
                failures.append(
                    f"NodeUnprepareResources: {_rpc_error(err) if isinstance(err, grpc.aio.AioRpcError) else err}"
                )
                continue
            for info in batch:
                result = response.claims.get(info.uid)
                if result is None or result.error:
                    failures.append(
                        f"NodeUnprepareResources failed for ResourceClaim {info.name}: {result.error if result else 'skipped'}"
                    )
                    continue
                with contextlib.suppress(KeyError):
                    del self.claims[(info.namespace, info.name)]
        if failures:
            raise DraError("unprepare dynamic resources: " + "; ".join(failures))
