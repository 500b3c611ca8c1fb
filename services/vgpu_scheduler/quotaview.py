"""``QuotaView``: the namespaces' GPU quota as the webhook and the filter read it from the state.

The webhook reads it as its ``webhook.AdmissionView`` (namespace labels, the namespace's GPU usage,
its quota's ``limits.<resource>`` hard limits, the largest GPU); the filter, the bind's re-fit and
the retries check a placement against it. A namespace's usage counts its pods' charges **and
reservations** (``namespaces.Namespaces``, fed by the cluster state's charges) and its DRA pods'
charges (``draquota.DraUsage``); a pod placed again is not counted twice (``excluding``).
"""

from collections.abc import Callable, Mapping

from vgpu.core import fit, quota, request
from vgpu.core.config import Policy
from vgpu.core.device import GpuUsage, GpuUuid

from vgpu_scheduler import draquota
from vgpu_scheduler.charges import Charge
from vgpu_scheduler.namespaces import Namespaces


class QuotaView:
    """The namespaces' labels, quota and usage, read in memory; see the module docstring."""

    def __init__(
        self,
        namespaces: Namespaces,
        *,
        dra: draquota.DraUsage,
        charges: Mapping[str, Charge],
        largest_gpu_memory_mib: Callable[[], int],
        memory_factor: int,
    ) -> None:
        self._namespaces = namespaces
        self._dra = dra
        self._charges = charges  # uid -> charge, the cluster state's (read only here)
        self._largest = largest_gpu_memory_mib
        self._memory_factor = memory_factor

    # --- AdmissionView (the webhook's window onto the state) --------------------------------

    def namespace_labels(self, ns: str) -> Mapping[str, str] | None:
        return self._namespaces.labels(ns)

    def namespace_gpu_usage(self, ns: str) -> tuple[int, int]:
        self._dra.expire()
        return self._namespaces.usage(ns)

    def quota_limits(self, ns: str) -> tuple[int | None, int | None]:
        return self._namespaces.limits(ns)

    def largest_gpu_memory_mib(self) -> int:
        return self._largest()

    # --- placement (the filter, the bind's re-fit, the retries) ------------------------------

    def namespace_quota(self, ns: str, *, excluding: str | None = None) -> quota.Quota | None:
        """The namespace's GPU quota and usage (charges and reservations), None without a quota;
        ``excluding`` a pod uid leaves that pod's own charge out (a re-filter is not counted twice)."""
        own = self._charges.get(excluding) if excluding is not None else None
        held = () if own is None or own.namespace != ns else own.usage.values()
        return self._namespaces.quota_facts(
            ns, minus=(sum(u.memory_mib for u in held), sum(u.cores for u in held))
        )

    def pod_problem(self, ask: request.PodRequest, *, namespace: str, uid: str) -> str | None:
        """Why placing pod ``uid`` now would break its namespace's GPU quota (``quota.pod_problem``)."""
        got = self.namespace_quota(namespace, excluding=uid)
        if got is None:
            return None
        return quota.pod_problem(
            ask,
            namespace=namespace,
            quota=got,
            largest_gpu_memory_mib=self._largest(),
            memory_factor=self._memory_factor,
        )

    def placement_within(
        self,
        ask: request.PodRequest,
        view: fit.NodeGpus,
        placement: fit.Placement,
        *,
        gpu_policy: Policy,
        namespace: str,
        uid: str,
    ) -> fit.Placement | str:
        """``placement`` of pod ``uid`` on ``view``, or another that keeps its namespace's GPU quota,
        or why none does (``quota.fit_within``): the check per node, after ``pod_problem``'s, for
        the pods ``quota.needs_placement_check`` names."""
        got = self.namespace_quota(namespace, excluding=uid)
        if got is None:
            return placement
        factor = self._memory_factor

        def problem(footprint: Mapping[GpuUuid, GpuUsage]) -> str | None:
            return quota.placement_problem(namespace, got, footprint, memory_factor=factor)

        return quota.fit_within(ask, view, placement, gpu_policy=gpu_policy, problem=problem)
