"""The tests marked ``realk8s`` run against a real etcd, kube-apiserver and kube-scheduler from the
directory ``VGPU_K8S_BIN`` names (``scripts/build-kubernetes.sh`` builds them from Debian's source
package); without it they are skipped, as the ``gpu`` tests are without a GPU."""

from __future__ import annotations

import pathlib

import pytest

from tests.realk8s import binaries


@pytest.fixture
def k8s_bin() -> pathlib.Path:
    return binaries.k8s_bin("kube-apiserver", "kube-scheduler", "etcd")
