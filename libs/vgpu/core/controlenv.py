"""HAMi-core's control variables: the env a GPU container may not set for itself (issue 49).

HAMi-core (``libvgpu.so``, loaded into each GPU container through the ``/etc/ld.so.preload`` the
device plugin mounts) takes its limits from the container's environment, which the plugin's
Allocate answer fills in. A kubelet applies the pod spec's own ``env`` after the plugin's, so a
value the pod sets wins: ``CUDA_DEVICE_MEMORY_LIMIT_0=16000m`` on a pod accounted at 1,000 MiB
would let it take the whole card. The admission webhook therefore refuses these names on GPU
containers (``admission.decide``), unless the namespace is listed in
``webhook.allowControlEnvNamespaces``.

The names, from HAMi-core's sources (``src/multiprocess/multiprocess_memory_limit.c``,
``src/libvgpu.c``) and the device plugin's answer:

* ``CUDA_DEVICE_MEMORY_LIMIT`` and ``CUDA_DEVICE_MEMORY_LIMIT_<i>``: memory per GPU (prefix);
* ``CUDA_DEVICE_SM_LIMIT`` and ``CUDA_DEVICE_SM_LIMIT_<i>``: the SM share (prefix);
* ``CUDA_DEVICE_MEMORY_SHARED_CACHE``: the shared accounting region of the container's processes;
* ``CUDA_TASK_PRIORITY``: the priority (the webhook writes it from ``nvidia.com/priority``);
* ``GPU_CORE_UTILIZATION_POLICY``: ``disable`` turns SM limiting off (the webhook writes it from
  the core policy);
* ``ACTIVE_OOM_KILLER``: ``false`` keeps processes over the memory limit alive;
* ``RECORD_KERNEL_INTERVAL``: the SM limiter's sampling interval;
* ``CUDA_REDIRECT``: a library HAMi-core loads in place of ``libvgpu.so``;
* ``CUDA_DISABLE_CONTROL``: HAMi's device plugin leaves the preload out for it (ours never does);
* ``LD_PRELOAD``: libraries loaded before HAMi-core, which can interpose the CUDA calls it hooks;
* ``NVIDIA_VISIBLE_DEVICES``: the device list the plugin sets; ``all`` would show every GPU of the
  node to the container runtime, with no limit set for the others.

``LIBCUDA_LOG_LEVEL`` (logging) and ``CUDA_VISIBLE_DEVICES`` (a choice among the visible GPUs)
change no enforcement and stay allowed. Values from ``envFrom`` (a ConfigMap or Secret) are not in
the pod spec and cannot be seen here (docs/webhook.md says so).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

EXACT = frozenset(
    {
        "CUDA_DEVICE_MEMORY_SHARED_CACHE",
        "CUDA_TASK_PRIORITY",
        "GPU_CORE_UTILIZATION_POLICY",
        "ACTIVE_OOM_KILLER",
        "RECORD_KERNEL_INTERVAL",
        "CUDA_REDIRECT",
        "CUDA_DISABLE_CONTROL",
        "LD_PRELOAD",
        "NVIDIA_VISIBLE_DEVICES",
    }
)
PREFIXES = ("CUDA_DEVICE_MEMORY_LIMIT", "CUDA_DEVICE_SM_LIMIT")


def is_control(name: str) -> bool:
    """Whether HAMi-core (or the runtime's device list) reads ``name`` to enforce a GPU share."""
    return name in EXACT or name.startswith(PREFIXES)


def set_by_pod(env: Any, *, own: Mapping[str, str]) -> list[str]:
    """The control variables a container's ``env`` list sets, in order and without repeats.

    An entry ``{name, value}`` whose value is what the webhook itself writes for that name
    (``own``: its earlier patch, seen again on reinvocation) does not count. ``env`` has been
    shape-checked by the caller (a list of objects with string names); anything else is ignored.
    """
    found: list[str] = []
    if not isinstance(env, list):
        return found
    for entry in env:
        if not isinstance(entry, Mapping):
            continue
        name = entry.get("name")
        if not isinstance(name, str) or not is_control(name) or name in found:
            continue
        if name in own and entry.get("value") == own[name] and "valueFrom" not in entry:
            continue
        found.append(name)
    return found


def refusal(container: str, names: list[str]) -> str:
    """The webhook's message for ``container`` setting control variables ``names``."""
    one = len(names) == 1
    return (
        f"container {container} sets {', '.join(names)}: the device plugin sets "
        f"{'this variable' if one else 'these variables'} to enforce the GPU share and a pod's own "
        f"value would override it; remove {'it' if one else 'them'} (namespaces listed in "
        f"webhook.allowControlEnvNamespaces may set them)"
    )
