"""The ``cdi-cri`` strategy against this node's kubelet version (``vgpu.core.cdisupport``).

``CdiGuard`` wraps a resource's Allocate handler: with ``deviceListStrategy: cdi-cri`` on a node
whose kubelet is older than 1.28 (``status.nodeInfo.kubeletVersion`` from the node watch) every
Allocate is refused with the reason, instead of answering with CDI names kubelet drops (the
container would start without its GPU); on 1.28, or when the version is not known, it is warned
about once per version. Other strategies pass straight through.
"""

import logging

from vgpu.core import allocation, cdisupport, errors
from vgpu.core.config import DevicePluginConfig

from vgpu_device_plugin.podcache import ClusterView
from vgpu_device_plugin.server import AllocateHandler

log = logging.getLogger(__name__)


def kubelet_version(view: ClusterView) -> str | None:
    node = view.node() or {}
    info = (node.get("status") or {}).get("nodeInfo") or {}
    version = info.get("kubeletVersion") if isinstance(info, dict) else None
    return version if isinstance(version, str) and version else None


class CdiGuard:
    """An ``AllocateHandler`` that checks the kubelet version first (see the module docstring)."""

    def __init__(
        self, inner: AllocateHandler, *, view: ClusterView, config: DevicePluginConfig, node: str
    ) -> None:
        self.inner = inner
        self._view = view
        self._config = config
        self._node = node
        self._warned: str | None = None

    def verdict(self) -> cdisupport.Verdict:
        version = kubelet_version(self._view)
        verdict = cdisupport.check(self._config.device_list_strategy, version)
        if verdict.level == "warn" and self._warned != version:
            self._warned = version
            log.warning("node %s: %s", self._node, verdict.message)
        return verdict

    async def allocate(self, requests: list[list[str]]) -> list[allocation.ContainerAllocation]:
        verdict = self.verdict()
        if verdict.level == "refuse":
            raise errors.AllocationError(f"node {self._node}: {verdict.message}")
        return await self.inner.allocate(requests)

    async def preferred(self, requests: list[allocation.PreferredRequest]) -> list[list[str]]:
        return await self.inner.preferred(requests)
