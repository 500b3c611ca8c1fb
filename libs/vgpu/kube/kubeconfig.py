"""Kubeconfig files: write one for a known server (the local cluster, tests, ``vgpu demo``).

Reading kubeconfig files is the official client's job (``vgpu.kube.client``); this module only
writes the small single-context file that ``kubernetes.config.load_kube_config`` accepts.
"""

from __future__ import annotations

import base64
import pathlib
from typing import Any

import yaml


def write_kubeconfig(
    path: str | pathlib.Path,
    *,
    server: str,
    token: str | None = None,
    ca_pem: bytes | None = None,
    namespace: str = "default",
    name: str = "local",
) -> pathlib.Path:
    """Write a kubeconfig with one cluster/user/context named ``name``; returns the path.

    With an https ``server`` and no ``ca_pem`` the file says ``insecure-skip-tls-verify``.
    """
    cluster: dict[str, Any] = {"server": server}
    if server.startswith("https"):
        if ca_pem:
            cluster["certificate-authority-data"] = base64.b64encode(ca_pem).decode()
        else:
            cluster["insecure-skip-tls-verify"] = True
    user: dict[str, Any] = {"token": token} if token else {}
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": cluster}],
        "users": [{"name": name, "user": user}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name, "namespace": namespace}}],
        "current-context": name,
    }
    out = pathlib.Path(path)
    out.write_text(yaml.safe_dump(config))
    out.chmod(0o600)
    return out
