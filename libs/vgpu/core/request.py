"""GPU requests: what each container of a pod asks for, read from resources and annotations.

A container asks for ``count`` distinct GPUs and, on each, ``memory_mib`` MiB (or
``memory_percent`` of the GPU) and ``cores`` percent. Resolution follows HAMi (docs/protocol.md#resources-and-requests):
limits first, else requests; explicit memory wins over percentage; else the configured default
memory; else the whole GPU's memory (100 %). Invalid values raise ``RequestError`` naming the
container and the resource, never silently drop or misread the request (docs/protocol.md#resources-and-requests).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vgpu.core import errors, quantity
from vgpu.core.config import Config, Policy
from vgpu.core.device import GpuUuid

USE_GPUTYPE = "nvidia.com/use-gputype"
NOUSE_GPUTYPE = "nvidia.com/nouse-gputype"
USE_GPUUUID = "nvidia.com/use-gpuuuid"
NOUSE_GPUUUID = "nvidia.com/nouse-gpuuuid"
NUMA_BIND = "nvidia.com/numa-bind"
MAX_PRIORITY = 1  # HAMi-core's CUDA_TASK_PRIORITY: 0 high, 1 low
RESTART_ALWAYS = "Always"  # an init container's restartPolicy that makes it a sidecar


@dataclass(frozen=True)
class ContainerRequest:
    """One container's ask. ``memory_mib`` 0 with ``memory_percent`` None means no memory term."""

    name: str
    count: int
    memory_mib: int = 0
    memory_percent: int | None = None  # 1..100; used when memory_mib is 0
    cores: int = 0
    priority: int | None = None

    def memory_on(self, gpu_memory_mib: int) -> int:
        """MiB this request takes on a GPU of ``gpu_memory_mib``."""
        if self.memory_mib > 0:
            return self.memory_mib
        percent = 100 if self.memory_percent is None else self.memory_percent
        return gpu_memory_mib * percent // 100


@dataclass(frozen=True)
class Selectors:
    """Which GPUs a pod may use: model substrings and UUIDs (from the pod's annotations)."""

    use_types: tuple[str, ...] = ()
    nouse_types: tuple[str, ...] = ()
    use_uuids: frozenset[GpuUuid] = frozenset()
    nouse_uuids: frozenset[GpuUuid] = frozenset()
    numa_bind: bool = False

    def type_ok(self, model: str) -> bool:
        if not self.use_types and not self.nouse_types:  # the usual pod: asked per GPU per fit
            return True
        lowered = model.lower()
        if self.use_types and not any(t in lowered for t in self.use_types):
            return False
        return not any(t in lowered for t in self.nouse_types)

    def uuid_ok(self, uuid: GpuUuid) -> bool:
        if uuid in self.nouse_uuids:
            return False
        return not self.use_uuids or uuid in self.use_uuids


@dataclass(frozen=True)
class PodRequest:
    """A whole pod's ask. ``containers`` holds init containers first, then app containers, in spec
    order, with None for a container that asks for no GPU (index-aligned with the pod device string).
    ``sidecars``: indices of the restartable init containers (``sidecar_indices``), which run beside
    everything started after them for the pod's whole life instead of finishing first.
    """

    containers: tuple[ContainerRequest | None, ...]
    init_count: int
    selectors: Selectors = Selectors()
    node_policy: Policy | None = None
    gpu_policy: Policy | None = None
    sidecars: frozenset[int] = frozenset()

    @property
    def wants_gpu(self) -> bool:
        return any(c is not None for c in self.containers)


def sidecar_indices(init_containers: object) -> frozenset[int]:
    """Indices of the restartable init containers among a pod's ``spec.initContainers``: those with
    ``restartPolicy: Always`` (Kubernetes 1.29+ sidecars). Anything that is not a list of objects
    has none."""
    if not isinstance(init_containers, list):
        return frozenset()
    return frozenset(
        i
        for i, c in enumerate(init_containers)
        if isinstance(c, Mapping) and c.get("restartPolicy") == RESTART_ALWAYS
    )


def _split_list(raw: str) -> tuple[str, ...]:
    return tuple(part.strip().lower() for part in raw.split(",") if part.strip())


def _parse_bool(raw: str) -> bool:
    return raw.strip() in ("1", "t", "T", "TRUE", "true", "True")


def _policy(raw: str | None, field: str) -> Policy | None:
    if raw is None or raw == "":
        return None
    try:
        return Policy(raw.strip())
    except ValueError:
        raise errors.RequestError(field, f"unknown policy {raw!r}: expected binpack or spread") from None


def parse_selectors(annotations: Mapping[str, str]) -> Selectors:
    return Selectors(
        use_types=_split_list(annotations.get(USE_GPUTYPE, "")),
        nouse_types=_split_list(annotations.get(NOUSE_GPUTYPE, "")),
        use_uuids=frozenset(
            GpuUuid(u.strip()) for u in annotations.get(USE_GPUUUID, "").split(",") if u.strip()
        ),
        nouse_uuids=frozenset(
            GpuUuid(u.strip()) for u in annotations.get(NOUSE_GPUUUID, "").split(",") if u.strip()
        ),
        numa_bind=_parse_bool(annotations.get(NUMA_BIND, "")),
    )


def _resource(resources: Mapping[str, Any], name: str) -> Any:
    limits = resources.get("limits") or {}
    requests = resources.get("requests") or {}
    if not isinstance(limits, Mapping) or not isinstance(requests, Mapping):
        return None
    if name in limits:
        return limits[name]
    return requests.get(name)


