"""HAMi-core's host files, watched: while they are not regular files the shared GPUs are unhealthy.

Every HAMi-sharing response mounts ``<hook>/vgpu/libvgpu.so`` and ``<hook>/vgpu/ld.so.preload``. A
container runtime makes a missing mount source a directory (containerd and runc do), so a node
whose installer failed would start every GPU container with its limits silently unenforced.

``HamiCoreWatch`` checks the files (``HostFs.hami_core_problem``: lstat, regular files only) when a
session starts, every ``interval_s`` and at once when Allocate found them missing (``poke``). While
they are missing the session's shared GPUs carry the node condition ``hami-core`` (ListAndWatch
reports them Unhealthy, the register annotation says ``health: false``, so kubelet and the
scheduler stop placing GPU pods here), and Allocate refuses with the path and the remedy
(``HostFs.check_hami_core``). It logs once when the files go missing (or the problem changes) and
once when they are back; then the GPUs are healthy again without a restart.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence

from vgpu.core.device import GpuUuid
from vgpu.waits import wait_at_most

from vgpu_device_plugin.health import HealthMonitor
from vgpu_device_plugin.hostfs import HostFs

log = logging.getLogger(__name__)

CONDITION = "hami-core"


class HamiCoreWatch:
    """One per plugin process (its log state outlives sessions); ``run`` per session."""

    def __init__(
        self,
        host: HostFs,
        *,
        node: str,
        offload: Callable[[Callable[[], str | None]], Awaitable[str | None]] = asyncio.to_thread,
    ) -> None:
        self._host = host
        self._node = node
        self._offload = offload
        self.problem: str | None = None
        self._checked = False
        self._poked = asyncio.Event()

    def _note(self, problem: str | None) -> None:
        if problem == self.problem and self._checked:
            return
        if problem is not None:
            log.error(
                "node %s: %s; Allocate refused and GPUs reported unhealthy until fixed", self._node, problem
            )
        elif self._checked:
            log.warning(
                "node %s: HAMi-core's files are in place again; GPUs healthy, Allocate serves", self._node
            )
        self.problem = problem
        self._checked = True

    async def check(self) -> str | None:
        """Look at the files now (off the event loop); the problem, or None."""
        problem = await self._offload(self._host.hami_core_problem)
        self._note(problem)
        return problem

    async def apply(self, monitor: HealthMonitor, uuids: Sequence[GpuUuid]) -> str | None:
        """Check, and hold ``uuids`` unhealthy in ``monitor`` while there is a problem."""
        problem = await self.check()
        await monitor.set_condition(CONDITION, problem, uuids=uuids)
        return problem

    def poke(self) -> None:
        """Allocate found the files missing: check again now, not at the next interval."""
        self._poked.set()

    async def run(self, monitor: HealthMonitor, uuids: Sequence[GpuUuid], *, interval_s: float) -> None:
        """Re-check every ``interval_s`` (or when poked) until cancelled."""
        while True:
            await wait_at_most(self._poked.wait(), interval_s)
            self._poked.clear()
            await self.apply(monitor, uuids)
