"""The tests marked ``realk8s`` run against a real etcd, kube-apiserver and kube-scheduler from the
directory ``VGPU_K8S_BIN`` names (``scripts/build-kubernetes.sh`` builds them from Debian's source
package); without it they are skipped, as the ``gpu`` tests are without a GPU."""

from __future__ import annotations

import os
import pathlib

import pytest


@pytest.fixture
def k8s_bin() -> pathlib.Path:
    raw = os.environ.get("VGPU_K8S_BIN")
    if not raw:
        pytest.skip("VGPU_K8S_BIN is not set (scripts/build-kubernetes.sh builds the binaries)")
    path = pathlib.Path(raw)
    missing = [n for n in ("kube-apiserver", "kube-scheduler", "etcd") if not (path / n).exists()]
    if missing:
        pytest.skip(f"VGPU_K8S_BIN={path} lacks {', '.join(missing)}")
    return path
