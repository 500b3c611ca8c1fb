"""The single-node cluster's recipe (scripts/cluster), checked offline: the values an operator sets
there make the chart run the fake backend and the stand-in installer (chart values, no code
change), each TLS mode renders what it must, and the image recipe matches the Dockerfile."""

from __future__ import annotations

import importlib.util
import pathlib
import re
import types
from typing import Any

import pytest

from tests.deploy import rendering

SCRIPTS = rendering.REPO / "scripts" / "cluster"


def _install_module() -> types.ModuleType:
    spec = importlib.util.spec_from_file_location("cluster_install", SCRIPTS / "install.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


install = _install_module()


def _objects(values: dict[str, Any]) -> list[dict[str, Any]]:
    objects: list[dict[str, Any]] = install.render(values, kube_version="v1.36.2")
    return objects


def _daemonset(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (ds,) = [o for o in objects if o["kind"] == "DaemonSet"]
    spec: dict[str, Any] = ds["spec"]["template"]["spec"]
    return spec


def test_the_fake_backend_and_the_stand_in_installer_are_chart_values(
    monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path
) -> None:
    monkeypatch.setenv("CLUSTER_DIR", str(tmp_path))
    objects = _objects(install.values_for(tls="secret", extra=[], ca_bundle="Cg=="))
    spec = _daemonset(objects)
    (plugin,) = [c for c in spec["containers"] if c["name"] == "device-plugin"]
    assert "--backend=fake" in plugin["command"]
    assert plugin["image"] == "localhost/kube-vgpu:dev" and plugin["imagePullPolicy"] == "Never"
    (installer,) = spec["initContainers"]
    assert installer["image"] == "localhost/hami-core-standin:dev"
    hami_core = {v["name"]: v for v in spec["volumes"]}["hami-core"]["hostPath"]["path"]
    assert hami_core == f"{tmp_path}/hook/vgpu"
    assert objects[0]["kind"] == "Namespace"  # before the objects in it


def test_tls_secret_puts_the_ca_in_every_webhook_and_tls_none_renders_none(
    monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path
) -> None:
    monkeypatch.setenv("CLUSTER_DIR", str(tmp_path))
    secret = _objects(install.values_for(tls="secret", extra=[], ca_bundle="Q0E="))
    hooks = [w for o in secret if o["kind"].endswith("WebhookConfiguration") for w in o["webhooks"]]
    assert hooks and all(w["clientConfig"]["caBundle"] == "Q0E=" for w in hooks)
    none = _objects(install.values_for(tls="none", extra=[], ca_bundle=""))
    kinds = {o["kind"] for o in none}
    assert not any(k.endswith("WebhookConfiguration") for k in kinds)
    assert "ValidatingAdmissionPolicy" in kinds  # the update guard without a webhook


def test_the_serving_secret_covers_the_service_names() -> None:
    import base64
    import datetime

    from cryptography import x509

    now = datetime.datetime.now(datetime.UTC)
    secret, ca = install.serving_secret(service="gpu-kube-vgpu-scheduler", namespace="kube-vgpu", now=now)
    cert = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.DNSName
    )
    assert "gpu-kube-vgpu-scheduler.kube-vgpu.svc" in names
    assert base64.b64decode(ca).startswith(b"-----BEGIN CERTIFICATE-----")


@pytest.mark.parametrize(
    "text", ["- a list\n", "just a string\n", "key: [unclosed\n"], ids=["list", "scalar", "bad-yaml"]
)
def test_a_values_file_that_is_not_a_mapping_is_a_one_line_error(
    text: str, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CLUSTER_DIR", str(tmp_path))
    bad = tmp_path / "values.yaml"
    bad.write_text(text)
    with pytest.raises(SystemExit, match="values file"):
        install.values_for(tls="none", extra=[bad], ca_bundle="")


def test_the_image_recipe_matches_the_dockerfile() -> None:
    dockerfile = (rendering.REPO / "Dockerfile").read_text()
    recipe = (SCRIPTS / "images.sh").read_text()
    venv = re.search(r"python -m venv (\S+)", dockerfile)
    assert venv is not None and f"python -m venv {venv.group(1)}" in recipe
    for line in (
        "--uid 65532",
        "--gid 65532",
        "--config.user 65532:65532",
        "--config.entrypoint vgpu-scheduler",
    ):
        assert line in recipe, line
    assert 'ENTRYPOINT ["vgpu-scheduler"]' in dockerfile and "USER 65532:65532" in dockerfile
    for env in re.findall(r"(PYTHON\w+=\d)", dockerfile):
        assert f"--config.env {env}" in recipe, env
    for program in ("vgpu-scheduler", "vgpu-device-plugin", "vgpu-monitor"):
        assert f"{program} --help" in dockerfile and f"bin/{program} --help" in recipe
