"""What a restarted kubelet (≥ 1.27) does to the pods it already runs: it admits them again.

At start kubelet receives every pod bound to its node and runs admission on each, as for a new pod.
The device manager's ``Allocate`` for a container then (``devicesToAllocate``, since kubernetes
#116376 in 1.27; the running-container exception since #118635, back-ported to 1.25.14):

* a container the runtime reports running is left alone ("container detected running");
* any other container (an init container that finished, one in CrashLoopBackOff, one waiting) on a
  resource kubelet knows from its checkpoint must find healthy devices: none at all is
  ``no healthy devices present; cannot allocate unhealthy devices <resource>``, and devices it had
  that are not healthy now is ``previously allocated devices are no longer healthy; cannot allocate
  unhealthy devices <resource>``.

The error fails the whole pod with ``UnexpectedAdmissionError`` (kubernetes #124345, #133382): a
device plugin that has not registered and sent its devices again by then loses such pods. Pure:
``readmission_error`` reads the pod and the device book; the kubelet acts on its answer.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from vgpu.core import errors
from vgpu.localcluster import kubeletdevices, podresources


def _running_names(pod: Mapping[str, Any]) -> set[str]:
    status = pod.get("status") or {}
    names: set[str] = set()
    for key in ("containerStatuses", "initContainerStatuses"):
        for entry in status.get(key) or []:
            if isinstance(entry, Mapping) and isinstance((entry.get("state") or {}).get("running"), Mapping):
                names.add(str(entry.get("name", "")))
    return names


def _recorded_ids(pod: Mapping[str, Any], annotation: str) -> dict[tuple[str, str], list[str]]:
    """``(container, resource) → device IDs`` from the emulation's allocations record (else empty)."""
    raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(annotation)
    try:
        recorded = json.loads(raw) if isinstance(raw, str) else {}
        return {
            (str(container), str(resource)): [str(i) for i in ids]
            for container, entry in recorded.items()
            for resource, ids in (entry.get("resources") or {}).items()
            if isinstance(ids, list)
        }
    except (ValueError, AttributeError, TypeError):
        return {}


def readmission_error(
    pod: Mapping[str, Any], devices: kubeletdevices.DeviceBook, *, allocations_annotation: str
) -> str | None:
    """kubelet's device-manager error for re-admitting ``pod`` now, or None when it is admitted."""
    running = _running_names(pod)
    pod_running = (pod.get("status") or {}).get("phase") == "Running"
    recorded = _recorded_ids(pod, allocations_annotation)
    for is_init, container in podresources.containers(pod):
        name = str(container.get("name", ""))
        sidecar = is_init and container.get("restartPolicy") == "Always"
        # the emulation writes no init-container statuses: a sidecar (restartable init container)
        # runs while its pod does
        if name in running or (sidecar and pod_running):
            continue
        try:
            wanted = podresources.limits(container)
        except errors.QuantityError:
            continue  # the API server never stores one; not the device manager's to judge
        for resource, amount in sorted(wanted.items()):
            state = devices.resources.get(resource)
            if state is None or amount <= 0:
                continue  # not a device-plugin resource kubelet knows
            if not state.healthy:
                return f"no healthy devices present; cannot allocate unhealthy devices {resource}"
            if not state.healthy.issuperset(recorded.get((name, resource), [])):
                return (
                    f"previously allocated devices are no longer healthy; cannot allocate unhealthy "
                    f"devices {resource}"
                )
    return None
