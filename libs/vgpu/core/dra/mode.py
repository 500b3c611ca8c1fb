"""Which mode admits a pod: the extender's (``nvidia.com/*`` limits, placed by our extender) or
DRA's (claims, placed by kube-scheduler's DRA plugin) (pure).

The pod's annotation ``kube-vgpu.io/mode`` wins, then its namespace's label of the same name, then
the webhook's configured default (``webhook.defaultMode``, the chart's ``dra.defaultMode``). A
value other than ``dra`` or ``extender`` is an error naming where it was written: a typo must not
silently pick the other mode.
"""

from __future__ import annotations

from collections.abc import Mapping

from vgpu.core import errors
from vgpu.core.config import AdmissionMode
from vgpu.core.dra import names


def parse(raw: str, *, field: str) -> AdmissionMode:
    try:
        return AdmissionMode(raw.strip().lower())
    except ValueError:
        raise errors.RequestError(field, f"unknown mode {raw[:63]!r}: expected dra or extender") from None


def choose(
    pod_annotations: Mapping[str, str], namespace_labels: Mapping[str, str] | None, *, default: AdmissionMode
) -> AdmissionMode:
    """The pod's mode (see the module docstring); raises ``errors.RequestError`` for a bad value."""
    raw = pod_annotations.get(names.MODE_ANNOTATION)
    if raw is not None:
        return parse(raw, field=f"annotation {names.MODE_ANNOTATION}")
    raw = (namespace_labels or {}).get(names.MODE_ANNOTATION)
    if raw is not None:
        return parse(raw, field=f"namespace label {names.MODE_ANNOTATION}")
    return default
