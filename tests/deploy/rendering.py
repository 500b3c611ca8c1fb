"""Render the Helm chart offline with the Helm SDK (``helm-python-sdk``) and index the objects.

``helm-python-sdk`` binds Helm v4's Go SDK through a bundled shared library, so no ``helm`` binary
and no cluster are needed. Its public ``Chart.render`` does not expose the cluster version, which
the chart reads (kube-scheduler's tag and config apiVersion), while the library's render call
accepts ``kube_version`` and ``api_versions`` options (``helm template --kube-version``); we pass
them through that call, and use the public method instead once it grows the parameter.
"""

from __future__ import annotations

import copy
import inspect
import json
import pathlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml

helm = pytest.importorskip("helm_python", reason="helm-python-sdk (dev dependency) is not installed")

REPO = pathlib.Path(__file__).resolve().parents[2]
CHART_DIR = REPO / "deploy" / "helm" / "kube-vgpu"
RELEASE = "gpu"
NAMESPACE = "kube-vgpu"
LEASE_NAMESPACE = f"{NAMESPACE}-leases"  # the chart's default: a namespace of their own
FULLNAME = f"{RELEASE}-kube-vgpu"

Obj = dict[str, Any]


@dataclass(frozen=True)
class Rendered:
    """The objects of one render, with the template each came from."""

    by_template: dict[str, list[Obj]]
    kube_version: str

    @property
    def objects(self) -> list[Obj]:
        return [o for objs in self.by_template.values() for o in objs]

    def of_kind(self, kind: str) -> list[Obj]:
        return [o for o in self.objects if o["kind"] == kind]

    def one(self, kind: str, name: str | None = None) -> Obj:
        found = [o for o in self.of_kind(kind) if name is None or o["metadata"]["name"] == name]
        assert len(found) == 1, (
            f"expected one {kind} {name or ''}, found {[o['metadata']['name'] for o in found]}"
        )
        return found[0]

    def container(self, kind: str, name: str) -> Obj:
        spec = self.one(kind)["spec"]["template"]["spec"]
        found: list[Obj] = [c for c in spec["containers"] if c["name"] == name]
        assert len(found) == 1, f"no single container {name} in {kind}"
        return found[0]

    def __iter__(self) -> Iterator[Obj]:
        return iter(self.objects)


def _render_raw(chart: Any, values: dict[str, Any] | None, opts: dict[str, Any]) -> dict[str, str]:
    if "kube_version" in inspect.signature(chart.render).parameters:
        public: dict[str, str] = chart.render(values, **opts)
        return public
    from helm_python import _native  # the render call the public method wraps, with all its options

    payload = _native.call_string(
        "helm_render", chart._raw(), None if values is None else json.dumps(values), json.dumps(opts)
    )
    raw: dict[str, str] = json.loads(payload)
    return raw


_CACHE: dict[str, Rendered] = {}


def render(
    values: dict[str, Any] | None = None,
    *,
    kube_version: str = "v1.29.3",
    api_versions: tuple[str, ...] = (),
) -> Rendered:
    """Render like ``helm template gpu deploy/helm/kube-vgpu -n kube-vgpu --kube-version ...``.

    Renders are memoised per (values, version) for the session; each caller gets its own copy."""
    key = json.dumps([values, kube_version, api_versions], sort_keys=True)
    if key not in _CACHE:
        _CACHE[key] = _render(values, kube_version=kube_version, api_versions=api_versions)
    return copy.deepcopy(_CACHE[key])


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate mapping keys, as the API server's YAML decoding does."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def parse_manifest(text: str) -> list[Obj]:
    """The objects of one rendered template (strict: duplicate keys are an error)."""
    return [d for d in yaml.load_all(text, Loader=_StrictLoader) if d]


def _render(values: dict[str, Any] | None, *, kube_version: str, api_versions: tuple[str, ...]) -> Rendered:
    opts: dict[str, Any] = {
        "name": RELEASE,
        "namespace": NAMESPACE,
        "kube_version": kube_version,
        "is_install": True,
    }
    if api_versions:
        opts["api_versions"] = list(api_versions)
    with helm.Chart.load(str(CHART_DIR)) as chart:
        manifests = _render_raw(chart, values, opts)
    by_template: dict[str, list[Obj]] = {}
    for path, text in sorted(manifests.items()):
        if not path.endswith((".yaml", ".yml")):
            continue
        by_template[path.removeprefix("kube-vgpu/")] = parse_manifest(text)
    return Rendered(by_template=by_template, kube_version=kube_version)


def render_error(values: dict[str, Any], *, kube_version: str = "v1.29.3") -> str:
    """The error message of a render that must fail (the chart's value checks)."""
    try:
        render(values, kube_version=kube_version)
    except helm.HelmError as exc:
        return str(exc)
    raise AssertionError(f"rendering {values} succeeded but should have failed")


def embedded_yaml(configmap: Obj, key: str = "config.yaml") -> Obj:
    data: Obj = yaml.safe_load(configmap["data"][key])
    return data


HA_CERT_MANAGER: dict[str, Any] = {
    "scheduler": {"replicas": 3},
    "tls": {"mode": "certManager"},
    "webhook": {"failurePolicy": "Fail"},
}
