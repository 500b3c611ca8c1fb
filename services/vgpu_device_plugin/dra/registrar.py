"""The DRA kubelet plugin's registration: ``pluginregistration.Registration`` on
``<plugins_registry>/gpu.kube-vgpu.io-reg.sock``.

kubelet's plugin watcher (``pkg/kubelet/pluginmanager``) sees a socket appear in
``/var/lib/kubelet/plugins_registry`` (inotify; at its own start it walks the directory, which it
never empties, so a socket there from before a kubelet restart is found again), dials it, calls
``GetInfo`` (one second allowed), looks up the handler of the answer's ``type`` (``DRAPlugin``),
validates ``supported_versions`` (the first of ours that kubelet knows is the service it calls:
``v1.DRAPlugin`` on 1.34 and later) and then calls ``NotifyRegistrationStatus`` with
``plugin_registered`` and, on refusal, an ``error``. Names starting with ``.`` are ignored. When the
socket is deleted kubelet deregisters the plugin (and, 30 s later if no plugin of the driver came
back, deletes the node's ResourceSlices of the driver). So ``Registrar.run`` re-creates the socket
whenever it is gone: woken by inotify on the directory (``dirwatch.Waker``), or polling.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pathlib
import stat
from collections.abc import Sequence

import grpc
from vgpu.core.dra import names
from vgpu.kubeletapi.pluginregistration.v1 import api_pb2, api_pb2_grpc

from vgpu_device_plugin import dirwatch

log = logging.getLogger(__name__)

PLUGIN_TYPE = "DRAPlugin"  # k8s.io/kubelet/pkg/apis/pluginregistration/v1.DRAPlugin


class RegistrationService(api_pb2_grpc.RegistrationServicer):
    """What kubelet's plugin watcher asks; ``statuses`` records its verdicts (tests wait on them)."""

    def __init__(
        self,
        *,
        driver: str,
        endpoint: pathlib.Path,
        versions: Sequence[str] = names.KUBELET_SERVICES,
    ) -> None:
        self.info = api_pb2.PluginInfo(
            type=PLUGIN_TYPE, name=driver, endpoint=str(endpoint), supported_versions=list(versions)
        )
        self.statuses: list[api_pb2.RegistrationStatus] = []
        self.notified = asyncio.Event()  # set at each NotifyRegistrationStatus; the reader clears it

    @property
    def registered(self) -> bool:
        """Whether kubelet's last word was that it took the plugin."""
        return bool(self.statuses) and self.statuses[-1].plugin_registered

    async def GetInfo(self, request: api_pb2.InfoRequest, context: object) -> api_pb2.PluginInfo:
        log.info("kubelet asks who we are: %s %s at %s", self.info.type, self.info.name, self.info.endpoint)
        return self.info

    async def NotifyRegistrationStatus(
        self, request: api_pb2.RegistrationStatus, context: object
    ) -> api_pb2.RegistrationStatusResponse:
        self.statuses.append(request)
        self.notified.set()
        if request.plugin_registered:
            log.info("kubelet registered DRA driver %s (endpoint %s)", self.info.name, self.info.endpoint)
        else:
            log.error(
                "kubelet refused DRA driver %s (endpoint %s): %s",
                self.info.name,
                self.info.endpoint,
                request.error or "no reason given",
            )
        return api_pb2.RegistrationStatusResponse()


def _is_socket(path: pathlib.Path) -> bool:
    try:
        return stat.S_ISSOCK(os.lstat(path).st_mode)
    except OSError:
        return False


class Registrar:
    """Serves ``service`` on ``socket_path`` and keeps the socket there until cancelled."""

    def __init__(
        self,
        service: RegistrationService,
        socket_path: pathlib.Path,
        *,
        watcher: dirwatch.DirWatcher,
        node: str,
        poll_s: float = 1.0,
    ) -> None:
        self.service = service
        self.socket_path = socket_path
        self._server: grpc.aio.Server | None = None
        self._waker = dirwatch.Waker(watcher, socket_path.parent, node=node, poll_s=poll_s)
        self._node = node
        self.served = 0  # sockets created (the first, then one per re-creation)
        self._served_changed = asyncio.Condition()

    async def start(self) -> None:
        await self._stop_server()
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        server = grpc.aio.server()
        api_pb2_grpc.add_RegistrationServicer_to_server(self.service, server)  # type: ignore[no-untyped-call]
        try:
            server.add_insecure_port(f"unix://{self.socket_path}")
        except RuntimeError as exc:
            raise OSError(f"cannot serve the registration socket {self.socket_path}: {exc}") from None
        await server.start()
        self._server = server
        async with self._served_changed:
            self.served += 1
            self._served_changed.notify_all()
        log.info("node %s: DRA plugin registration socket %s up", self._node, self.socket_path)

    async def wait_served(self, count: int) -> None:
        """Until ``count`` sockets have been created (tests; a caller waiting for the first)."""
        async with self._served_changed:
            await self._served_changed.wait_for(lambda: self.served >= count)

    async def run(self) -> None:
        """Start, then re-create the socket whenever it is gone, until cancelled (then stop)."""
        try:
            while True:
                if not _is_socket(self.socket_path):
                    if self._server is not None:
                        log.warning(
                            "node %s: registration socket %s is gone; creating it again",
                            self._node,
                            self.socket_path,
                        )
                    try:
                        await self.start()
                    except OSError as exc:
                        log.error("node %s: %s; trying again", self._node, exc)
                await self._waker.sleep()
        finally:
            self._waker.close()
            await self.stop()

    async def _stop_server(self) -> None:
        if self._server is not None:
            server, self._server = self._server, None
            await server.stop(0)

    async def stop(self) -> None:
        await self._stop_server()
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
