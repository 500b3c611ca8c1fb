"""The ``pods/binding`` subresource: what binding a pod to a node does to the stored pod.

As kube-apiserver's ``BindingREST`` (``setPodHostAndAnnotations``): the Binding's uid and
resourceVersion are preconditions; a pod being deleted or already assigned is a Conflict; otherwise
``spec.nodeName`` is set, the Binding's ``metadata.annotations`` are merged into the pod's and the
``PodScheduled`` condition becomes True, in one write.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping

from vgpu.core import errors
from vgpu.kube.port import JsonObj
from vgpu.localcluster import validation
from vgpu.localcluster.patch import clone


def bound_pod(
    current: JsonObj,
    *,
    node: str,
    uid: str | None,
    resource_version: str | None,
    annotations: Mapping[str, str] | None,
    now: datetime.datetime,
) -> JsonObj:
    """A copy of the stored pod ``current`` bound to ``node`` at ``now`` (its resourceVersion not
    yet advanced), or the Conflict/Invalid error the binding is refused with."""
    name = current["metadata"]["name"]
    if not node:
        raise validation.invalid("Binding.target.name: Required value")
    for what, want, have in (
        ("UID", uid, current["metadata"]["uid"]),
        ("ResourceVersion", resource_version, current["metadata"]["resourceVersion"]),
    ):
        if want and want != have:
            raise errors.Conflict(
                f'Operation cannot be fulfilled on pods/binding "{name}": Precondition failed: '
                f"{what} in precondition: {want}, {what} in object meta: {have}",
                status=409,
                reason="Conflict",
            )
    if current["metadata"].get("deletionTimestamp"):
        raise errors.Conflict(
            f'Operation cannot be fulfilled on pods/binding "{name}": pod {name} is being deleted, '
            "cannot be assigned to a host",
            status=409,
            reason="Conflict",
        )
    spec = current.get("spec") or {}
    if spec.get("nodeName"):
        raise errors.Conflict(
            f'Operation cannot be fulfilled on pods/binding "{name}": pod {name} is already '
            f'assigned to node "{spec["nodeName"]}"',
            status=409,
            reason="Conflict",
        )
    for key, value in (annotations or {}).items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise validation.invalid(f"Binding.metadata.annotations[{key!r}]: must be a string")
    result = clone(current)
    result.setdefault("spec", {})["nodeName"] = node
    if annotations:
        result["metadata"]["annotations"] = {
            **(result["metadata"].get("annotations") or {}),
            **annotations,
        }
    status = result.setdefault("status", {})
    conditions = [c for c in status.get("conditions") or [] if c.get("type") != "PodScheduled"]
    conditions.append(
        {
            "type": "PodScheduled",
            "status": "True",
            "lastProbeTime": None,
            "lastTransitionTime": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
    )
    status["conditions"] = conditions
    return result
