"""The GPU pods ``vgpu status`` lists as pending: every unbound, unfinished pod asking for GPUs,
what it asks and why it waits, from what the API server holds (pure: the objects come from the
snapshot's list calls).

* **DRA pods** (``DRA``): as the dashboard lists them (``vgpu.core.dra.waiting``): their claims
  allocated and the bind under way, kube-scheduler's ``PodScheduled=False`` message, a claim
  kube-controller-manager has not made yet, or queued.
* **Extender pods** (``extender``, asking ``nvidia.com/gpu``): kube-scheduler's ``PodScheduled=False``
  message (it carries the extender's ``/filter`` reasons), another schedulerName, or queued. The
  scheduler's own last ``/filter`` reason lives in its memory: its dashboard shows it.
"""

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from vgpu.core import errors, request
from vgpu.core.config import Config
from vgpu.core.dra import names, waiting

QUEUED = "queued: kube-scheduler has not tried it yet"


@dataclass(frozen=True)
class PendingPod:
    namespace: str
    name: str
    mode: str  # names.MODE_DRA or names.MODE_EXTENDER
    asks: tuple[waiting.Ask, ...]
    reason: str


def _extender(pod: Mapping[str, Any], config: Config) -> PendingPod | None:
    try:
        ask = request.parse_pod(pod, config)
    except errors.VgpuError:
        return None  # not readable as a GPU pod: the webhook or the filter said so
    if not ask.wants_gpu:
        return None
    asks = tuple(
        waiting.Ask(
            gpus=c.count, memory_mib=c.memory_mib or None, memory_percent=c.memory_percent, cores=c.cores
        )
        for c in ask.containers
        if c is not None and c.count > 0
    )
    spec = pod.get("spec")
    ours = config.scheduler.scheduler_name
    theirs = (spec.get("schedulerName") if isinstance(spec, Mapping) else None) or "default-scheduler"
    reason = waiting.condition_message(pod)
    if reason is None and theirs != ours:
        reason = f"schedulerName is {theirs!r}, not {ours!r}: kube-vgpu does not place it"
    meta = pod.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    return PendingPod(
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or meta.get("uid") or ""),
        mode=names.MODE_EXTENDER,
        asks=asks,
        reason=reason or QUEUED,
    )


def pending_pods(
    pods: Iterable[object], *, claims: Iterable[object], templates: Iterable[object], config: Config
) -> tuple[PendingPod, ...]:
    """The pending GPU pods of ``pods``, by namespace and name (see the module docstring); garbage
    objects are skipped, nothing raises."""
    claim_index = waiting.index(claims)
    template_index = waiting.index(templates)
    out: list[PendingPod] = []
    for pod in pods:
        if not isinstance(pod, Mapping):
            continue
        spec = pod.get("spec")
        status = pod.get("status")
        if not isinstance(spec, Mapping) or spec.get("nodeName"):
            continue
        if isinstance(status, Mapping) and status.get("phase") in waiting.FINISHED:
            continue
        found = waiting.waiting(pod, claims=claim_index, templates=template_index)
        if found is not None:
            out.append(PendingPod(found.namespace, found.name, names.MODE_DRA, found.asks, found.reason))
            continue
        extender = _extender(pod, config)
        if extender is not None:
            out.append(extender)
    out.sort(key=lambda p: (p.namespace, p.name))
    return tuple(out)
