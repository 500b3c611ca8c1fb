"""The resource kinds the local API server serves, and what it needs to know about each."""

from __future__ import annotations

from dataclasses import dataclass

from vgpu.core import errors
from vgpu.kube.port import JsonObj


@dataclass(frozen=True)
class KindInfo:
    """What the store needs to know about one resource kind."""

    plural: str
    kind: str
    api_version: str
    namespaced: bool
    has_status: bool


KINDS: dict[str, KindInfo] = {
    k.plural: k
    for k in (
        KindInfo("nodes", "Node", "v1", namespaced=False, has_status=True),
        KindInfo("pods", "Pod", "v1", namespaced=True, has_status=True),
        KindInfo("events", "Event", "v1", namespaced=True, has_status=False),
        KindInfo("resourcequotas", "ResourceQuota", "v1", namespaced=True, has_status=True),
        KindInfo("namespaces", "Namespace", "v1", namespaced=False, has_status=True),
        KindInfo("leases", "Lease", "coordination.k8s.io/v1", namespaced=True, has_status=False),
        KindInfo(
            "mutatingwebhookconfigurations",
            "MutatingWebhookConfiguration",
            "admissionregistration.k8s.io/v1",
            namespaced=False,
            has_status=False,
        ),
        KindInfo(
            "validatingwebhookconfigurations",
            "ValidatingWebhookConfiguration",
            "admissionregistration.k8s.io/v1",
            namespaced=False,
            has_status=False,
        ),
    )
}


def default_pod_spec(spec: JsonObj) -> None:
    """The scheme defaults our code relies on (applied before admission, as upstream does)."""
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("restartPolicy", "Always")


def kind_info(kind: str) -> KindInfo:
    """The ``KindInfo`` of a plural kind name; NotFound for one the store does not serve."""
    info = KINDS.get(kind)
    if info is None:
        raise errors.NotFound(f"the server could not find the requested resource ({kind})", status=404)
    return info
