"""The ``cdi-cri`` strategy against this node's kubelet version (``vgpu.core.cdisupport``).

``CdiGuard`` wraps a resource's Allocate handler: with ``deviceListStrategy: cdi-cri`` on a node
whose kubelet is older than 1.28 (``status.nodeInfo.kubeletVersion`` from the node watch) every
Allocate is refused with the reason, instead of answering with CDI names kubelet drops (the
container would start without its GPU); on 1.28, or when the version is not known, it is warned
about once per version. Other strategies pass straight through. ``check_specs`` looks, at each
session's start, for the CDI specs (``/etc/cdi``, ``/var/run/cdi`` below the host root) that must
define every device name a CDI strategy hands out, and logs an error naming those none defines.
"""

import asyncio
import json
import logging
import pathlib

import yaml
from vgpu.core import allocation, cdisupport, errors
from vgpu.core.config import DevicePluginConfig

from vgpu_device_plugin import inventory
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


def cdi_names(inv: inventory.Inventory, config: DevicePluginConfig) -> list[str]:
    """The CDI device names this node's answers can carry: each shared GPU by UUID (or index, with
    ``deviceIdStrategy: index``) and each MIG device served whole by its UUID."""
    names = [str(g.index) if config.device_id_strategy == "index" else g.uuid for g in inv.shared_gpus]
    names += [d.id for r in inv.resources if not r.shared for d in r.devices]
    return names


def read_spec_names(root: pathlib.Path, *, kind: str) -> set[str]:
    """The device names the CDI specs under ``root`` (the host's ``/``) define for ``kind``
    (blocking file reads: call off the event loop). Unreadable files are skipped."""
    names: set[str] = set()
    for directory in cdisupport.CDI_SPEC_DIRS:
        base = root / directory.lstrip("/")
        try:
            files = sorted(p for p in base.iterdir() if p.suffix in (".json", ".yaml", ".yml"))
        except OSError:
            continue
        for path in files:
            try:
                text = path.read_text()
                doc = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
            except (OSError, ValueError, yaml.YAMLError) as exc:
                log.debug("CDI spec %s skipped: %s", path, exc)
                continue
            names |= cdisupport.spec_device_names(doc, kind=kind)
    return names


async def check_specs(
    *, root: pathlib.Path, config: DevicePluginConfig, names: list[str], node: str
) -> list[str]:
    """With a CDI strategy, log an error naming the devices no CDI spec defines; those names."""
    if config.device_list_strategy not in ("cdi-annotations", "cdi-cri") or not names:
        return []
    found = await asyncio.to_thread(read_spec_names, root, kind=allocation.CDI_KIND)
    missing = [n for n in names if n not in found]
    if missing:
        log.error(
            "node %s: %s",
            node,
            cdisupport.missing_spec_message(
                config.device_list_strategy, kind=allocation.CDI_KIND, missing=missing
            ),
        )
    return missing
