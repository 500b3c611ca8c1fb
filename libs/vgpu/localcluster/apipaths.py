"""The API server's URL grammar and error bodies: which resource a path names (``parse_path``:
core ``/api/v1/...`` and group ``/apis/<group>/<version>/...`` paths, namespaced or not, with a
name and a subresource), its boolean query flags, and the ``metav1.Status`` failure object every error
is sent as."""

from __future__ import annotations

from dataclasses import dataclass

from vgpu.kube.port import JsonObj
from vgpu.localcluster.kinds import KINDS, KindInfo

REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    500: "InternalError",
}


def status_body(code: int, message: str, *, reason: str = "", name: str = "", kind: str = "") -> JsonObj:
    """A metav1.Status failure object, as the API server sends it."""
    body: JsonObj = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason or REASONS.get(code, ""),
        "code": code,
    }
    if name or kind:
        body["details"] = {"name": name, "kind": kind}
    return body


@dataclass(frozen=True)
class Target:
    """What a resource path names."""

    info: KindInfo
    namespace: str | None
    name: str | None
    subresource: str | None


def parse_path(path: str) -> Target | None:
    """Map a resource URL path to a ``Target``; None when it names nothing we serve."""
    parts = [p for p in path.split("/") if p]
    if parts[:2] == ["api", "v1"]:
        group_version, rest = "v1", parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        group_version, rest = f"{parts[1]}/{parts[2]}", parts[3:]
    else:
        return None
    namespace = None
    if len(rest) >= 3 and rest[0] == "namespaces" and (rest[2] in KINDS or rest[2] == "bindings"):
        namespace, rest = rest[1], rest[2:]
    if not rest or len(rest) > 3:
        return None
    if rest[0] == "bindings" and namespace is not None and len(rest) == 1 and group_version == "v1":
        return Target(KINDS["pods"], namespace, None, "bindings")
    info = KINDS.get(rest[0])
    if info is None or info.api_version != group_version:
        return None
    if namespace is not None and not info.namespaced:
        return None
    if namespace is None and info.namespaced and len(rest) != 1:
        return None
    name = rest[1] if len(rest) >= 2 else None
    sub = rest[2] if len(rest) == 3 else None
    return Target(info, namespace, name, sub)


def query_flag(value: str | None) -> bool:
    """A boolean query parameter (``?watch=true``, ``?allowWatchBookmarks=1``): "true" or "1"."""
    return value is not None and value.lower() in ("true", "1")
