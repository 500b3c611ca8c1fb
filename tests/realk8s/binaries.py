"""Where the real Kubernetes binaries are: ``VGPU_K8S_BIN`` (``scripts/build-kubernetes.sh`` builds
them); a test that needs them is skipped without them, as the ``gpu`` tests are without a GPU."""

from __future__ import annotations

import functools
import os
import pathlib
import re
import subprocess

import pytest

DRA_MINOR = 34
"""resource.k8s.io/v1 (the DRA mode's API) is served from Kubernetes 1.34."""


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


@functools.cache
def _minor(apiserver: pathlib.Path) -> int | None:
    out = subprocess.run([str(apiserver), "--version"], capture_output=True, text=True, check=False).stdout
    found = re.search(r"v1\.(\d+)\.", out)
    return int(found.group(1)) if found else None


def needs_dra(path: pathlib.Path) -> None:
    """Skip the test unless ``path``'s kube-apiserver serves resource.k8s.io/v1 (1.34+)."""
    minor = _minor(path / "kube-apiserver")
    if minor is None or minor < DRA_MINOR:
        pytest.skip(f"the DRA mode needs Kubernetes 1.{DRA_MINOR}+; {path} has 1.{minor}")
