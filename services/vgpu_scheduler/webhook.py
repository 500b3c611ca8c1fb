"""The mutating admission webhook: AdmissionReview in, AdmissionReview out (PROTOCOL.md E, H.4).

This module is the HTTP adapter only. It decodes the review envelope (``admission.k8s.io/v1`` or
``v1beta1``), gathers the namespace facts the decision needs from an ``AdmissionView`` (in-memory
state kept by the scheduler's caches), calls the pure ``vgpu.core.admission.decide`` and encodes
its answer in the same review version, with ``response.uid`` echoed and the JSON Patch base64'd.

A body that is not an AdmissionReview gets HTTP 400 with the reason (there is no uid to answer);
everything else gets HTTP 200 with a review response.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from aiohttp import web
from vgpu.core.config import Config


class AdmissionView(Protocol):
    """What the webhook reads from the scheduler's live state (all in memory, never blocking)."""

    def namespace_labels(self, ns: str) -> Mapping[str, str] | None:
        """The namespace's labels, or None when the namespace is not known (yet)."""
        ...

    def namespace_gpu_usage(self, ns: str) -> tuple[int, int]:
        """(memory MiB, cores percent) held by the namespace's unfinished pods, memory factor applied."""
        ...

    def quota_limits(self, ns: str) -> tuple[int | None, int | None]:
        """The namespace's ResourceQuota ``spec.hard`` ``limits.<memory>`` (MiB, before the memory
        factor) and ``limits.<cores>`` (percent); None where no quota sets that key."""
        ...

    def largest_gpu_memory_mib(self) -> int:
        """Memory of the largest GPU registered in the cluster; 0 when none is known."""
        ...


class Webhook:
    """``POST /webhook`` handler. Build once per process; ``handle`` is the aiohttp handler."""

    def __init__(self, config: Config, view: AdmissionView) -> None:
        self._config = config
        self._view = view

    async def handle(self, request: web.Request) -> web.Response:
        raise web.HTTPNotImplemented(text="admission webhook not implemented yet")
