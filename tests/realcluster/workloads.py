"""The pods the real-cluster tests run: GPU pods of each kind (no schedulerName: the webhook sets
it) whose container prints its GPU environment and proves HAMi-core's files are in place, and plain
pods with the same image for comparison."""

from __future__ import annotations

from typing import Any

IMAGE = "localhost/kube-vgpu:dev"
NAMESPACE = "work"
GPU_MEMORY_MIB = 24576  # scripts/cluster/values-fake.yaml
GPU_COUNT = 6
SPLIT = 10  # the chart's deviceSplitCount

# The container's proof, printed to its log: the GPU environment, then that /etc/ld.so.preload is a
# file naming libvgpu.so, itself a file, and that the dynamic loader really preloads it (the
# stand-in's constructor reports when HAMI_CORE_STANDIN_REPORT is set). Any failure exits non-zero.
GPU_SCRIPT = r"""
set -e
env | grep -E '^(CUDA_|NVIDIA_)' | sort
test -f /etc/ld.so.preload
lib=$(cat /etc/ld.so.preload)
test -f "$lib"
echo "preload-names=$lib"
HAMI_CORE_STANDIN_REPORT=1 /bin/true
echo READY
exec sleep 3600
"""

PLAIN_SCRIPT = "echo READY; exec sleep 3600"

# (kind, limits) of the mixed GPU pods
KINDS: dict[str, dict[str, str]] = {
    "memory": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000"},
    "percent": {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "10"},
    "cores": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000", "nvidia.com/gpucores": "30"},
    "two-gpu": {"nvidia.com/gpu": "2", "nvidia.com/gpumem": "2000"},
    "exclusive": {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "100"},
}
# 30 pods that fit the six fake GPUs together
MIX = ["memory"] * 10 + ["percent"] * 8 + ["cores"] * 6 + ["two-gpu"] * 4 + ["exclusive"] * 2


def pod(name: str, *, limits: dict[str, str] | None, labels: dict[str, str]) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "main",
        "image": IMAGE,
        "imagePullPolicy": "Never",
        "command": ["sh", "-c", GPU_SCRIPT if limits else PLAIN_SCRIPT],
        "readinessProbe": {"exec": {"command": ["true"]}, "periodSeconds": 5},
    }
    if limits:
        container["resources"] = {"limits": limits}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": labels},
        "spec": {"containers": [container], "terminationGracePeriodSeconds": 0},
    }


def mixed(prefix: str, kinds: list[str], *, labels: dict[str, str]) -> list[dict[str, Any]]:
    return [pod(f"{prefix}-{kind}-{i}", limits=KINDS[kind], labels=labels) for i, kind in enumerate(kinds)]
