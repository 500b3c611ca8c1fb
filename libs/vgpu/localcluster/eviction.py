"""The ``pods/eviction`` subresource, as kube-apiserver's ``EvictionREST`` answers it.

An eviction is a delete that PodDisruptionBudgets may refuse:

- the pod must exist (404) and match the ``deleteOptions.preconditions`` uid (409);
- a pod that is ``Pending``, finished (``Succeeded``/``Failed``) or already being deleted is
  deleted without looking at budgets;
- otherwise the ``policy/v1`` budgets of its namespace whose selector matches its labels are found
  (a missing selector selects nothing, an empty one every pod): more than one is a 500 ("This pod
  has more than one PodDisruptionBudget, which the eviction subresource does not support."); with
  one, a budget whose ``status.observedGeneration`` is behind its ``metadata.generation`` or whose
  ``status.disruptionsAllowed`` is 0 refuses with 429 TooManyRequests ("Cannot evict pod as it
  would violate the pod's disruption budget.", cause ``DisruptionBudget``), a negative one with
  403; else ``disruptionsAllowed`` is decremented and the pod recorded in ``disruptedPods`` (a
  status write of the budget), then the pod is deleted with ``deleteOptions.gracePeriodSeconds``
  (default: the pod's ``terminationGracePeriodSeconds``, 30 if unset).

Not emulated: the disruption controller (a budget's status is what was written to it),
``unhealthyPodEvictionPolicy``, dry runs.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

from vgpu.core import errors
from vgpu.kube.port import JsonObj
from vgpu.localcluster import selectors, validation
from vgpu.localcluster.store import Store

DEFAULT_GRACE_S = 30
_NO_BUDGET_CHECK = ("Pending", "Succeeded", "Failed")


def _selects(budget: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    selector = (budget.get("spec") or {}).get("selector")
    if selector is None:
        return False  # policy/v1: a null selector selects nothing, an empty one every pod
    return selectors.match_label_selector(selector, labels)


def _grace(pod: Mapping[str, Any], options: Mapping[str, Any]) -> int:
    grace = options.get("gracePeriodSeconds")
    if grace is None:
        grace = (pod.get("spec") or {}).get("terminationGracePeriodSeconds")
        grace = (
            grace
            if isinstance(grace, int) and not isinstance(grace, bool) and grace >= 0
            else DEFAULT_GRACE_S
        )
    if not isinstance(grace, int) or isinstance(grace, bool) or grace < 0:
        raise validation.bad_request("DeleteOptions.gracePeriodSeconds must be a non-negative integer")
    return grace


def evict(
    store: Store, namespace: str, name: str, *, options: Mapping[str, Any], now: datetime.datetime
) -> None:
    """Evict pod ``namespace/name`` with ``options`` (the Eviction's deleteOptions); see the module doc."""
    pod = store.get("pods", name, namespace=namespace)
    meta = pod["metadata"]
    pre = options.get("preconditions") or {}
    if not isinstance(pre, Mapping):
        raise validation.bad_request("DeleteOptions.preconditions must be an object")
    want = pre.get("uid")
    if want is not None and want != meta.get("uid"):
        raise errors.Conflict(
            f"Precondition failed: UID in precondition: {want}, UID in object meta: {meta.get('uid')}",
            status=409,
            reason="Conflict",
        )
    grace = _grace(pod, options)
    phase = (pod.get("status") or {}).get("phase")
    if phase not in _NO_BUDGET_CHECK and not meta.get("deletionTimestamp"):
        _use_budget(store, namespace, name, meta.get("labels") or {}, now=now)
    store.delete("pods", name, namespace=namespace, grace_period_s=grace)


def _use_budget(
    store: Store, namespace: str, pod: str, labels: Mapping[str, str], *, now: datetime.datetime
) -> None:
    if not labels:
        return  # a pod without labels is selected by no budget
    budgets = [
        b for b in store.list("poddisruptionbudgets", namespace=namespace).items if _selects(b, labels)
    ]
    if not budgets:
        return
    if len(budgets) > 1:
        raise errors.KubeError(
            "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
            status=500,
            reason="InternalError",
        )
    (budget,) = budgets
    status: JsonObj = dict(budget.get("status") or {})
    allowed = status.get("disruptionsAllowed", 0)
    generation = (budget.get("metadata") or {}).get("generation", 0)
    behind = isinstance(generation, int) and status.get("observedGeneration", generation) < generation
    if not isinstance(allowed, int) or allowed < 0:
        raise errors.KubeError("pdb disruptions allowed is negative", status=403, reason="Forbidden")
    if behind or allowed == 0:
        raise errors.TooManyRequests(
            "Cannot evict pod as it would violate the pod's disruption budget.",
            status=429,
            reason="TooManyRequests",
        )
    disrupted = dict(status.get("disruptedPods") or {})
    disrupted[pod] = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    status.update(disruptionsAllowed=allowed - 1, disruptedPods=disrupted)
    store.update(
        "poddisruptionbudgets", {**budget, "status": status}, namespace=namespace, subresource="status"
    )
