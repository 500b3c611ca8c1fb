"""The pod's containers as the admission decision sees them, and the rules that act on one container.

``containers(spec, asks)`` pairs each init and app container with its JSON path and its parsed GPU
request; the rest check one GPU container (``check_counts``, ``control_env_problem``: rules 6 and
7 of ``vgpu.core.admission``) or write into it (``mutate_gpu_container``, ``set_control_env``,
``set_env``: rule 9). Every write is idempotent.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vgpu.core import controlenv, errors, jsonpatch, request
from vgpu.core.config import Config, CorePolicy

ENV_PRIORITY = "CUDA_TASK_PRIORITY"
ENV_CORE_POLICY = "GPU_CORE_UTILIZATION_POLICY"
EXCLUSIVE_CORES = 100


@dataclass(frozen=True)
class Container:
    path: tuple[str, str, int]
    spec: Mapping[str, Any]
    ask: request.ContainerRequest | None
    init: bool

    @property
    def name(self) -> str:
        return str(self.spec.get("name") or f"#{self.path[2]}")

    @property
    def privileged(self) -> bool:
        return (self.spec.get("securityContext") or {}).get("privileged") is True

    def given(self, resource: str) -> bool:
        resources = self.spec.get("resources") or {}
        return any(resource in (resources.get(k) or {}) for k in ("limits", "requests"))


def containers(spec: Mapping[str, Any], asks: Sequence[request.ContainerRequest | None]) -> list[Container]:
    init = spec.get("initContainers") or []
    app = spec.get("containers") or []
    out = [Container(("spec", "initContainers", i), c, asks[i], True) for i, c in enumerate(init)]
    out += [Container(("spec", "containers", i), c, asks[len(init) + i], False) for i, c in enumerate(app)]
    return out


def check_counts(containers: Sequence[Container], config: Config) -> None:
    limit = config.webhook.max_gpu_count
    for c in containers:
        if c.ask is not None and c.ask.count > limit:
            raise errors.RequestError(
                f"container {c.name}: {config.resources.count}",
                f"asks for {c.ask.count} GPUs, more than the maximum of {limit}",
            )


def _own_env(c: Container, core_policy: CorePolicy) -> dict[str, str]:
    """The control variables this webhook writes into GPU container ``c`` (``mutate_gpu_container``)."""
    assert c.ask is not None
    own = {ENV_PRIORITY: str(c.ask.priority)} if c.ask.priority is not None else {}
    if core_policy != CorePolicy.DEFAULT:
        own[ENV_CORE_POLICY] = core_policy.value
    return own


def control_env_problem(
    containers: Sequence[Container], namespace: str, config: Config, core_policy: CorePolicy
) -> str | None:
    """A GPU container that sets HAMi-core's control env itself (a kubelet would let it win over
    the device plugin's limits), naming the container and the variables; None when none does."""
    if namespace in config.webhook.allow_control_env_namespaces:
        return None
    for c in containers:
        if c.ask is None:
            continue
        names = controlenv.set_by_pod(c.spec.get("env"), own=_own_env(c, core_policy))
        if names:
            return controlenv.refusal(c.name, names)
    return None


def set_env(patch: jsonpatch.Builder, path: Sequence[str | int], name: str, value: str) -> None:
    """Make the container's env hold exactly ``name=value`` (replacing a valueFrom entry)."""
    env = patch.get([*path, "env"])
    entry = {"name": name, "value": value}
    if isinstance(env, list):
        for i in range(len(env) - 1, -1, -1):
            if env[i].get("name") == name:
                patch.set([*path, "env", i], entry)
                return
    patch.append([*path, "env"], entry)


def exclusive(c: Container, config: Config) -> bool:
    """A whole-GPU request with no cores given gets the whole GPU's cores (HAMi's default)."""
    assert c.ask is not None
    return (
        not c.given(config.resources.cores) and c.ask.memory_mib == 0 and c.ask.memory_percent in (None, 100)
    )


def mutate_gpu_container(
    patch: jsonpatch.Builder, c: Container, config: Config, core_policy: CorePolicy
) -> None:
    assert c.ask is not None
    names = config.resources
    path = c.path
    if not c.given(names.count):
        patch.set([*path, "resources", "limits", names.count], str(c.ask.count))
    if exclusive(c, config):
        patch.set([*path, "resources", "limits", names.cores], str(EXCLUSIVE_CORES))
    limits = patch.get([*path, "resources", "limits"])
    requests = patch.get([*path, "resources", "requests"])
    requests = requests if isinstance(requests, dict) else {}
    if isinstance(limits, dict):
        missing = {r: limits[r] for r in names.all() if r in limits and r not in requests}
        patch.merge([*path, "resources", "requests"], missing)
    set_control_env(patch, c, core_policy)


def set_control_env(patch: jsonpatch.Builder, c: Container, core_policy: CorePolicy) -> None:
    """HAMi-core's task priority and core policy, as env of GPU container ``c`` (both modes)."""
    assert c.ask is not None
    if c.ask.priority is not None:
        set_env(patch, c.path, ENV_PRIORITY, str(c.ask.priority))
    if core_policy != CorePolicy.DEFAULT:
        set_env(patch, c.path, ENV_CORE_POLICY, core_policy.value)
