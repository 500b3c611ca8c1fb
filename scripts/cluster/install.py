"""Install the chart on the cluster of ``scripts/cluster/cluster.sh`` as ``helm install`` would.

    .venv/bin/python scripts/cluster/install.py [--tls secret|none] [-f more-values.yaml] [--uninstall]

The chart is rendered offline with Helm's Go SDK (``helm-python-sdk``, a dev dependency; no
``helm`` binary needed) for the cluster's version, with ``scripts/cluster/values-fake.yaml`` and
what this script adds: the HAMi-core host directory under the cluster's directory, and for
``--tls secret`` (the default) a certificate for the scheduler's Service, signed by a CA made here,
stored as the Secret the chart names and its CA as the webhooks' caBundle. The objects are then
applied with kubectl (release namespace first). ``certgen`` and ``certManager`` need images or
controllers from registries this machine cannot reach.
"""

from __future__ import annotations

import argparse
import base64
import datetime
import inspect
import json
import os
import pathlib
import subprocess
import sys
from typing import Any

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

HERE = pathlib.Path(__file__).resolve().parent
CHART = HERE.parents[1] / "deploy" / "helm" / "kube-vgpu"
RELEASE = "gpu"
NAMESPACE = "kube-vgpu"
TLS_SECRET = f"{RELEASE}-kube-vgpu-tls"


def _cluster_dir() -> pathlib.Path:
    return pathlib.Path(os.environ.get("CLUSTER_DIR", "/var/tmp/kube-vgpu-cluster"))


def kubectl(*args: str, stdin: str | None = None) -> str:
    cluster = _cluster_dir()
    k8s_bin = pathlib.Path((cluster / "k8s-bin").read_text().strip())
    argv = [str(k8s_bin / "kubectl"), "--kubeconfig", str(cluster / "kubeconfig")]
    argv += ["--cache-dir", str(cluster / "kubectl-cache"), *args]
    done = subprocess.run(argv, input=stdin, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"kubectl {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def serving_secret(*, service: str, namespace: str, now: datetime.datetime) -> tuple[dict[str, Any], str]:
    """A kubernetes.io/tls Secret for ``service.namespace.svc`` and the base64 PEM of its CA."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-vgpu-webhook-ca")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    names = [service, f"{service}.{namespace}", f"{service}.{namespace}.svc"]
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[-1])]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in names]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    key_pem = key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/tls",
        "metadata": {"name": TLS_SECRET, "namespace": namespace},
        "data": {
            "tls.crt": base64.b64encode(cert.public_bytes(pem)).decode(),
            "tls.key": base64.b64encode(key_pem).decode(),
            "ca.crt": base64.b64encode(ca.public_bytes(pem)).decode(),
        },
    }
    return secret, base64.b64encode(ca.public_bytes(pem)).decode()


def render(values: dict[str, Any], *, kube_version: str) -> list[dict[str, Any]]:
    """The chart's objects, as ``helm template gpu CHART -n kube-vgpu --kube-version V`` renders them."""
    import helm_python  # a dev dependency: imported here so --help works without it

    opts = {"name": RELEASE, "namespace": NAMESPACE, "kube_version": kube_version, "is_install": True}
    with helm_python.Chart.load(str(CHART)) as chart:
        if "kube_version" in inspect.signature(chart.render).parameters:
            manifests: dict[str, str] = chart.render(values, **opts)
        else:  # the render call the public method wraps, with all its options
            from helm_python import _native

            payload = _native.call_string("helm_render", chart._raw(), json.dumps(values), json.dumps(opts))
            manifests = json.loads(payload)
    objects: list[dict[str, Any]] = []
    for path, text in sorted(manifests.items()):
        if path.endswith((".yaml", ".yml")):
            objects += [o for o in yaml.safe_load_all(text) if o]
    # as helm does: namespaces before the objects in them
    return sorted(objects, key=lambda o: o["kind"] != "Namespace")


def values_for(*, tls: str, extra: list[pathlib.Path], ca_bundle: str) -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load((HERE / "values-fake.yaml").read_text())
    values.setdefault("config", {}).setdefault("devicePlugin", {})["hookPath"] = str(_cluster_dir() / "hook")
    values["tls"] = {"mode": tls}
    if tls == "secret":
        values["tls"]["secret"] = {"name": TLS_SECRET, "caBundle": ca_bundle}
    else:  # no HTTPS, no webhooks: the update guard becomes a ValidatingAdmissionPolicy (1.30+)
        values["webhook"] = {"enabled": False}
        values["guard"] = {"mode": "policy"}
    for path in extra:
        try:
            more = yaml.safe_load(path.read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise SystemExit(f"install.py: values file {path}: {exc}") from None
        if not isinstance(more, dict):
            raise SystemExit(f"install.py: values file {path}: expected a mapping, got {type(more).__name__}")
        _merge(values, more)
    return values


def _merge(into: dict[str, Any], more: dict[str, Any]) -> None:
    for key, value in more.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tls", choices=("secret", "none"), default="secret")
    parser.add_argument("-f", "--values", type=pathlib.Path, action="append", default=[])
    parser.add_argument("--uninstall", action="store_true")
    args = parser.parse_args(argv)
    version = json.loads(kubectl("version", "-o", "json"))["serverVersion"]["gitVersion"]
    if args.uninstall:
        # what either TLS mode installed (helm remembers the release's objects; this script does not)
        objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        for tls in ("secret", "none"):
            values = values_for(tls=tls, extra=args.values, ca_bundle="Cg==")
            for o in render(values, kube_version=version):
                key = (o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"])
                objects[key] = o
        kept = [o for o in objects.values() if o["kind"] != "Namespace"]
        kubectl("delete", "--ignore-not-found", "--wait=true", "-f", "-", stdin=_stream(kept))
        kubectl("delete", "namespace", "--ignore-not-found", f"{NAMESPACE}-leases")
        kubectl("delete", "namespace", "--ignore-not-found", NAMESPACE)
        return 0
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
    kubectl("apply", "-f", "-", stdin=json.dumps(namespace))
    ca_bundle = ""
    if args.tls == "secret":
        now = datetime.datetime.now(datetime.UTC)
        secret, ca_bundle = serving_secret(
            service=f"{RELEASE}-kube-vgpu-scheduler", namespace=NAMESPACE, now=now
        )
        kubectl("apply", "-f", "-", stdin=json.dumps(secret))
    objects = render(values_for(tls=args.tls, extra=args.values, ca_bundle=ca_bundle), kube_version=version)
    print(kubectl("apply", "-f", "-", stdin=_stream(objects)), end="")
    return 0


def _stream(objects: list[dict[str, Any]]) -> str:
    return "---\n".join(yaml.safe_dump(o) for o in objects)


if __name__ == "__main__":
    sys.exit(main())
