"""Where the real Kubernetes binaries are: ``VGPU_K8S_BIN`` (``scripts/build-kubernetes.sh`` builds
them); a test that needs them is skipped without them, as the ``gpu`` tests are without a GPU."""

from __future__ import annotations

import os
import pathlib

import pytest


def k8s_bin(*needed: str) -> pathlib.Path:
    """The directory ``VGPU_K8S_BIN`` names, holding ``needed``; skips the test otherwise."""
    raw = os.environ.get("VGPU_K8S_BIN")
    if not raw:
        pytest.skip("VGPU_K8S_BIN is not set (scripts/build-kubernetes.sh builds the binaries)")
    path = pathlib.Path(raw)
    missing = [n for n in needed if not (path / n).exists()]
    if missing:
        pytest.skip(f"VGPU_K8S_BIN={path} lacks {', '.join(missing)}")
    return path
