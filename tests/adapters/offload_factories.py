"""Factories for ``OffloadedKubeApi`` children that cannot start, and a watch transform: module-level,
so they pickle by name and the child imports them (tests/adapters/test_offload.py,
test_kube_adapters.py)."""

from __future__ import annotations

import os
import time
from typing import Any

from vgpu.kube.aioapi import AioKubeApi


def broken() -> AioKubeApi:
    """A configuration the child cannot load: it exits with a traceback."""
    raise RuntimeError("no Kubernetes configuration here")


def stuck() -> AioKubeApi:
    """A child that never gets as far as its first frame (a hung credentials plugin, say)."""
    time.sleep(3600)
    raise AssertionError("unreachable")


def tag_pid(obj: dict[str, Any]) -> dict[str, Any]:
    """A watch transform that names the process it ran in (``metadata.annotations['pid']``)."""
    meta = dict(obj.get("metadata") or {})
    meta["annotations"] = {**(meta.get("annotations") or {}), "pid": str(os.getpid())}
    return {**obj, "metadata": meta}
