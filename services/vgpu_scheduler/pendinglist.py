"""The dashboard's pending GPU pods (``dashboard.Snapshot.pending``): every unbound, unfinished pod
that asks for GPUs, what it asks (``asks``, per GPU container or claim request) and why it waits.

* **Extender pods** (``mode: "extender"``, asking ``nvidia.com/gpu``): the last ``/filter`` failure
  (``pending.FilterReasons``), the node a decision is being bound to, another schedulerName, or no
  filter call yet.
* **DRA pods** (``mode: "dra"``, their claims from our ResourceClaimTemplates or of our DeviceClass):
  kube-scheduler places them, so why they wait is what the cluster says (``vgpu.core.dra.waiting``:
  their claims allocated and the bind under way, kube-scheduler's ``PodScheduled=False`` message,
  a claim kube-controller-manager has not made yet, or queued), read from the pods' cache and the
  DRA views' claims and templates (``draviews.DraCapture``), in the dashboard's worker thread.
"""

from collections.abc import Iterable, Mapping
from typing import Any, TypedDict

from vgpu.core import errors, request
from vgpu.core.config import Config
from vgpu.core.dra import names as dra_names
from vgpu.core.dra import waiting as dra_waiting

from vgpu_scheduler.charges import Charge
from vgpu_scheduler.draviews import DraCapture
from vgpu_scheduler.pending import Reason

_FINISHED = ("Succeeded", "Failed")


class GpuAsk(TypedDict):
    """What one GPU container (extender) or claim request (DRA) asks, per GPU."""

    gpus: int
    memoryMib: int | None  # None: a percentage (``memoryPercent``) or the whole memory
    memoryPercent: int | None
    cores: int  # percent of one GPU; 0: none asked


class PendingPod(TypedDict):
    namespace: str
    name: str
    mode: str  # "extender" (placed through /filter) or "dra" (by kube-scheduler's DRA plugin)
    reason: str
    reasonAt: float | None  # unix seconds when the filter gave the reason (None: not a filter's)
    asks: list[GpuAsk]  # empty when the request cannot be read


def _asks(ask: request.PodRequest | None) -> list[GpuAsk]:
    return [
        GpuAsk(gpus=c.count, memoryMib=c.memory_mib or None, memoryPercent=c.memory_percent, cores=c.cores)
        for c in (ask.containers if ask is not None else ())
        if c is not None and c.count > 0
    ]


def _pending_reason(
    config: Config, pod: Mapping[str, Any], noted: Reason | None, decided_node: str | None
) -> tuple[str, float | None, list[GpuAsk]] | None:
    """Why the unbound ``pod`` waits, with the reason's time and what it asks; None when it asks
    for no GPUs. ``noted``: the filter's last failure; ``decided_node``: that of a decision not
    bound yet."""
    ask: request.PodRequest | None
    try:
        ask = request.parse_pod(pod, config)
        wants = ask.wants_gpu
    except errors.VgpuError:
        ask = None
        wants = noted is not None  # an unreadable request: listed once the filter said so
    if not wants:
        return None
    asks = _asks(ask)
    if decided_node is not None:
        return f"assigned to {decided_node}; waiting for the bind", None, asks
    if noted is not None:
        return noted.message, noted.at_s, asks
    ours = config.scheduler.scheduler_name
    theirs = (pod.get("spec") or {}).get("schedulerName") or "default-scheduler"
    if theirs != ours:
        return f"schedulerName is {theirs!r}, not {ours!r}: kube-vgpu does not place it", None, asks
    return (
        "no filter call yet: kube-scheduler has not asked kube-vgpu (its own checks may have ruled out every node: kubectl describe pod)",
        None,
        asks,
    )


def _dra_pending(found: dra_waiting.Waiting) -> PendingPod:
    return PendingPod(
        namespace=found.namespace,
        name=found.name,
        mode=dra_names.MODE_DRA,
        reason=found.reason,
        reasonAt=None,
        asks=[
            GpuAsk(gpus=a.gpus, memoryMib=a.memory_mib, memoryPercent=a.memory_percent, cores=a.cores)
            for a in found.asks
        ],
    )


def pending(
    config: Config,
    pods: Iterable[tuple[str, Mapping[str, Any]]],
    *,
    charges: Iterable[tuple[str, Charge]],
    reasons: Mapping[str, Reason],
    dra: DraCapture | None,
) -> list[PendingPod]:
    """Every unbound, unfinished pod of ``pods`` (uid, pod) that asks for GPUs, by namespace and
    name: extender pods with ``_pending_reason``, DRA pods with ``vgpu.core.dra.waiting``."""
    decided = {uid: charge.node for uid, charge in charges}
    claims: dict[dra_waiting.Key, Mapping[str, Any]] | None = None  # indexed at the first DRA pod
    templates: dict[dra_waiting.Key, Mapping[str, Any]] = {}
    out: list[PendingPod] = []
    for uid, pod in pods:
        spec = pod.get("spec")
        if isinstance(spec, Mapping) and spec.get("nodeName"):
            continue
        status = pod.get("status")
        if isinstance(status, Mapping) and status.get("phase") in _FINISHED:
            continue
        if isinstance(spec, Mapping) and spec.get("resourceClaims"):
            if claims is None:
                claims = dra_waiting.index(dra.claims if dra is not None else ())
                templates = dra_waiting.index(dra.templates if dra is not None else ())
            found = dra_waiting.waiting(pod, claims=claims, templates=templates)
            if found is not None:
                out.append(_dra_pending(found))
                continue
        got = _pending_reason(config, pod, reasons.get(uid), decided.get(uid))
        if got is None:
            continue
        meta = pod.get("metadata")
        meta = meta if isinstance(meta, Mapping) else {}
        out.append(
            PendingPod(
                namespace=str(meta.get("namespace") or ""),
                name=str(meta.get("name") or uid),
                mode=dra_names.MODE_EXTENDER,
                reason=got[0],
                reasonAt=got[1],
                asks=got[2],
            )
        )
    out.sort(key=lambda p: (p["namespace"], p["name"]))
    return out
