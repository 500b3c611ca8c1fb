"""vgpu.core.dra.deviceclass: the DeviceClasses' names and CEL selectors (the chart renders the
same objects: tests/deploy/test_dra_chart.py; kube-apiserver compiles the CEL:
tests/realk8s/test_dra_schema.py)."""

from __future__ import annotations

import json

import pytest
from vgpu.core.dra import deviceclass, names


def test_the_general_class_selects_the_driver_and_leaves_mig_out() -> None:
    assert deviceclass.device_class() == {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": "gpu.kube-vgpu.io"},
        "spec": {
            "selectors": [
                {
                    "cel": {
                        "expression": 'device.driver == "gpu.kube-vgpu.io" && '
                        'device.attributes["gpu.kube-vgpu.io"].migEnabled == false'
                    }
                }
            ]
        },
    }


@pytest.mark.parametrize(
    ("model", "name"),
    [
        ("NVIDIA A100-SXM4-40GB", "nvidia-a100-sxm4-40gb.gpu.kube-vgpu.io"),
        ("Tesla T4", "tesla-t4.gpu.kube-vgpu.io"),
        ("  --H100 (80GB) ", "h100-80gb.gpu.kube-vgpu.io"),
        ("x" * 62 + "-y" * 5, "x" * 62 + ".gpu.kube-vgpu.io"),  # cut to 63, trailing dash dropped
    ],
)
def test_per_model_names_are_dns_labels_under_the_driver(model: str, name: str) -> None:
    assert deviceclass.class_name(model) == name
    slug = name.removesuffix("." + names.DEVICE_CLASS)
    assert 0 < len(slug) <= 63 and slug[0] != "-" and slug[-1] != "-"


@pytest.mark.parametrize("model", ["", "---", "ÜÖ", "()"])
def test_a_model_without_a_usable_name_is_refused(model: str) -> None:
    with pytest.raises(ValueError, match="gives no DeviceClass name"):
        deviceclass.class_name(model)


def test_the_model_is_a_cel_string_literal_whatever_it_holds() -> None:
    expr = deviceclass.selector_expression('a "b" \\ <&> é\u2028')
    literal = expr.rsplit(" == ", 1)[1]
    assert json.loads(literal) == 'a "b" \\ <&> é\u2028'  # JSON string escapes are CEL's
    assert "<" not in literal and "&" not in literal  # written as Helm's toJson writes them


def test_per_model_classes_follow_the_general_one_once_each() -> None:
    classes = deviceclass.device_classes(models=["Tesla T4", "tesla t4", "L4"], per_model=True)
    assert [c["metadata"]["name"] for c in classes] == [
        "gpu.kube-vgpu.io",
        "tesla-t4.gpu.kube-vgpu.io",
        "l4.gpu.kube-vgpu.io",
    ]
    assert deviceclass.device_classes(models=["L4"]) == [deviceclass.device_class()]


def test_the_classes_validate_against_the_1_36_openapi_schema() -> None:
    kv = pytest.importorskip("kubernetes_validate")
    for body in deviceclass.device_classes(models=["Tesla T4"], per_model=True):
        kv.validate(body, "1.36.0", strict=True)
