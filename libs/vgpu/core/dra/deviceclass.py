"""The DeviceClasses the chart installs for kube-vgpu's DRA mode (``resource.k8s.io/v1``).

:data:`names.DEVICE_CLASS` (``gpu.kube-vgpu.io``) selects every shared GPU of :data:`names.DRIVER`;
with ``perModel`` the chart adds one class per listed model, ``<model slug>.gpu.kube-vgpu.io``,
that also matches the ``model`` attribute. Both leave out GPUs with MIG enabled (published but not
shared: see :mod:`slices`). Selectors are CEL; the driver test comes first, so a device of another
driver is false before its (absent) attributes are read, and only ``==`` joined by ``&&`` is used
(``migEnabled == false``, not ``!migEnabled``): the subset the local cluster evaluates. The chart's
``templates/deviceclass.yaml`` renders the same objects (a test holds them equal).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any, Final

from vgpu.core.dra import names

JsonObj = dict[str, Any]

API_VERSION: Final = "resource.k8s.io/v1"
KIND: Final = "DeviceClass"
LABEL_MAX: Final = 63

_NOT_LABEL = re.compile(r"[^a-z0-9-]+")


_GO_JSON_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def cel_string(text: str) -> str:
    """``text`` as a CEL string literal: JSON (its escapes are CEL's), written as Go's encoder
    (Helm's ``toJson``) writes it, so the chart renders the very same expression."""
    out = json.dumps(text, ensure_ascii=False)
    for char, escape in _GO_JSON_ESCAPES.items():
        out = out.replace(char, escape)
    return out


def selector_expression(model: str | None = None) -> str:
    """The CEL expression of the class for ``model`` (None: every model)."""
    attrs = f"device.attributes[{cel_string(names.DRIVER)}]"
    expr = f"device.driver == {cel_string(names.DRIVER)} && {attrs}.{names.ATTR_MIG} == false"
    if model is not None:
        expr += f" && {attrs}.{names.ATTR_MODEL} == {cel_string(model)}"
    return expr


def model_slug(model: str) -> str:
    """``model`` as a DNS label: lower case, each run of other characters one ``-``, at most 63
    characters (``NVIDIA A100-SXM4-40GB`` -> ``nvidia-a100-sxm4-40gb``); empty when nothing is left."""
    return _NOT_LABEL.sub("-", model.lower()).strip("-")[:LABEL_MAX].strip("-")


def class_name(model: str | None = None) -> str:
    """The class's name: :data:`names.DEVICE_CLASS`, or ``<slug>.gpu.kube-vgpu.io`` for ``model``."""
    if model is None:
        return names.DEVICE_CLASS
    slug = model_slug(model)
    if not slug:
        raise ValueError(f"model {model!r} gives no DeviceClass name")
    return f"{slug}.{names.DEVICE_CLASS}"


def device_class(model: str | None = None) -> JsonObj:
    """The DeviceClass for ``model`` (None: the class of every model)."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": class_name(model)},
        "spec": {"selectors": [{"cel": {"expression": selector_expression(model)}}]},
    }


def device_classes(*, models: Iterable[str] = (), per_model: bool = False) -> list[JsonObj]:
    """The classes to install: the general one, then with ``per_model`` one per distinct model
    (in the order given; one whose name repeats an earlier one's is left out)."""
    out = [device_class()]
    if per_model:
        seen = {names.DEVICE_CLASS}
        for model in models:
            name = class_name(model)
            if name not in seen:
                seen.add(name)
                out.append(device_class(model))
    return out
