"""What the local store accepts as an object body, with the errors kube-apiserver answers.

- the body is a JSON object whose ``kind``/``apiVersion``, when given, are the resource's; they
  are filled in. ``metadata`` is an object; its ``namespace`` matches the request's (it is set on
  namespaced kinds, dropped on the others); ``labels`` and ``annotations`` map strings to strings;
  ``spec`` and ``status`` are objects. A bad request is a 400 ``BadRequest``, an invalid field a 422
  ``Invalid``;
- a name is a lowercase RFC 1123 subdomain of at most 253 characters;
- a pod has a non-empty list of named containers, and its ``spec.nodeName`` never changes once set;
- a ``MicroTime`` (a Lease's ``acquireTime``/``renewTime``, an Event's ``eventTime``) is RFC 3339
  with exactly six fractional digits, as Go decodes it (``micro_times``): stored in UTC with ``Z``,
  any other form refused as a body that does not decode (400).
"""

from __future__ import annotations

import datetime
import re
from typing import Any

from vgpu.core import errors
from vgpu.core.names import is_dns_subdomain
from vgpu.kube.port import JsonObj
from vgpu.localcluster.kinds import KindInfo

# metav1.MicroTime's wire form (Go's layout "2006-01-02T15:04:05.000000Z07:00"): six digits, always
_MICRO_TIME_RE = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}(Z|[+-]\d{2}:\d{2})$")
# kind -> (section, field) of each MicroTime ("" for a top-level field)
_MICRO_TIMES: dict[str, tuple[tuple[str, str], ...]] = {
    "leases": (("spec", "acquireTime"), ("spec", "renewTime")),
    "events": (("", "eventTime"),),
}


def invalid(message: str) -> errors.KubeError:
    """A 422 ``Invalid``: a field's value is not allowed."""
    return errors.KubeError(message, status=422, reason="Invalid")


def bad_request(message: str) -> errors.KubeError:
    """A 400 ``BadRequest``: the request itself is malformed."""
    return errors.KubeError(message, status=400, reason="BadRequest")


def validate(info: KindInfo, body: Any, namespace: str | None) -> JsonObj:
    """``body`` checked and completed in place (kind, apiVersion, metadata, namespace), returned."""
    if not isinstance(body, dict):
        raise bad_request(f"{info.kind} body must be a JSON object")
    if body.get("kind") not in (None, "", info.kind):
        raise bad_request(f"the kind of the object ({body.get('kind')}) is not {info.kind}")
    if body.get("apiVersion") not in (None, "", info.api_version):
        raise bad_request(
            f"the apiVersion of the object ({body.get('apiVersion')}) is not {info.api_version}"
        )
    meta = body.get("metadata")
    if meta is None:
        meta = body["metadata"] = {}
    if not isinstance(meta, dict):
        raise invalid(f"{info.kind}.metadata: must be an object")
    body_ns = meta.get("namespace")
    if info.namespaced:
        if body_ns not in (None, "", namespace):
            raise bad_request(
                "the namespace of the provided object does not match the namespace sent on the request"
            )
        meta["namespace"] = namespace
    else:
        meta.pop("namespace", None)
    for field in ("labels", "annotations"):
        value = meta.get(field)
        if value is None:
            continue
        if not isinstance(value, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()
        ):
            raise invalid(f"metadata.{field}: Invalid value: must be a map of string to string")
    if field_set := [f for f in ("spec", "status") if f in body and not isinstance(body[f], dict | None)]:
        raise invalid(f"{info.kind}.{field_set[0]}: must be an object")
    body["kind"] = info.kind
    body["apiVersion"] = info.api_version
    return body


def micro_times(info: KindInfo, body: JsonObj) -> JsonObj:
    """``body`` with its MicroTimes in the form kube-apiserver stores (UTC, ``Z``, six digits), in
    place; one that Go would not decode is a 400, as kube-apiserver answers a create or update."""
    for section, field in _MICRO_TIMES.get(info.plural, ()):
        holder = body.get(section) if section else body
        if not isinstance(holder, dict) or holder.get(field) is None:
            continue
        raw = holder[field]
        where = f"{section}.{field}" if section else field
        if not isinstance(raw, str) or not _MICRO_TIME_RE.match(raw):
            raise bad_request(
                f'{info.kind} in version "{info.api_version.rpartition("/")[2]}" cannot be handled as a '
                f'{info.kind}: {where}: parsing time {raw!r} as "2006-01-02T15:04:05.000000Z07:00"'
            )
        when = datetime.datetime.fromisoformat(raw.replace("Z", "+00:00"))
        holder[field] = when.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return body


def check_name(info: KindInfo, name: Any) -> str:
    """``name`` when it is a valid object name, else 422."""
    if not isinstance(name, str) or not name:
        raise invalid(f"{info.kind}.metadata.name: Required value: name or generateName is required")
    if not is_dns_subdomain(name):
        raise invalid(
            f'{info.kind} "{name}" is invalid: metadata.name: Invalid value: "{name}": a lowercase '
            "RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.'"
        )
    return name


def check_pod_containers(name: str, spec: JsonObj) -> None:
    """A new pod's ``spec.containers``: a non-empty list of containers, each with a name."""
    containers = spec.get("containers")
    if not isinstance(containers, list) or not containers:
        raise invalid(f'Pod "{name}" is invalid: spec.containers: Required value')
    for i, c in enumerate(containers):
        if not isinstance(c, dict) or not isinstance(c.get("name"), str) or not c["name"]:
            raise invalid(f'Pod "{name}" is invalid: spec.containers[{i}].name: Required value')


def check_pod_update(current: JsonObj, new: JsonObj) -> None:
    """An update of a pod keeps the ``spec.nodeName`` it has been bound to."""
    old_node = (current.get("spec") or {}).get("nodeName")
    new_node = (new.get("spec") or {}).get("nodeName")
    if old_node and new_node != old_node:
        raise invalid(f'Pod "{current["metadata"]["name"]}" is invalid: spec.nodeName: field is immutable')
