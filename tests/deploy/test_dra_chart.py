"""The chart's DRA-mode objects (``dra.enabled``): the DeviceClasses equal what
``vgpu.core.dra.deviceclass`` builds (kube-apiserver 1.36 accepts both:
tests/realk8s/test_dra_schema.py), the device plugin's ResourceSlice rights, nothing of it by
default, and the values schema and version checks that guard it."""

from __future__ import annotations

from typing import Any

import pytest
from vgpu.core.dra import deviceclass

from tests.deploy import rendering

KUBE = "v1.36.2"
MODELS = ["NVIDIA A100-SXM4-40GB", "Tesla T4", "tesla t4", 'odd "model" \\ <&> é']


def _dra(**deviceclasses: Any) -> dict[str, Any]:
    return {"dra": {"enabled": True, "deviceClasses": deviceclasses}}


def _classes(rendered: rendering.Rendered) -> dict[str, Any]:
    return {c["metadata"]["name"]: c["spec"] for c in rendered.of_kind("DeviceClass")}


def _slice_roles(rendered: rendering.Rendered) -> list[dict[str, Any]]:
    """The device plugin's roles that grant anything on resourceslices (other services may read
    them under their own roles)."""
    return [
        r
        for r in rendered.of_kind("ClusterRole")
        if r["metadata"].get("annotations", {}).get("kube-vgpu.io/rbac-for") == "vgpu-device-plugin"
        and any("resourceslices" in rule.get("resources", ()) for rule in r["rules"])
    ]


def test_nothing_of_the_dra_mode_by_default() -> None:
    rendered = rendering.render(kube_version=KUBE)
    assert not rendered.of_kind("DeviceClass")
    assert not _slice_roles(rendered)


def test_the_general_class_is_the_builders() -> None:
    rendered = rendering.render(_dra(), kube_version=KUBE)
    assert _classes(rendered) == {"gpu.kube-vgpu.io": deviceclass.device_class()["spec"]}
    assert rendering.render(_dra(perModel=False, models=MODELS), kube_version=KUBE).of_kind(
        "DeviceClass"
    ) == rendered.of_kind("DeviceClass")


def test_per_model_classes_are_the_builders_once_each() -> None:
    rendered = rendering.render(_dra(perModel=True, models=MODELS), kube_version=KUBE)
    built = deviceclass.device_classes(models=MODELS, per_model=True)
    assert _classes(rendered) == {c["metadata"]["name"]: c["spec"] for c in built}
    assert len(rendered.of_kind("DeviceClass")) == 4  # "tesla t4" repeats "Tesla T4"'s name


def test_the_device_plugin_may_keep_its_resourceslice() -> None:
    rendered = rendering.render(_dra(), kube_version=KUBE)
    (role,) = _slice_roles(rendered)
    assert role["rules"] == [
        {
            "apiGroups": ["resource.k8s.io"],
            "resources": ["resourceslices"],
            "verbs": ["get", "create", "update", "delete"],
        }
    ]
    (binding,) = [
        b for b in rendered.of_kind("ClusterRoleBinding") if b["roleRef"]["name"] == role["metadata"]["name"]
    ]
    assert binding["subjects"] == [
        {
            "kind": "ServiceAccount",
            "name": f"{rendering.FULLNAME}-device-plugin",
            "namespace": rendering.NAMESPACE,
        }
    ]
    off = rendering.render({**_dra(), "devicePlugin": {"enabled": False}}, kube_version=KUBE)
    assert not _slice_roles(off) and off.of_kind("DeviceClass")


def test_every_dra_object_validates_against_the_1_36_schema() -> None:
    kv = pytest.importorskip("kubernetes_validate")
    rendered = rendering.render(_dra(perModel=True, models=MODELS), kube_version=KUBE)
    objs = rendered.of_kind("DeviceClass") + _slice_roles(rendered)
    assert len(objs) == 5
    for obj in objs:
        kv.validate(obj, "1.36.0", strict=True)


@pytest.mark.parametrize(
    ("values", "kube", "message"),
    [
        (
            _dra(perModel=True, models=["---"]),
            KUBE,
            'dra.deviceClasses.models: "---" gives no DeviceClass name',
        ),
        ({"dra": {"enabled": "yes"}}, KUBE, "enabled"),
        ({"dra": {"deviceclasses": {}}}, KUBE, "deviceclasses"),
        (_dra(models=[""]), KUBE, "models"),
        (_dra(models=["L4", "L4"]), KUBE, "models"),
        (_dra(perModel=True, models="L4"), KUBE, "models"),
    ],
    ids=[
        "no-slug",
        "enabled-not-bool",
        "unknown-key",
        "empty-model",
        "repeated-model",
        "models-not-list",
    ],
)
def test_bad_dra_values_are_refused(values: dict[str, Any], kube: str, message: str) -> None:
    assert message in rendering.render_error(values, kube_version=kube)
