"""Namespaces as the webhook and the filter see them: labels, GPU usage, ResourceQuota hard limits.

Fed by the namespaces and resourcequotas watches and by the cluster state's pod charges (usage).
Quota limits are the ``limits.<memory resource>`` (MiB) and ``limits.<cores resource>`` (percent)
keys of ``spec.hard`` (docs/protocol.md#namespace-quota); with several quotas in a namespace the smallest wins. An
unreadable quantity is logged and ignored, never fatal.
"""

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from vgpu.core import errors, quantity
from vgpu.core.config import ResourceNames
from vgpu.core.quota import Quota

log = logging.getLogger(__name__)


@dataclass
class _Namespace:
    known: bool = False  # the Namespace object was seen (else only pods' usage is counted here)
    labels: dict[str, str] = field(default_factory=dict)
    memory_mib: int = 0
    cores: int = 0


class Namespaces:
    def __init__(self, resources: ResourceNames) -> None:
        self._resources = resources
        self._namespaces: dict[str, _Namespace] = {}
        # namespace -> quota name -> (memory MiB, cores) limits; indexed by namespace because the
        # filter reads a namespace's limits on every GPU pod it places
        self._quotas: dict[str, dict[str, tuple[int | None, int | None]]] = {}

    def namespace(self, obj: Mapping[str, Any], deleted: bool) -> None:
        meta = obj.get("metadata") or {}
        name = str(meta.get("name", ""))
        labels = meta.get("labels") or {}
        ns = self._namespaces.setdefault(name, _Namespace())
        ns.known = not deleted
        ns.labels = {} if deleted else {str(k): str(v) for k, v in labels.items()}
        if deleted and not ns.memory_mib and not ns.cores:
            del self._namespaces[name]

    def quota(self, obj: Mapping[str, Any], deleted: bool) -> None:
        meta = obj.get("metadata") or {}
        key = (str(meta.get("namespace", "")), str(meta.get("name", "")))
        if deleted:
            held = self._quotas.get(key[0], {})
            held.pop(key[1], None)
            if not held:
                self._quotas.pop(key[0], None)
            return
        spec = obj.get("spec") or {}
        hard = (spec.get("hard") if isinstance(spec, Mapping) else None) or {}
        if not isinstance(hard, Mapping):
            log.warning("resourcequota %s/%s: spec.hard is not an object; no GPU limits read", *key)
            hard = {}
        res = self._resources
        limits: list[int | None] = []
        for resource, parse in ((res.memory, quantity.parse_mib), (res.cores, quantity.parse_int)):
            raw = hard.get(f"limits.{resource}")
            try:
                limits.append(None if raw is None else parse(raw, field=f"limits.{resource}"))
            except errors.QuantityError as exc:
                log.warning("resourcequota %s/%s: %s", key[0], key[1], exc)
                limits.append(None)
        self._quotas.setdefault(key[0], {})[key[1]] = (limits[0], limits[1])

    def add_usage(self, ns: str, *, memory_mib: int, cores: int) -> None:
        """Add (or, negative, take back) GPU usage of a pod in ``ns``."""
        got = self._namespaces.setdefault(ns, _Namespace())
        got.memory_mib += memory_mib
        got.cores += cores

    def labels(self, ns: str) -> Mapping[str, str] | None:
        got = self._namespaces.get(ns)
        return got.labels if got is not None and got.known else None

    def usage(self, ns: str) -> tuple[int, int]:
        got = self._namespaces.get(ns)
        return (0, 0) if got is None else (got.memory_mib, got.cores)

    def limits(self, ns: str) -> tuple[int | None, int | None]:
        memory: int | None = None
        cores: int | None = None
        for m, c in self._quotas.get(ns, {}).values():
            if m is not None:
                memory = m if memory is None else min(memory, m)
            if c is not None:
                cores = c if cores is None else min(cores, c)
        return memory, cores

    def quota_facts(self, ns: str, *, minus: tuple[int, int] = (0, 0)) -> Quota | None:
        """The namespace's limits and live usage (less ``minus``: memory MiB, cores) for the
        quota check at placement; None when no quota limits our resources there."""
        memory_limit, cores_limit = self.limits(ns)
        if memory_limit is None and cores_limit is None:
            return None
        memory, cores = self.usage(ns)
        return Quota(memory_limit, cores_limit, memory - minus[0], cores - minus[1])
