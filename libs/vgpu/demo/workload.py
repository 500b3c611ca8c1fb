"""The demo's cluster and sample workload, and loading a user's workload file.

The workload file is the one ``vgpu simulate`` reads (``vgpu.core.workloadfile``): Pod manifests, each
may carry ``replicas: N`` and ``expect: pending`` (kept out of what is submitted: the demo should see
that pod stay Pending with the scheduler's reason; every other pod is expected to run).
"""

from __future__ import annotations

import pathlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from vgpu.core import errors, workloadfile

# (model, memory MiB): mixed models and sizes, cycled over the nodes' GPU slots
GPU_MODELS: tuple[tuple[str, int], ...] = (
    ("NVIDIA A100-SXM4-40GB", 40960),
    ("NVIDIA H100 80GB HBM3", 81559),
    ("Tesla T4", 15360),
    ("NVIDIA A10", 23028),
)


def cluster_description(*, nodes: int, gpus_per_node: int) -> dict[str, Any]:
    """``nodes`` nodes with ``gpus_per_node`` GPUs each, models rotating so each node is mixed."""
    out = []
    for n in range(nodes):
        gpus = []
        for g in range(gpus_per_node):
            model, memory = GPU_MODELS[(n + g) % len(GPU_MODELS)]
            gpus.append({"model": model, "memoryMib": memory, "numa": g * 2 // max(gpus_per_node, 1)})
        out.append({"name": f"gpu-node-{n}", "labels": {"gpu": "on"}, "gpus": gpus})
    return {"nodes": out}


def _pod(
    name: str, containers: list[dict[str, Any]], *, annotations: Mapping[str, str] | None = None
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "annotations": dict(annotations or {})},
        "spec": {"containers": containers, "restartPolicy": "Never"},
    }


def _ctr(name: str, limits: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "name": name,
        "image": "nvidia/cuda:12.4.1-base-ubuntu22.04",
        "resources": {"limits": {k: str(v) for k, v in limits.items()}},
    }


@dataclass(frozen=True)
class DemoPod:
    manifest: dict[str, Any]
    expect_pending: bool = False

    @property
    def name(self) -> str:
        return str(self.manifest["metadata"]["name"])

    @property
    def namespace(self) -> str:
        return str(self.manifest["metadata"].get("namespace") or "default")


def sample_workload() -> list[DemoPod]:
    """Pods asking for memory, percent, cores, 2 GPUs, a pinned type, whole GPUs, and one that cannot fit."""
    return [
        DemoPod(
            _pod(
                "train-mem-cores",
                [_ctr("train", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 10000, "nvidia.com/gpucores": 50})],
            )
        ),
        DemoPod(
            _pod(
                "infer-percent",
                [
                    _ctr(
                        "infer",
                        {"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 25, "nvidia.com/gpucores": 20},
                    )
                ],
            )
        ),
        DemoPod(
            _pod(
                "infer-small",
                [_ctr("infer", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000, "nvidia.com/gpucores": 10})],
            )
        ),
        DemoPod(
            _pod(
                "dist-2gpu",
                [_ctr("worker", {"nvidia.com/gpu": 2, "nvidia.com/gpumem": 8000, "nvidia.com/gpucores": 30})],
            )
        ),
        DemoPod(
            _pod(
                "pinned-t4",
                [_ctr("infer", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 2000})],
                annotations={"nvidia.com/use-gputype": "T4"},
            )
        ),
        DemoPod(_pod("whole-gpu", [_ctr("bench", {"nvidia.com/gpu": 1})])),
        DemoPod(
            _pod(
                "two-containers",
                [
                    _ctr(
                        "encoder", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 4000, "nvidia.com/gpucores": 25}
                    ),
                    _ctr(
                        "decoder", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 4000, "nvidia.com/gpucores": 25}
                    ),
                ],
            )
        ),
        DemoPod(
            _pod("too-big", [_ctr("llm", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 200000})]),
            expect_pending=True,
        ),
    ]


def load_workload(path: pathlib.Path) -> list[DemoPod]:
    """Pods from a workload file, as ``vgpu simulate`` reads it too (``vgpu.core.workloadfile``: Pod
    manifests, a list or a multi-document stream, with ``replicas`` and ``expect`` of ours)."""
    try:
        docs = list(yaml.safe_load_all(path.read_text(encoding="utf-8")))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise errors.ConfigError(str(path), f"cannot read the workload: {exc}") from None
    try:
        items = workloadfile.expand(docs)
    except errors.ConfigError as exc:
        raise errors.ConfigError(f"{path}: {exc.field}", exc.message) from None
    return [DemoPod(item.manifest, expect_pending=item.expect == "pending") for item in items]
