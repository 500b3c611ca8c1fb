"""``DraUsage``: what pods admitted in DRA mode hold against their namespace's GPU quota.

A DRA pod carries no ``nvidia.com/*`` limits and no decision annotations, so the charges
(``charges.py``) never see it. Its ask is in its claims: each ``spec.resourceClaims`` entry naming a
ResourceClaimTemplate we keep is charged what a claim of that template holds at most
(``convert.claim_charge``: memory MiB and cores, a whole GPU at the largest size known), for as long
as the pod is unfinished. A pod's claims and a template's spec cannot change after creation, so
the charge is exact; it is computed again when a template arrives after its pods (a re-list) or
goes.

The webhook checks a new pod against this usage, but a pod only reaches the watch a moment after
it was admitted: ``admitted`` reserves the pod's charge right away, and the pod, when the watch
shows it, takes over the oldest reservation of the same namespace and templates; a reservation no
pod takes (a later admission step refused it) expires after ``ttl_s``. So a burst of pods cannot all
pass against the same old usage.

Kubernetes' own ResourceQuota covers DRA claims by device count per DeviceClass
(``gpu.kube-vgpu.io.deviceclass.resource.k8s.io/devices``; from 1.36 also
``requests.deviceclass.resource.kubernetes.io/gpu.kube-vgpu.io``), claims written by hand included;
it knows nothing of our memory and cores, which is what this adds. A claim written by hand against
our DeviceClass, not through a template we keep, is not counted here (docs/dra.md, "Quota").
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from vgpu.core.dra import convert
from vgpu.kube import informer
from vgpu.kube.port import JsonObj

from vgpu_scheduler import charges
from vgpu_scheduler.namespaces import Namespaces

Key = tuple[str, str]  # (namespace, template name)
Charge = tuple[int, int]  # (memory MiB, cores)


def _templates_of(pod: Mapping[str, Any]) -> tuple[str, ...]:
    spec = pod.get("spec")
    claims = spec.get("resourceClaims") if isinstance(spec, Mapping) else None
    out = []
    for claim in claims if isinstance(claims, list) else ():
        name = claim.get("resourceClaimTemplateName") if isinstance(claim, Mapping) else None
        if isinstance(name, str) and name:
            out.append(name)
    return tuple(out)


class DraUsage:
    """DRA pods' GPU usage per namespace, added to ``namespaces`` (see the module docstring)."""

    def __init__(
        self,
        namespaces: Namespaces,
        *,
        clock: Callable[[], float],
        ttl_s: float,
        largest_gpu_memory_mib: Callable[[], int] = lambda: 0,
    ) -> None:
        self._namespaces = namespaces
        self._clock = clock
        self._ttl_s = ttl_s
        self.largest_gpu_memory_mib = largest_gpu_memory_mib
        self._specs: dict[Key, Any] = {}  # the claim spec of each template we keep
        self._pods: dict[str, tuple[str, tuple[str, ...], Charge]] = {}  # uid -> (ns, templates, charged)
        self._users: dict[Key, set[str]] = collections.defaultdict(set)  # template -> pod uids
        # (ns, templates) -> reservations (expiry, charge), oldest first
        self._reserved: dict[tuple[str, tuple[str, ...]], collections.deque[tuple[float, Charge]]] = {}

    def _add(self, namespace: str, charge: Charge, sign: int) -> None:
        if charge != (0, 0):
            self._namespaces.add_usage(namespace, memory_mib=sign * charge[0], cores=sign * charge[1])

    def charge_of(self, namespace: str, templates: Sequence[str]) -> Charge:
        largest = self.largest_gpu_memory_mib()
        memory = cores = 0
        for name in templates:
            spec = self._specs.get((namespace, name))
            if spec is not None:
                m, c = convert.claim_charge(spec, largest_gpu_memory_mib=largest)
                memory, cores = memory + m, cores + c
        return memory, cores

    # --- the watches ---------------------------------------------------------------------------

    def pod(self, obj: JsonObj, deleted: bool) -> None:
        """A pod watch event: charge an unfinished pod naming our templates, free a finished one."""
        self.expire()
        meta = obj.get("metadata") or {}
        uid = str(meta.get("uid", ""))
        namespace = str(meta.get("namespace", ""))
        finished = (obj.get("status") or {}).get("phase") in charges.FINISHED
        templates = () if deleted or finished else _templates_of(obj)
        current = self._pods.get(uid)
        if current is not None and current[:2] == (namespace, templates):
            return
        if current is not None:
            self._forget(uid)
        if not templates:
            return
        if current is None:  # first seen: it takes over its admission's reservation
            queue = self._reserved.get((namespace, templates))
            if queue:
                _, held = queue.popleft()
                self._add(namespace, held, -1)
                if not queue:
                    del self._reserved[(namespace, templates)]
        charge = self.charge_of(namespace, templates)
        self._pods[uid] = (namespace, templates, charge)
        for name in templates:
            self._users[(namespace, name)].add(uid)
        self._add(namespace, charge, 1)

    def _forget(self, uid: str) -> None:
        namespace, templates, charge = self._pods.pop(uid)
        self._add(namespace, charge, -1)
        for name in templates:
            users = self._users.get((namespace, name))
            if users is not None:
                users.discard(uid)
                if not users:
                    del self._users[(namespace, name)]

    def template(self, change: informer.Change) -> None:
        """A template watch event (our labelled ones): learn or drop its spec, and charge its pods
        again."""
        key = informer.object_key(change.object)
        spec = change.object.get("spec")
        inner = spec.get("spec") if isinstance(spec, Mapping) else None
        if change.type == "DELETED":
            self._specs.pop(key, None)
        else:
            self._specs[key] = inner
        self._recharge(key)

    def _recharge(self, key: Key) -> None:
        for uid in list(self._users.get(key, ())):
            namespace, templates, charge = self._pods[uid]
            fresh = self.charge_of(namespace, templates)
            if fresh != charge:
                self._add(namespace, charge, -1)
                self._add(namespace, fresh, 1)
                self._pods[uid] = (namespace, templates, fresh)

    # --- the webhook ---------------------------------------------------------------------------

    def admitted(
        self, namespace: str, templates: Sequence[str], bodies: Sequence[Mapping[str, Any]]
    ) -> Charge:
        """A pod the webhook admitted with claims from ``templates`` (whose bodies are among
        ``bodies``): reserve its charge until the watch shows it (or ``ttl_s`` passes)."""
        self.expire()
        for body in bodies:
            key = informer.object_key(dict(body))
            if key not in self._specs:
                spec = body.get("spec")
                self._specs[key] = spec.get("spec") if isinstance(spec, Mapping) else None
                self._recharge(key)
        charge = self.charge_of(namespace, templates)
        queue = self._reserved.setdefault((namespace, tuple(templates)), collections.deque())
        queue.append((self._clock() + self._ttl_s, charge))
        self._add(namespace, charge, 1)
        return charge

    def withdraw(self, namespace: str, templates: Sequence[str]) -> None:
        """Take back the newest reservation ``admitted`` made for these templates (the pod was
        refused after all: its template could not be made)."""
        key = (namespace, tuple(templates))
        queue = self._reserved.get(key)
        if queue:
            _, charge = queue.pop()
            self._add(namespace, charge, -1)
            if not queue:
                del self._reserved[key]

    def expire(self) -> None:
        """Drop the reservations no pod took within ``ttl_s``."""
        now = self._clock()
        for key in list(self._reserved):
            queue = self._reserved[key]
            while queue and queue[0][0] <= now:
                _, charge = queue.popleft()
                self._add(key[0], charge, -1)
            if not queue:
                del self._reserved[key]

    def reserved(self) -> int:
        """How many reservations are held (tests, and the curious)."""
        return sum(len(q) for q in self._reserved.values())
