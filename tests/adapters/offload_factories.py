"""Factories for ``OffloadedKubeApi`` children that cannot start: module-level, so they pickle by
name and the child imports them (tests/adapters/test_offload.py)."""

from __future__ import annotations

import time

from vgpu.kube.aioapi import AioKubeApi


def broken() -> AioKubeApi:
    """A configuration the child cannot load: it exits with a traceback."""
    raise RuntimeError("no Kubernetes configuration here")


def stuck() -> AioKubeApi:
    """A child that never gets as far as its first frame (a hung credentials plugin, say)."""
    time.sleep(3600)
    raise AssertionError("unreachable")
