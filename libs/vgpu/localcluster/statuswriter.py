"""The ``status`` subresource writes the emulated kube-scheduler and kubelet make.

``vgpu.kube.port.KubeApi`` has no status subresource (our services never write status), but a
scheduler writes the PodScheduled condition, and a kubelet writes pod phases and node capacity,
through ``pods/status`` and ``nodes/status``; a write to the main resource leaves status alone.
``StatusWriter`` is that one call; ``StoreStatusWriter`` serves it from a local ``Store``.
An API object that has a ``merge_patch_status`` method satisfies the Protocol directly.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from vgpu.kube.port import JsonObj, Kind
from vgpu.localcluster.store import Store


@runtime_checkable
class StatusWriter(Protocol):
    async def merge_patch_status(
        self, kind: Kind, name: str, patch: Mapping[str, Any], *, namespace: str | None = None
    ) -> JsonObj:
        """JSON merge patch (RFC 7386) on ``<kind>/<name>/status``: only ``status`` changes."""
        ...


class StoreStatusWriter:
    """``StatusWriter`` straight into a local ``Store`` (what the HTTP door's PATCH .../status does)."""

    def __init__(self, store: Store) -> None:
        self._store = store

    async def merge_patch_status(
        self, kind: Kind, name: str, patch: Mapping[str, Any], *, namespace: str | None = None
    ) -> JsonObj:
        return self._store.patch(
            kind, name, dict(patch), patch_type="merge", namespace=namespace, subresource="status"
        )


def resolve(api: object, writer: StatusWriter | None) -> StatusWriter:
    """The writer to use: the one given, else ``api`` itself if it can write status."""
    if writer is not None:
        return writer
    if isinstance(api, StatusWriter):
        return api
    raise TypeError(
        f"{type(api).__name__} cannot write the status subresource: pass status_writer= "
        "(e.g. StoreStatusWriter(store)) or use an API with merge_patch_status"
    )
