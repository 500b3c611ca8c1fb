"""The pods the throughput bench's phases create (``throughput_phase``), in namespace ``NAMESPACE``.

The plain phase's pods (``plain_pod``: default-scheduler, CPU and memory only) and the GPU
phases' (``gpu_pod``: 1 GPU + 1,000 MiB for vgpu-scheduler, with a node policy; as a user writes
it with ``--webhooks chart``, the webhook then setting its ``schedulerName``); one GPU phase per
node policy asked for (``phase_labels``).
"""

from __future__ import annotations

import collections
from collections.abc import Iterable
from typing import Any

from vgpu.core import config as configs

NAMESPACE = "default"


def plain_pod(name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"bench": "throughput"}},
        "spec": {
            "schedulerName": "default-scheduler",
            "containers": [
                {
                    "name": "main",
                    "image": "busybox",
                    "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
                }
            ],
        },
    }


def gpu_pod(name: str, *, config: configs.Config, policy: str, webhook: bool = False) -> dict[str, Any]:
    """A GPU pod as the webhook leaves it; with ``webhook``, as a user writes it (the webhook, then
    registered, sets its ``schedulerName``)."""
    limits = {config.resources.count: "1", config.resources.memory: "1000"}
    spec: dict[str, Any] = {
        "containers": [{"name": "main", "image": "cuda", "resources": {"limits": limits}}]
    }
    if not webhook:
        spec["schedulerName"] = config.scheduler.scheduler_name
    return {
        "metadata": {
            "name": name,
            "labels": {"bench": "throughput"},
            "annotations": {f"{config.annotation_prefix}/node-scheduler-policy": policy},
        },
        "spec": spec,
    }


def phase_labels(policies: Iterable[str]) -> list[tuple[str, str]]:
    """One GPU phase per policy given, in order, as (label, policy): ``gpu-binpack``, and
    ``gpu-binpack-2`` for the same policy again (its pods are new ones: each phase's pods stay bound
    to the end of the run)."""
    seen: collections.Counter[str] = collections.Counter()
    phases = []
    for policy in policies:
        seen[policy] += 1
        label = f"gpu-{policy}" if seen[policy] == 1 else f"gpu-{policy}-{seen[policy]}"
        phases.append((label, policy))
    return phases
