"""What the local store accepts as an object body, with the errors kube-apiserver answers.

- the body is a JSON object whose ``kind``/``apiVersion``, when given, are the resource's; they
  are filled in. ``metadata`` is an object; its ``namespace`` matches the request's (it is set on
  namespaced kinds, dropped on the others); ``labels`` and ``annotations`` map strings to strings;
  ``spec`` and ``status`` are objects. A bad request is a 400 ``BadRequest``, an invalid field a 422
  ``Invalid``;
- a name is a lowercase RFC 1123 subdomain of at most 253 characters;
- a pod has a non-empty list of named containers, and its ``spec.nodeName`` never changes once set.
"""

from __future__ import annotations

import re
from typing import Any

from vgpu.core import errors
from vgpu.kube.port import JsonObj
from vgpu.localcluster.kinds import KindInfo

_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


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


def check_name(info: KindInfo, name: Any) -> str:
    """``name`` when it is a valid object name, else 422."""
    if not isinstance(name, str) or not name:
        raise invalid(f"{info.kind}.metadata.name: Required value: name or generateName is required")
    if len(name) > 253 or not _NAME_RE.match(name):
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
