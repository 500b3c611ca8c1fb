"""Who may change a GPU decision after creation: the UPDATE guard, as one pure function (issue 13).

The scheduler and the device plugin talk through annotations (docs/protocol.md#pod-annotations). On a pod they are
``vgpu-node`` (annotation and label), ``vgpu-time``, ``vgpu-devices-to-allocate`` (the device
plugin trusts it at Allocate), ``vgpu-devices-allocated`` (the scheduler rebuilds usage from it),
``bind-phase`` and ``bind-time``; on a node, ``node-nvidia-register``, ``node-nvidia-plugin-error``
and the node lock ``mutex.lock``. A user who may patch pods (or nodes) could rewrite them and get a
bigger share, another GPU, or make the scheduler overcommit. ``admission.decide`` refuses them on
CREATE; this module refuses any *change* to them on UPDATE unless the requester is trusted:

    decide(resource, obj=new, old=old, user_info=request.userInfo, keys=..., trusted=...)

A change is an owned key added, removed or given another value. Trusted requesters are the
usernames in ``trusted.users`` (the scheduler's ``system:serviceaccount:<ns>:<sa>``, set by the
chart) or members of a group in ``trusted.groups`` (e.g. a break-glass admin group). Everything else
a user does to their pod or node (their own annotations and labels, any other field) is allowed.

The usernames in ``trusted.node_bound`` (the device plugin's service account, one per GPU node) are
trusted for their own node only, where the API server says which node that is: a service-account
token bound to a pod carries its node's name in ``userInfo.extra["authentication.kubernetes.io/
node-name"]`` (Kubernetes 1.30+, feature ServiceAccountTokenPodNodeInfo). Then such a requester may
change owned keys only on pods whose ``spec.nodeName`` (of ``oldObject``) is that node and on the
Node of that name, so one compromised GPU node cannot forge decisions elsewhere. Without the extra
(older clusters, a token not bound to a pod) it is trusted everywhere, as before.

The cheap path comes first: an update that changes no owned key is allowed without looking at who
asks, so kubelets and controllers pay two map lookups per key. Garbage (objects that are not
objects, maps of non-strings, a missing ``oldObject``, an unreadable ``userInfo`` when it matters)
is refused with 400 naming the field.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from vgpu.core import admission
from vgpu.core.annotations import Keys
from vgpu.core.config import WebhookConfig

Resource = Literal["pods", "nodes"]
ABSENT = object()
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"


@dataclass(frozen=True)
class Trusted:
    """The identities that may change owned keys."""

    users: frozenset[str] = frozenset()
    groups: frozenset[str] = frozenset()
    node_bound: frozenset[str] = frozenset()  # trusted on their token's node only (see the docstring)

    @classmethod
    def from_config(cls, webhook: WebhookConfig) -> Trusted:
        return cls(
            frozenset(webhook.trusted_users),
            frozenset(webhook.trusted_groups),
            frozenset(webhook.node_bound_users),
        )

    def describe(self) -> str:
        parts = []
        if self.users:
            parts.append("users " + ", ".join(sorted(self.users)))
        if self.node_bound:
            parts.append("on their own node " + ", ".join(sorted(self.node_bound)))
        if self.groups:
            parts.append("groups " + ", ".join(sorted(self.groups)))
        return "; ".join(parts) or "nobody is configured (webhook.trustedUsers, webhook.trustedGroups)"


def owned_annotations(resource: Resource, keys: Keys) -> tuple[str, ...]:
    """The annotation keys only trusted identities may change on ``resource``."""
    if resource == "pods":
        return keys.internal_pod_keys()
    return (keys.node_register, keys.node_plugin_error, keys.node_outside_usage, keys.node_lock)


def owned_labels(resource: Resource, keys: Keys) -> tuple[str, ...]:
    """The label keys only trusted identities may change on ``resource``."""
    return (keys.assigned_node,) if resource == "pods" else ()


def _metadata_map(obj: Any, field: str, where: str) -> tuple[Mapping[str, str] | None, str | None]:
    """(the map, None) or (None, why it is garbage, naming the field)."""
    if not isinstance(obj, Mapping):
        return None, f"{where}: expected an object"
    meta = obj.get("metadata")
    if meta is None:
        return {}, None
    if not isinstance(meta, Mapping):
        return None, f"{where}.metadata: expected an object"
    value = meta.get(field)
    if value is None:
        return {}, None
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        return None, f"{where}.metadata.{field}: expected a map of strings"
    return value, None


def _changed(new: Mapping[str, str], old: Mapping[str, str], owned: Iterable[str]) -> list[str]:
    return [k for k in owned if new.get(k, ABSENT) != old.get(k, ABSENT)]


def changed_keys(resource: Resource, *, obj: Any, old: Any, keys: Keys) -> tuple[list[str], list[str]] | str:
    """(changed owned annotations, changed owned labels), or why the objects cannot be read."""
    out: list[list[str]] = []
    for field, owned in (
        ("annotations", owned_annotations(resource, keys)),
        ("labels", owned_labels(resource, keys)),
    ):
        if not owned:
            out.append([])
            continue
        new_map, problem = _metadata_map(obj, field, "request.object")
        if problem:
            return problem
        old_map, problem = _metadata_map(old, field, "request.oldObject")
        if problem:
            return problem
        assert new_map is not None and old_map is not None
        out.append(_changed(new_map, old_map, owned))
    return out[0], out[1]


def _identity(user_info: Any) -> tuple[str, tuple[str, ...]] | str:
    """(username, groups) from request.userInfo, or why it cannot be read."""
    if not isinstance(user_info, Mapping):
        return "request.userInfo: expected an object naming who asks"
    username = user_info.get("username")
    if not isinstance(username, str) or not username:
        return "request.userInfo.username: expected a non-empty string"
    groups = user_info.get("groups")
    if groups is None:
        groups = []
    if not isinstance(groups, list) or not all(isinstance(g, str) for g in groups):
        return "request.userInfo.groups: expected a list of strings"
    return username, tuple(groups)


def token_nodes(user_info: Mapping[str, Any]) -> tuple[str, ...] | str | None:
    """The node names the API server put in ``userInfo.extra`` (``NODE_NAME_EXTRA``); None when it
    put none (before 1.30, a token not bound to a pod); a string saying why it cannot be read."""
    extra = user_info.get("extra")
    if extra is None:
        return None
    if not isinstance(extra, Mapping):
        return "request.userInfo.extra: expected a map of string lists"
    values = extra.get(NODE_NAME_EXTRA)
    if values is None:
        return None
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        return f"request.userInfo.extra[{NODE_NAME_EXTRA}]: expected a list of strings"
    return tuple(values)


def object_node(resource: Resource, old: Any) -> str | None:
    """The node ``old`` is on: a pod's ``spec.nodeName``, a node's own name; None when unbound."""
    if not isinstance(old, Mapping):
        return None
    section = old.get("spec") if resource == "pods" else old.get("metadata")
    if not isinstance(section, Mapping):
        return None
    node = section.get("nodeName" if resource == "pods" else "name")
    return node if isinstance(node, str) and node else None


def _what(resource: Resource, obj: Any) -> str:
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    meta = meta if isinstance(meta, Mapping) else {}
    name = meta.get("name") or "?"
    if resource == "pods":
        return f"pod {meta.get('namespace') or '?'}/{name}"
    return f"node {name}"


def decide(
    resource: Resource, *, obj: Any, old: Any, user_info: Any, keys: Keys, trusted: Trusted
) -> admission.Decision:
    """Allow an UPDATE of ``resource`` unless it changes an owned key and the requester is not
    trusted (403 naming the keys and who may change them); 400 for garbage (see the docstring)."""
    if old is None:
        return admission.Decision(
            allowed=False, message="request.oldObject: required for UPDATE", code=400, reason="BadRequest"
        )
    found = changed_keys(resource, obj=obj, old=old, keys=keys)
    if isinstance(found, str):
        return admission.Decision(allowed=False, message=found, code=400, reason="BadRequest")
    annotations, labels = found
    if not annotations and not labels:
        return admission.Decision(allowed=True)
    who = _identity(user_info)
    if isinstance(who, str):
        return admission.Decision(allowed=False, message=who, code=400, reason="BadRequest")
    username, groups = who
    if username in trusted.node_bound:
        assert isinstance(user_info, Mapping)
        nodes = token_nodes(user_info)
        if isinstance(nodes, str):
            return admission.Decision(allowed=False, message=nodes, code=400, reason="BadRequest")
        if nodes is None or object_node(resource, old) in nodes:
            return admission.Decision(allowed=True)
    elif username in trusted.users or trusted.groups.intersection(groups):
        return admission.Decision(allowed=True)
    changed = [f"annotation {k}" for k in annotations] + [f"label {k}" for k in labels]
    return admission.Decision(
        allowed=False,
        code=403,
        reason="Forbidden",
        message=(
            f"{_what(resource, obj)}: {', '.join(changed)} "
            f"{'is' if len(changed) == 1 else 'are'} written by the GPU scheduler and device plugin "
            f"only; {username} may not change {'it' if len(changed) == 1 else 'them'} "
            f"(allowed: {trusted.describe()})"
        ),
    )
