"""The node's liveness Lease, renewed only while kubelet has the plugin.

kubelet has the plugin when the count resource (``nvidia.com/gpu``) is registered (at a session's
start, or again after a kubelet restart) and its ListAndWatch stream is open. The scheduler reads
an expired Lease as "no plugin here" and binds no GPU pod to the node, so across failed
registrations, or while kubelet has not opened the stream, the Lease is left to expire (the reason
logged once per change); renewal resumes as soon as both hold again, without waiting for the next
period. Every period also checks the node lock (``lockreaper.release_orphaned_lock``).
"""

import asyncio
import logging
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from vgpu.core import annotations, errors
from vgpu.kube.port import KubeApi

from vgpu_device_plugin import lockreaper
from vgpu_device_plugin.podcache import ClusterView
from vgpu_device_plugin.reporter import NodeReporter
from vgpu_device_plugin.server import DevicePluginService

log = logging.getLogger(__name__)


async def _first_of(waits: Sequence[Coroutine[Any, Any, object]], *, timeout_s: float) -> None:
    """Until one of ``waits`` finishes or ``timeout_s`` passes; the rest are cancelled."""
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(tasks, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class LeaseKeeper:
    def __init__(
        self,
        *,
        reporter: NodeReporter,
        api: KubeApi,
        view: ClusterView,
        node: str,
        keys: annotations.Keys,
        renew_s: float,
    ) -> None:
        self._reporter = reporter
        self._api = api
        self._view = view
        self._node = node
        self._keys = keys
        self._renew_s = renew_s
        self._primary: DevicePluginService | None = None  # the count resource, once registered
        self._changed = asyncio.Event()

    @property
    def alive(self) -> bool:
        """Whether kubelet has the plugin: the count resource registered and ListAndWatch open."""
        return self._primary is not None and self._primary.watchers > 0

    def serving(self, primary: DevicePluginService | None) -> None:
        """kubelet took ``primary`` (the count resource's service), or has none of ours (None)."""
        self._primary = primary
        self._changed.set()

    async def run(self, *, warn: Callable[[], bool]) -> None:
        """Renew while ``alive``; ``warn()`` says whether not renewing is worth a warning (not
        before the first session)."""
        said = ""  # why the Lease is not renewed, as last logged
        while True:
            self._changed.clear()
            primary = self._primary
            if primary is not None:
                primary.watchers_changed.clear()
            if self.alive:
                said = ""
                try:
                    await self._reporter.renew_lease()
                except errors.KubeError as exc:
                    log.error("node %s: lease renewal failed: %s", self._node, exc)
            else:
                why = "not registered" if primary is None else "no ListAndWatch stream open"
                if why != said and (warn() or primary is not None):
                    said = why
                    log.warning(
                        "node %s: not renewing the Lease: kubelet does not have the plugin (%s); the "
                        "scheduler stops placing GPU pods here once it expires",
                        self._node,
                        why,
                    )
            try:  # a lock whose holder will never Allocate here must not outlive it
                await lockreaper.release_orphaned_lock(
                    api=self._api, view=self._view, node=self._node, keys=self._keys
                )
            except errors.KubeError as exc:
                log.error("node %s: checking the node lock failed: %s", self._node, exc)
            waits = [self._changed.wait()]
            if primary is not None:
                waits.append(primary.watchers_changed.wait())
            await _first_of(waits, timeout_s=self._renew_s)