def parse_container(
    container: Mapping[str, Any], config: Config, *, default_count: bool = False
) -> ContainerRequest | None:
    """The container's GPU ask, or None when it asks for none of our resources.

    A container with GPU memory or cores but no GPU count: the webhook (``default_count``) gives it
    ``webhook.defaultGpuCount`` and writes that limit into the pod, as HAMi's does. Anyone else
    reads the pod as kubelet will: kubelet calls the device plugin's Allocate only for a container
    with the count resource in its limits, so the scheduler must not place one without it (its
    decision would be handed to the next container, or to none): a ``RequestError`` saying the pod
    did not pass through the webhook."""
    name = str(container.get("name", "?"))
    resources = container.get("resources") or {}
    if not isinstance(resources, Mapping):
        raise errors.RequestError(f"container {name}: resources", "expected an object")
    names = config.resources
    raw = {res: _resource(resources, res) for res in names.all()}
    if all(v is None for v in raw.values()):
        return None

    def num(resource: str) -> int | None:
        value = raw[resource]
        if value is None:
            return None
        amount = quantity.parse_int(value, field=f"container {name}: {resource}")
        if amount < 0:
            raise errors.RequestError(f"container {name}: {resource}", f"must not be negative, got {value}")
        return amount

    count = num(names.count)
    cores = num(names.cores)
    percent = num(names.memory_percentage)
    priority = num(names.priority)
    memory = None
    if raw[names.memory] is not None:
        memory = quantity.parse_mib(raw[names.memory], field=f"container {name}: {names.memory}")
        if memory < 0:
            raise errors.RequestError(f"container {name}: {names.memory}", "must not be negative")
    if count is None:
        if memory is None and cores is None and percent is None:
            return None  # only a priority: not a GPU container
        if not default_count:
            raise errors.RequestError(
                f"container {name}: {names.count}",
                "GPU memory or cores requested without a GPU count; the webhook adds it, so this pod "
                "was created without the webhook (its namespace or the pod is excluded, or the "
                "webhook was not called): set the count in the container's limits",
            )
        count = config.webhook.default_gpu_count
        if count == 0:
            raise errors.RequestError(
                f"container {name}: {names.count}", "GPU memory or cores requested without any GPU"
            )
    if count == 0:
        if memory or cores or percent:
            raise errors.RequestError(
                f"container {name}: {names.count}", "GPU memory or cores requested with 0 GPUs"
            )
        return None
    if percent is not None and percent > 100:
        raise errors.RequestError(
            f"container {name}: {names.memory_percentage}", f"must be between 0 and 100, got {percent}"
        )
    if priority is not None and priority > MAX_PRIORITY:
        raise errors.RequestError(
            f"container {name}: {names.priority}",
            f"must be 0 (high) or 1 (low), the task priorities HAMi-core knows; got {priority}",
        )
    if cores is not None and cores > 100:
        raise errors.RequestError(
            f"container {name}: {names.cores}", f"must be between 0 and 100, got {cores}"
        )
    if memory is not None and memory > 0:
        memory_mib, memory_percent = memory * config.webhook.memory_factor, None
    elif percent:
        memory_mib, memory_percent = 0, percent
    elif config.webhook.default_memory_mib:
        memory_mib, memory_percent = config.webhook.default_memory_mib, None
    else:
        memory_mib, memory_percent = 0, 100
    return ContainerRequest(
        name=name,
        count=count,
        memory_mib=memory_mib,
        memory_percent=memory_percent,
        cores=config.webhook.default_cores if cores is None else cores,
        priority=priority,
    )


def parse_pod(pod: Mapping[str, Any], config: Config, *, default_count: bool = False) -> PodRequest:
    """Every container's ask (init first), the GPU selectors and per-pod policy overrides;
    ``default_count``: as the webhook reads a pod (``parse_container``)."""
    spec = pod.get("spec") or {}
    meta = pod.get("metadata") or {}
    if not isinstance(spec, Mapping) or not isinstance(meta, Mapping):
        raise errors.RequestError("pod", "spec and metadata must be objects")
    init = spec.get("initContainers") or []
    app = spec.get("containers") or []
    if not isinstance(init, list) or not isinstance(app, list):
        raise errors.RequestError("pod.spec", "containers must be lists")
    containers: list[ContainerRequest | None] = []
    for c in [*init, *app]:
        if not isinstance(c, Mapping):
            raise errors.RequestError("pod.spec.containers", "each container must be an object")
        containers.append(parse_container(c, config, default_count=default_count))
    annotations = meta.get("annotations") or {}
    if not isinstance(annotations, Mapping):
        raise errors.RequestError("pod.metadata.annotations", "expected an object")
    for key, value in annotations.items():
        if not isinstance(value, str):
            raise errors.RequestError(
                f"pod.metadata.annotations[{str(key)[:253]!r}]",
                f"expected a string, got {type(value).__name__}",
            )
    prefix = config.annotation_prefix
    return PodRequest(
        containers=tuple(containers),
        init_count=len(init),
        sidecars=sidecar_indices(init),
        selectors=parse_selectors(annotations),
        node_policy=_policy(annotations.get(f"{prefix}/node-scheduler-policy"), "node-scheduler-policy"),
        gpu_policy=_policy(annotations.get(f"{prefix}/gpu-scheduler-policy"), "gpu-scheduler-policy"),
    )
