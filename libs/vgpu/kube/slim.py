"""What the scheduler keeps of Pods and Nodes: client-go's informer transform, for memory.

A real pod carries managedFields, the last-applied configuration, env, volumes, probes and a long
status; a real node its image list. The scheduler caches every pod and node of the cluster, and none
of that decides where a GPU slice goes. These functions keep the fields our code reads (identity,
labels, annotations, the containers' names and resources, init containers' restart policy (a
sidecar's is ``Always``), the node name, the phase, init container exit codes, node allocatable and
capacity; for preemption the priority, its class and preemption policy, the nominated node and the start time; for the retries after
a start, an unbound pod's ``PodScheduled=False`` condition, its message left out but for a DRA
pod's, whose ``resourceClaimStatuses`` are kept too: the views list it as waiting with that message,
``vgpu.core.dra.waiting``) and drop the rest before the object is cached.
"""

from typing import Any

from vgpu.kube.port import JsonObj

LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
_META_KEYS = (
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "labels",
    "creationTimestamp",
    "deletionTimestamp",
)

_CONTAINER_KEYS = ("name", "resources")
_INIT_CONTAINER_KEYS = ("name", "resources", "restartPolicy")


def _pick(obj: Any, keys: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(obj, dict):
        return {}
    return {k: obj[k] for k in keys if k in obj}


def _metadata(obj: JsonObj) -> dict[str, Any]:
    meta = obj.get("metadata")
    out = _pick(meta, _META_KEYS)
    annotations = meta.get("annotations") if isinstance(meta, dict) else None
    if isinstance(annotations, dict):
        out["annotations"] = {k: v for k, v in annotations.items() if k != LAST_APPLIED}
    return out


def _containers(raw: Any, keys: tuple[str, ...]) -> Any:
    if not isinstance(raw, list):
        return raw  # garbage stays garbage: the readers report it
    return [_pick(c, keys) if isinstance(c, dict) else c for c in raw]


def pod_for_scheduling(pod: JsonObj) -> JsonObj:
    """The pod as the scheduler's state, binder and metrics read it."""
    out: JsonObj = _pick(pod, ("apiVersion", "kind"))
    out["metadata"] = _metadata(pod)
    spec = pod.get("spec")
    if isinstance(spec, dict):
        slim_spec = _pick(
            spec,
            # resourceClaims: a DRA pod's claims, which the namespace quota counts (draquota.py)
            (
                "nodeName",
                "schedulerName",
                "priority",
                "priorityClassName",
                "preemptionPolicy",
                "resourceClaims",
            ),
        )
        # an init container's restartPolicy says whether it is a sidecar (it runs on beside the app)
        for key, kept in (("containers", _CONTAINER_KEYS), ("initContainers", _INIT_CONTAINER_KEYS)):
            if key in spec:
                slim_spec[key] = _containers(spec[key], kept)
        out["spec"] = slim_spec
    status = pod.get("status")
    if isinstance(status, dict):
        slim_status = _pick(status, ("phase", "nominatedNodeName", "startTime"))
        inits = status.get("initContainerStatuses")
        if isinstance(inits, list):
            slim_status["initContainerStatuses"] = [
                {"name": s.get("name"), "state": {"terminated": s["state"]["terminated"]}}
                if isinstance(s, dict)
                and isinstance(s.get("state"), dict)
                and isinstance(s["state"].get("terminated"), dict)
                else _pick(s, ("name",))
                for s in inits
            ]
        bound = isinstance(spec, dict) and bool(spec.get("nodeName"))
        dra = (
            isinstance(spec, dict)
            and isinstance(spec.get("resourceClaims"), list)
            and bool(spec["resourceClaims"])
        )
        scheduled = _not_scheduled(status.get("conditions"), message=dra)
        if scheduled is not None and not bound:
            slim_status["conditions"] = [scheduled]
        if dra and not bound and "resourceClaimStatuses" in status:
            slim_status["resourceClaimStatuses"] = status["resourceClaimStatuses"]
        out["status"] = slim_status
    return out


MAX_MESSAGE_CHARS = 1024  # of a DRA pod's PodScheduled=False message


def _not_scheduled(conditions: Any, *, message: bool) -> dict[str, Any] | None:
    """The ``PodScheduled=False`` condition kube-scheduler sets on a pod it could not place; its
    message (which lists every node's reason) only with ``message`` (a DRA pod: the views show it
    as why the pod waits, nothing else says), cut to ``MAX_MESSAGE_CHARS``."""
    if not isinstance(conditions, list):
        return None
    for c in conditions:
        if isinstance(c, dict) and c.get("type") == "PodScheduled" and c.get("status") == "False":
            kept = _pick(c, ("type", "status", "reason"))
            text = c.get("message")
            if message and isinstance(text, str):
                kept["message"] = text[:MAX_MESSAGE_CHARS]
            return kept
    return None


def node_for_scheduling(node: JsonObj) -> JsonObj:
    """The node as the scheduler's state reads it (annotations, labels, allocatable/capacity)."""
    out: JsonObj = _pick(node, ("apiVersion", "kind"))
    out["metadata"] = _metadata(node)
    if isinstance(node.get("spec"), dict):
        out["spec"] = _pick(node["spec"], ("unschedulable",))
    if isinstance(node.get("status"), dict):
        out["status"] = _pick(node["status"], ("allocatable", "capacity"))
    return out


def _request_asks(request: Any) -> Any:
    """One spec request cut to its name and capacity requests (and its subrequests')."""
    if not isinstance(request, dict):
        return request
    out = _pick(request, ("name",))
    exactly = request.get("exactly")
    if isinstance(exactly, dict):
        out["exactly"] = _pick(exactly, _ASK_KEYS)
    options = request.get("firstAvailable")
    if isinstance(options, list):
        out["firstAvailable"] = [
            _pick(o, ("name", *_ASK_KEYS)) if isinstance(o, dict) else o for o in options
        ]
    return out


# what a request asks: the class (whose it is), how many devices, the capacity requests
_ASK_KEYS = ("deviceClassName", "allocationMode", "count", "capacity")


def claim_for_views(claim: JsonObj) -> JsonObj:
    """A ResourceClaim as the DRA views read it (``vgpu.core.dra.usage``): identity, owner
    references, each request's name and capacity requests (the views show the cores a request
    asked, ``vgpu.core.dra.asked``), and the status' allocation results and ``reservedFor``; the
    rest of the spec (selectors, CEL, constraints, config) and the allocation's node selector and
    config are dropped."""
    out: JsonObj = _pick(claim, ("apiVersion", "kind"))
    meta = claim.get("metadata")
    out["metadata"] = {**_pick(meta, ("name", "namespace", "uid", "resourceVersion", "ownerReferences"))}
    spec = claim.get("spec")
    devices = spec.get("devices") if isinstance(spec, dict) else None
    requests = devices.get("requests") if isinstance(devices, dict) else None
    if isinstance(requests, list):
        out["spec"] = {"devices": {"requests": [_request_asks(r) for r in requests]}}
    status = claim.get("status")
    if isinstance(status, dict):
        slim_status = _pick(status, ("reservedFor",))
        alloc = status.get("allocation")
        if isinstance(alloc, dict):
            devices = alloc.get("devices")
            slim_status["allocation"] = (
                {"devices": _pick(devices, ("results",))}
                if isinstance(devices, dict)
                else {"devices": devices}
            )
        elif "allocation" in status:
            slim_status["allocation"] = alloc  # garbage stays garbage: the reader reports it
        out["status"] = slim_status
    elif "status" in claim:
        out["status"] = status
    return out
