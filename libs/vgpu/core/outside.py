"""GPU memory used outside kube-vgpu: what it is, its node annotation, and when to publish it.

Users' first complaint about GPU sharing is a pod admitted onto memory something else already
holds: the driver's reserve, pods of another scheduler, a process started by hand, or a pod of ours
that went past its share. The device plugin measures it per GPU and publishes it on the node;
the scheduler takes it off the GPU's free memory.

**What counts as outside** (per GPU, MiB)::

    outside = NVML used memory - sum over our pods of min(what its processes use, its allocation)

"Our pods" are the pods on this node whose ``devices-allocated`` names this GPU; a process belongs
to a pod when its cgroup path names the pod's UID (``/proc/<pid>/cgroup``, ``pod<uid>`` in cgroup
v1 and v2 / systemd forms). So the scheduler's view of free memory, ``total - allocated - outside``,
is the physical free memory minus the headroom our pods may still grow into: exactly what can be
handed out. A pod of ours using more than its allocation shows its excess as outside (it is real
memory the scheduler does not count). A process whose memory NVML cannot report (``None``) counts 0
towards our pods, so its memory stays outside: when in doubt, outside is overestimated, which can
leave a GPU idle but never overcommits it.

**The annotation** ``<prefix>/node-nvidia-outside-usage`` (ours, not HAMi's; HAMi's own register
annotation is unchanged) is a JSON object of GPU UUID to MiB, e.g. ``{"GPU-8f1e...":2000}``. GPUs with
nothing outside may be left out. A value that does not decode raises ``AnnotationError``.

**When to publish**: when a GPU's value moved by more than ``step_mib`` since the published value,
or the set of GPUs changed; the plugin measures at most every ``outsideUsageIntervalS``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from vgpu.core import errors
from vgpu.core.device import GpuUuid

MAX_MIB = 1 << 40  # a sanity bound on one GPU's value (a petabyte of GPU memory is garbage)

# pod UIDs in cgroup paths: "pod<uid>" with dashes (cgroupfs) or underscores (systemd slices)
_POD_UID = re.compile(
    r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})(?![0-9a-f])"
)


@dataclass(frozen=True)
class ProcessMemory:
    """One process on a GPU: its memory (None: NVML cannot say) and the pod it runs in (None: no pod
    we could find, e.g. a process started by hand or an unreadable cgroup)."""

    pid: int
    used_mib: int | None
    pod_uid: str | None = None


def pod_uid_from_cgroup(text: str) -> str | None:
    """The pod UID in a ``/proc/<pid>/cgroup`` file (cgroup v1 or v2, cgroupfs or systemd), or None."""
    for line in text.splitlines():
        found = _POD_UID.search(line.lower())
        if found:
            return found.group(1).replace("_", "-")
    return None


def outside_mib(
    used_mib: int, processes: Sequence[ProcessMemory], *, allocated_mib: Mapping[str, int]
) -> int:
    """Memory on one GPU that kube-vgpu does not account for (see the module docstring).

    ``allocated_mib`` maps the UID of each of our pods holding this GPU to the MiB allocated to it here.
    """
    by_pod: dict[str, int] = {}
    for p in processes:
        if p.pod_uid is None or p.pod_uid not in allocated_mib or p.used_mib is None:
            continue
        by_pod[p.pod_uid] = by_pod.get(p.pod_uid, 0) + max(0, p.used_mib)
    ours = sum(min(used, allocated_mib[uid]) for uid, used in by_pod.items())
    return max(0, used_mib - ours)


def encode(usage: Mapping[GpuUuid, int]) -> str:
    """The annotation value: a JSON object of UUID to MiB, keys sorted (stable for comparisons)."""
    return json.dumps({str(k): int(usage[k]) for k in sorted(usage)}, separators=(",", ":"))


def decode(raw: str, *, field: str) -> dict[GpuUuid, int]:
    """Parse the annotation value; ``AnnotationError`` naming ``field`` when it is not one we write."""
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise errors.AnnotationError(field, f"not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise errors.AnnotationError(field, "expected a JSON object of GPU UUID to MiB")
    out: dict[GpuUuid, int] = {}
    for uuid, mib in doc.items():
        if not uuid.strip():
            raise errors.AnnotationError(field, "empty GPU UUID")
        if isinstance(mib, bool) or not isinstance(mib, int) or not 0 <= mib <= MAX_MIB:
            raise errors.AnnotationError(
                field, f"GPU {uuid}: expected MiB as a non-negative integer, got {mib!r}"
            )
        out[GpuUuid(uuid)] = mib
    return out


def should_publish(
    published: Mapping[GpuUuid, int] | None, measured: Mapping[GpuUuid, int], *, step_mib: int
) -> bool:
    """Whether ``measured`` differs enough from the ``published`` value (None: nothing readable is)."""
    if published is None or set(published) != set(measured):
        return True
    return any(abs(measured[uuid] - published[uuid]) > step_mib for uuid in measured)
