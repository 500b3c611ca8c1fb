"""Admission in ``vgpu simulate``: each workload pod through the webhook's pure decision
(``vgpu.core.admission.decide``) with the run's policies as the configured defaults and the DRA
mode's facts, as on ``kubectl apply``: a denied pod is *rejected*, an allowed one is patched and its
request re-parsed from the patched pod; one admitted in the DRA mode keeps the webhook's conversion
(claims instead of ``nvidia.com/*`` resources) and the templates its claims name."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from vgpu.core import admission, errors, jsonpatch, quota, request
from vgpu.core.config import Config
from vgpu.simulate import drafacts
from vgpu.simulate.model import Workload, WorkloadPod


@dataclass(frozen=True)
class Rejected:
    """A pod the admission webhook denies; ``message`` is what ``kubectl apply`` would print."""

    pod: WorkloadPod
    message: str


def admit(
    workload: Workload,
    *,
    config: Config,
    largest_gpu_memory_mib: int,
    quotas: Callable[[str], quota.Quota | None] | None = None,
    namespace_labels: Callable[[str], Mapping[str, str] | None] | None = None,
    dra_memory_sizes_mib: tuple[int, ...] = (),
) -> tuple[list[WorkloadPod], list[Rejected]]:
    """Each pod as the webhook leaves it (patched and re-parsed), or rejected with the reason.
    ``quotas`` gives a namespace's quota with nothing used: the workload is applied at once,
    before any pod is placed, so only a pod bigger than its namespace's whole quota is denied.
    ``namespace_labels`` and ``dra_memory_sizes_mib`` are the webhook's DRA-mode facts; a pod it
    admits with ``spec.resourceClaims`` (converted, or naming claims itself) and no GPU left for
    the extender is a DRA pod (``WorkloadPod.dra``)."""
    admitted: list[WorkloadPod] = []
    rejected: list[Rejected] = []
    largest = max((largest_gpu_memory_mib, *dra_memory_sizes_mib))
    charged: dict[str, tuple[int, int]] = {}  # namespace -> what its DRA pods hold from admission
    for pod in workload.pods:
        namespace = str(pod.pod["metadata"].get("namespace", "default"))
        limits = quotas(namespace) if quotas is not None else None
        if limits is not None and namespace in charged:
            memory, cores = charged[namespace]
            limits = dataclasses.replace(limits, used_memory_mib=memory, used_cores=cores)
        facts = admission.Facts(
            namespace_labels=namespace_labels(namespace) if namespace_labels is not None else None,
            quota=limits,
            largest_gpu_memory_mib=largest_gpu_memory_mib,
            dra_memory_sizes_mib=dra_memory_sizes_mib,
        )
        decision = admission.decide(pod.pod, namespace=namespace, config=config, facts=facts)
        if not decision.allowed:
            rejected.append(Rejected(pod, decision.message))
            continue
        try:
            patched = jsonpatch.apply(pod.pod, decision.patch) if decision.patch else pod.pod
            parsed = request.parse_pod(patched, config)
        except errors.ParseError as exc:  # the webhook's own patch not applying is a bug: say so
            rejected.append(Rejected(pod, f"admission patch failed: {exc}"))
            continue
        if (patched.get("spec") or {}).get("resourceClaims") and not parsed.wants_gpu:
            admitted.append(
                WorkloadPod(pod.key, patched, pod.request, dra=True, templates=decision.templates)
            )
            memory, cores = charged.get(namespace, (0, 0))
            more = drafacts.charge(patched, decision.templates, largest_gpu_memory_mib=largest)
            charged[namespace] = (memory + more[0], cores + more[1])
        else:
            admitted.append(WorkloadPod(pod.key, patched, parsed))
    return admitted, rejected
