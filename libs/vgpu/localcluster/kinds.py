"""The resource kinds the local API server serves, and what it needs to know about each."""

from __future__ import annotations

from collections.abc import Iterable
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
            "poddisruptionbudgets", "PodDisruptionBudget", "policy/v1", namespaced=True, has_status=True
        ),
        KindInfo(
            "priorityclasses", "PriorityClass", "scheduling.k8s.io/v1", namespaced=False, has_status=False
        ),
        # Dynamic Resource Allocation (resource.k8s.io/v1): see dravalidation
        KindInfo("deviceclasses", "DeviceClass", "resource.k8s.io/v1", namespaced=False, has_status=False),
        KindInfo("resourceslices", "ResourceSlice", "resource.k8s.io/v1", namespaced=False, has_status=False),
        KindInfo("resourceclaims", "ResourceClaim", "resource.k8s.io/v1", namespaced=True, has_status=True),
        KindInfo(
            "resourceclaimtemplates",
            "ResourceClaimTemplate",
            "resource.k8s.io/v1",
            namespaced=True,
            has_status=False,
        ),
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
    """The scheme defaults our code relies on (applied before admission, as upstream does): the
    scheduler name, the restart policy, and each container's requests defaulted from its limits
    (``SetDefaults_Pod``: a limit without a request of the same resource is also the request)."""
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("restartPolicy", "Always")
    for group in ("initContainers", "containers"):
        for container in spec.get(group) or ():
            resources = container.get("resources") if isinstance(container, dict) else None
            if not isinstance(resources, dict):
                continue
            limits = resources.get("limits")
            if not isinstance(limits, dict) or not limits:
                continue
            requests = resources.get("requests")
            if not isinstance(requests, dict):
                requests = resources["requests"] = {}
            for name, value in limits.items():
                requests.setdefault(name, value)


def resolve_priority(spec: JsonObj, classes: Iterable[JsonObj], *, pod: str) -> None:
    """The Priority admission plugin on a pod being created: ``spec.priority`` and
    ``spec.preemptionPolicy`` from its ``priorityClassName`` (Forbidden when no such PriorityClass),
    or from the ``globalDefault`` class. More lenient than upstream: with neither, a ``priority``
    already in the spec is kept (tests set it directly), else 0."""
    name = spec.get("priorityClassName")
    chosen: JsonObj | None = None
    if name:
        chosen = next((c for c in classes if (c.get("metadata") or {}).get("name") == name), None)
        if chosen is None:
            raise errors.KubeError(
                f'pods "{pod}" is forbidden: no PriorityClass with name {name} was found',
                status=403,
                reason="Forbidden",
            )
    else:
        chosen = next((c for c in classes if c.get("globalDefault") is True), None)
    if chosen is None:
        spec.setdefault("priority", 0)
        spec.setdefault("preemptionPolicy", "PreemptLowerPriority")
        return
    value = chosen.get("value", 0)
    spec["priority"] = value if isinstance(value, int) else 0
    spec["preemptionPolicy"] = chosen.get("preemptionPolicy") or "PreemptLowerPriority"


def kind_info(kind: str) -> KindInfo:
    """The ``KindInfo`` of a plural kind name; NotFound for one the store does not serve."""
    info = KINDS.get(kind)
    if info is None:
        raise errors.NotFound(f"the server could not find the requested resource ({kind})", status=404)
    return info
