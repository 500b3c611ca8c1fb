"""Configuration: one YAML file for both services, validated at load with errors naming the key.

YAML keys are camelCase (as in HAMi's device-config.yaml); fields here are snake_case. Each
section is a frozen dataclass with its keys, their defaults and its own rules (``validate``);
``load`` walks the mapping (``configload.py``: unknown keys and wrong types refused, with errors
naming the key), and ``Config.for_node`` applies a node's overrides. Reading the file is the
caller's job (pure).

    resources:    {count: nvidia.com/gpu, memory: nvidia.com/gpumem, ...}
    annotationPrefix: hami.io
    scheduler:    {schedulerName, nodePolicy, gpuPolicy, ...}
    webhook:      {defaultMemoryMib, defaultCores, defaultGpuCount, ...}
    devicePlugin: {deviceSplitCount, deviceMemoryScaling, deviceCoreScaling, ...}
    nodes:        {<node name>: {deviceSplitCount: 4, ...}}   # devicePlugin overrides per node
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from vgpu.core import configload, errors
from vgpu.core.names import is_dns_subdomain


class Policy(enum.StrEnum):
    BINPACK = "binpack"
    SPREAD = "spread"


class NodeLock(enum.StrEnum):
    """When ``/bind`` writes the node lock annotation (vgpu_scheduler/handoffs.py)."""

    ALWAYS = "always"  # HAMi: before every GPU pod's Binding
    CONTENDED = "contended"  # only when another pod is being handed over on the node


class ApiClient(enum.StrEnum):
    """How the vgpu-scheduler talks to the API server (vgpu/kube/aioapi.py, vgpu/kube/client.py)."""

    ASYNCIO = "asyncio"  # aiohttp on the event loop; configured and authenticated by the official client
    THREADS = "threads"  # the official client's urllib3 calls on ``api_workers`` threads, a thread per watch


# ``apiWriter: auto`` starts the writes' helper only where the scheduler may use this many CPUs
HELPER_MIN_CPUS = 2.0


class ApiWriter(enum.StrEnum):
    """Where the vgpu-scheduler's API writes are made (vgpu/kube/offload.py)."""

    AUTO = "auto"  # process with apiClient asyncio and 2 CPUs or more to use, else inline
    INLINE = "inline"  # on its own event loop, with its reads
    PROCESS = "process"  # in a helper process, so the HTTP and TLS of writes take another core


class ApiWatches(enum.StrEnum):
    """Where the vgpu-scheduler reads its watch streams (vgpu/kube/offload.py)."""

    AUTO = "auto"  # process where the writes' helper runs (apiWriter), else inline
    INLINE = "inline"  # on its own event loop
    PROCESS = "process"  # in the writes' helper, which decodes and slims the events


class ViewsAuth(enum.StrEnum):
    """Who may read ``/metrics`` and the dashboard on the Service port (vgpu.core.viewauth)."""

    KUBERNETES = "kubernetes"  # a bearer token the API server knows (TokenReview) and RBAC allows
    NONE = "none"  # anyone who reaches the port (the local demo: a browser sends no token)


class Preemption(enum.StrEnum):
    """How GPU preemption happens (docs/scheduler.md, "Preemption")."""

    AUTO = "auto"  # the verb when kube-scheduler calls /preempt; self for GPU-only shortfalls it does not
    VERB = "verb"  # only through kube-scheduler's /preempt call
    SELF = "self"  # only the scheduler's own path (/preempt answers no GPU victims)
    OFF = "off"  # no GPU victims at all


class AdmissionMode(enum.StrEnum):
    """How the webhook admits a GPU pod by default (vgpu.core.dra.mode; docs/dra.md)."""

    EXTENDER = "extender"  # nvidia.com/* limits, placed by the scheduler extender
    DRA = "dra"  # ResourceClaims from our templates, placed by kube-scheduler's DRA plugin


class CorePolicy(enum.StrEnum):
    """HAMi-core's GPU_CORE_UTILIZATION_POLICY: ``default`` sets no env."""

    DEFAULT = "default"
    FORCE = "force"
    DISABLE = "disable"


@dataclass(frozen=True)
class ResourceNames:
    count: str = "nvidia.com/gpu"
    memory: str = "nvidia.com/gpumem"
    memory_percentage: str = "nvidia.com/gpumem-percentage"
    cores: str = "nvidia.com/gpucores"
    priority: str = "nvidia.com/priority"

    def all(self) -> tuple[str, ...]:
        return (self.count, self.memory, self.memory_percentage, self.cores, self.priority)


@dataclass(frozen=True)
class SchedulerConfig:
    scheduler_name: str = "vgpu-scheduler"
    node_policy: Policy = Policy.BINPACK
    gpu_policy: Policy = Policy.SPREAD
    node_lock_timeout_s: float = 60.0
    lease_timeout_s: float = 40.0
    lease_namespace: str = "kube-system"
    reservation_ttl_s: float = 60.0
    bind_lock_wait_s: float = 20.0
    node_label_selector: str = ""
    # the filter prefers nodes with no bind under way (node lock held or a decision not yet bound)
    avoid_busy_nodes: bool = True
    # take each GPU's memory used outside kube-vgpu (the device plugin's annotation) off its free memory
    subtract_outside_usage: bool = True
    # asyncio: requests and watches on the event loop (no threads competing for the GIL with /filter)
    api_client: ApiClient = ApiClient.ASYNCIO
    # API requests at once (threads with apiClient threads); kube-scheduler runs binds concurrently
    api_workers: int = 64
    # process: the Binding, Events and lock writes are made by a helper process (apiClient asyncio)
    api_writer: ApiWriter = ApiWriter.AUTO
    # process: the writes' helper also reads the watch streams (less CPU on the scheduler's core;
    # its events arrive a hop later, see docs/scheduler.md); auto: where the helper runs
    api_watches: ApiWatches = ApiWatches.AUTO
    # the scheduler also writes the hami.io/vgpu-node label after each bind (our device plugin sets it
    # in its bind-phase success write; turn on for a tool that needs it from the moment of the bind)
    label_assigned_pods: bool = False
    # always: HAMi's node lock on every bind; contended: in memory, the annotation only when needed
    node_lock: NodeLock = NodeLock.ALWAYS
    # /metrics: the per-pod series (hami_vgpu_*_allocated_*); false leaves them out at scale
    metrics_pod_series: bool = True
    # ask kube-scheduler (an annotation write) to retry pending pods that fit GPUs which came free or
    # came back since their /filter failed (it would park them; docs/scheduler.md, "Filter retries")
    filter_retries: bool = True
    # kubernetes: /metrics, /ui, /ui/state and /ui/events need a bearer token that the API server
    # authenticates and authorizes (get on the path, RBAC nonResourceURLs); none: open, as in the
    # local demo. /healthz, /readyz and /webhook are never behind it
    views_auth: ViewsAuth = ViewsAuth.KUBERNETES
    # auto, verb, self or off: how a pending GPU pod of higher priority gets room (docs/scheduler.md)
    preemption: Preemption = Preemption.AUTO
    # the self path: preemptions started per minute, cluster-wide (0: none)
    preemptions_per_minute: int = 10
    # the self path never evicts pods of these namespaces
    preemption_excluded_namespaces: tuple[str, ...] = ("kube-system",)
    # the self path: how long after a failed /filter it waits for kube-scheduler's own /preempt call
    preemption_grace_s: float = 2.0
    # the self path: victims not gone after this long release the node, and the pod backs off
    preemption_victim_timeout_s: float = 120.0

    def writes_from_helper(self, *, usable_cpus: float) -> bool:
        """Whether a helper process makes the API writes: ``process``, or ``auto`` with ``asyncio``
        where the scheduler may use ``HELPER_MIN_CPUS`` or more (its CPU limit, its affinity). Below
        that the helper has no core of its own: both processes share the quota, and the frames
        between them cost CPU that writing inline does not."""
        if self.api_writer is ApiWriter.AUTO:
            return self.api_client is ApiClient.ASYNCIO and usable_cpus >= HELPER_MIN_CPUS
        return self.api_writer is ApiWriter.PROCESS

    def watches_from_helper(self, *, usable_cpus: float) -> bool:
        """Whether the writes' helper reads the watch streams: ``apiWatches: process`` or ``auto``
        where the helper runs (``writes_from_helper``)."""
        return self.api_watches is not ApiWatches.INLINE and self.writes_from_helper(usable_cpus=usable_cpus)

    def validate(self, prefix: str) -> None:
        """The section's own rules, once its keys are read (``configload.build``)."""

        def bad(name: str, message: str) -> errors.ConfigError:
            return configload.bad(prefix, name, message)

        for name in ("node_lock_timeout_s", "lease_timeout_s", "reservation_ttl_s", "bind_lock_wait_s"):
            if getattr(self, name) <= 0:
                raise bad(name, "must be greater than 0")
        if self.lease_timeout_s < 1:
            # the device plugin writes it as its Lease's leaseDurationSeconds, whole and above 0
            raise bad("lease_timeout_s", "must be at least 1")
        if not 1 <= self.api_workers <= 512:
            raise bad("api_workers", "must be between 1 and 512")
        if self.api_writer is ApiWriter.PROCESS and self.api_client is not ApiClient.ASYNCIO:
            raise bad("api_writer", "process needs apiClient: asyncio (set apiWriter: inline or auto)")
        if self.api_watches is ApiWatches.PROCESS and (
            self.api_writer is ApiWriter.INLINE or self.api_client is not ApiClient.ASYNCIO
        ):
            raise bad(
                "api_watches",
                "process needs the writes' helper (apiWriter: auto or process, apiClient: asyncio)",
            )
        if self.reservation_ttl_s <= self.bind_lock_wait_s:
            # a decision must outlive a bind that is still waiting for the node lock
            raise bad("reservation_ttl_s", "must be greater than bindLockWaitS")
        if not 0 <= self.preemptions_per_minute <= 6000:
            raise bad("preemptions_per_minute", "must be between 0 and 6000")
        if self.preemption_grace_s < 0:
            raise bad("preemption_grace_s", "must be 0 or more")
        if self.preemption_victim_timeout_s <= 0:
            raise bad("preemption_victim_timeout_s", "must be greater than 0")


@dataclass(frozen=True)
class WebhookConfig:
    default_memory_mib: int = 0
    default_cores: int = 0
    default_gpu_count: int = 1
    max_gpu_count: int = 16
    # init + app containers one pod may have; beyond it the pod is denied (bounds the webhook's work)
    max_containers: int = 1000
    memory_factor: int = 1
    overwrite_env: bool = False
    force_overwrite_default_scheduler: bool = True
    runtime_class_name: str = ""
    gpu_core_policy: CorePolicy = CorePolicy.DEFAULT
    # device type (hami.io/gpu-type value, e.g. NVIDIA or A100) -> RuntimeClass; wins over runtimeClassName
    runtime_class_by_type: dict[str, str] = field(default_factory=dict)
    # a new pod carrying scheduler-internal annotations: denied (false) or admitted with them removed
    strip_forged_annotations: bool = False
    # who may change scheduling annotations after creation (core/guard.py): usernames, e.g. the
    # services' system:serviceaccount:<ns>:<sa> (the chart sets them), and groups (break-glass)
    trusted_users: tuple[str, ...] = ()
    trusted_groups: tuple[str, ...] = ()
    # trusted too, but where the API server names the node of their pod-bound token (userInfo.extra
    # authentication.kubernetes.io/node-name, Kubernetes 1.30+) only for pods on that node and that
    # Node object: the device plugin's service account (the chart sets it)
    node_bound_users: tuple[str, ...] = ()
    # namespaces whose GPU containers may set HAMi-core's control env (CUDA_DEVICE_MEMORY_LIMIT*,
    # CUDA_DEVICE_SM_LIMIT*, LD_PRELOAD, ...: core/controlenv.py); elsewhere such a pod is refused
    allow_control_env_namespaces: tuple[str, ...] = ()
    # the mode of a GPU pod whose annotation and namespace label kube-vgpu.io/mode say none
    default_mode: AdmissionMode = AdmissionMode.EXTENDER
    # DRA mode: how long the webhook waits for a new ResourceClaimTemplate's create before it
    # refuses the pod (the API server's webhook timeout must leave room for it)
    dra_template_wait_s: float = 5.0

    def validate(self, prefix: str) -> None:
        """The section's own rules, once its keys are read (``configload.build``)."""

        def bad(name: str, message: str) -> errors.ConfigError:
            return configload.bad(prefix, name, message)

        if not 0 <= self.default_cores <= 100:
            raise bad("default_cores", "must be between 0 and 100")
        for name in ("default_memory_mib", "default_gpu_count"):
            if getattr(self, name) < 0:
                raise bad(name, "must not be negative")
        if self.max_gpu_count < 1:
            raise bad("max_gpu_count", "must be at least 1")
        if self.default_gpu_count > self.max_gpu_count:
            # the webhook would add a count that it then denies
            raise bad("default_gpu_count", f"must not exceed maxGpuCount ({self.max_gpu_count})")
        if self.max_containers < 1:
            raise bad("max_containers", "must be at least 1")
        if self.memory_factor < 1:
            raise bad("memory_factor", "must be at least 1")
        if self.dra_template_wait_s <= 0:
            raise bad("dra_template_wait_s", "must be greater than 0")
        for device_type, runtime_class in self.runtime_class_by_type.items():
            if not isinstance(runtime_class, str) or not runtime_class:
                raise bad("runtime_class_by_type", f"{device_type}: expected a RuntimeClass name")


@dataclass(frozen=True)
class DevicePluginConfig:
    resource_name: str = "nvidia.com/gpu"
    device_split_count: int = 10
    device_memory_scaling: float = 1.0
    device_core_scaling: float = 1.0
    preconfigured_device_memory_mib: int = 0
    hook_path: str = "/usr/local"
    lib_cuda_log_level: str = ""
    disable_core_limit: bool = False
    enable_numa_topology: bool = False
    lease_renew_s: float = 10.0
    register_interval_s: float = 300.0
    # health: XID events mark a GPU unhealthy; it recovers after a quiet period with passing probes
    health_checks_enabled: bool = True
    ignored_xids: tuple[int, ...] = (13, 31, 43, 45, 68, 109)
    health_recovery_s: float = 60.0
    health_probe_interval_s: float = 5.0
    get_preferred_allocation: bool = True
    # NVIDIA device plugin options (docs/protocol.md#kubelet-device-plugin-api; docs/device-plugin.md)
    device_list_strategy: str = "envvar"  # envvar | volume-mounts | cdi-annotations | cdi-cri
    device_id_strategy: str = "uuid"  # uuid | index
    # where the CDI strategies' own spec (HAMi-core's shared edits, vgpu.core.cdispec) is written,
    # below --host-root: a directory the runtime reads specs from
    cdi_spec_dir: str = "/var/run/cdi"
    pass_device_specs: bool = False
    gds_enabled: bool = False
    mofed_enabled: bool = False
    gdrcopy_enabled: bool = False
    mig_strategy: str = "none"  # none | single | mixed
    filter_device_uuids: tuple[str, ...] = ()
    filter_device_indexes: tuple[int, ...] = ()
    start_retry_s: float = 30.0
    kubelet_poll_s: float = 1.0
    allocate_timeout_s: float = 5.0
    # GPU memory used outside kube-vgpu (vgpu.core.outside): measured every interval, published
    # in <prefix>/node-nvidia-outside-usage when a GPU's figure moves by more than the step
    outside_usage_enabled: bool = True
    outside_usage_interval_s: float = 5.0
    outside_usage_step_mib: int = 256

    def validate(self, prefix: str) -> None:
        """The section's own rules, once its keys are read (``configload.build``)."""

        def bad(name: str, message: str) -> errors.ConfigError:
            return configload.bad(prefix, name, message)

        if self.device_split_count < 1:
            raise bad("device_split_count", "must be at least 1")
        if self.device_memory_scaling <= 0:
            raise bad("device_memory_scaling", "must be greater than 0")
        if self.device_core_scaling <= 0:
            raise bad("device_core_scaling", "must be greater than 0")
        for name in ("hook_path", "cdi_spec_dir"):
            if not getattr(self, name).startswith("/"):
                raise bad(name, f"must be an absolute path, got {getattr(self, name)!r}")
        choices = {
            "device_list_strategy": ("envvar", "volume-mounts", "cdi-annotations", "cdi-cri"),
            "device_id_strategy": ("uuid", "index"),
            "mig_strategy": ("none", "single", "mixed"),
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise bad(name, f"{getattr(self, name)!r} is not one of {', '.join(allowed)}")
        for name in (
            "lease_renew_s",
            "register_interval_s",
            "health_recovery_s",
            "health_probe_interval_s",
            "start_retry_s",
            "kubelet_poll_s",
            "allocate_timeout_s",
            "outside_usage_interval_s",
        ):
            if getattr(self, name) <= 0:
                raise bad(name, "must be greater than 0")
        if self.outside_usage_step_mib < 0:
            raise bad("outside_usage_step_mib", "must not be negative")
        if self.preconfigured_device_memory_mib < 0:
            raise bad("preconfigured_device_memory_mib", "must not be negative")


@dataclass(frozen=True)
class Config:
    resources: ResourceNames = field(default_factory=ResourceNames)
    annotation_prefix: str = "hami.io"
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    webhook: WebhookConfig = field(default_factory=WebhookConfig)
    device_plugin: DevicePluginConfig = field(default_factory=DevicePluginConfig)
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)

    def for_node(self, node: str) -> DevicePluginConfig:
        """The device-plugin section with ``nodes.<node>`` overrides applied."""
        override = self.nodes.get(node)
        if not override:
            return self.device_plugin
        return configload.merge(self.device_plugin, override, f"nodes.{node}")

    def validate(self, prefix: str) -> None:
        """The section's own rules, once its keys are read (``configload.build``)."""

        def bad(name: str, message: str) -> errors.ConfigError:
            return configload.bad(prefix, name, message)

        if not is_dns_subdomain(self.annotation_prefix):
            # the prefix of annotation and label keys: the API server refuses every write of another
            raise bad(
                "annotation_prefix",
                f"must be a DNS subdomain such as hami.io, got {self.annotation_prefix!r}",
            )
        sections = [("devicePlugin", self.device_plugin)]
        for node, override in self.nodes.items():
            if not isinstance(override, Mapping):
                raise errors.ConfigError(f"nodes.{node}", "expected a mapping of devicePlugin keys")
            sections.append(
                (f"nodes.{node}", configload.merge(self.device_plugin, override, f"nodes.{node}"))
            )
        timeout_s = self.scheduler.lease_timeout_s
        for where, section in sections:
            if section.lease_renew_s >= timeout_s:
                # the Lease would expire between renewals: the scheduler would see the node die and come back
                raise errors.ConfigError(
                    f"{where}.leaseRenewS", f"must be below scheduler.leaseTimeoutS ({timeout_s:g})"
                )


def load(raw: Any) -> Config:
    """Build a Config from parsed YAML (None or {} gives the defaults)."""
    return configload.build(Config, raw, "")


def to_dict(config: object) -> dict[str, Any]:
    """The config as camelCase plain data (for logging the resolved config at start)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(config):  # type: ignore[arg-type]
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value):
            value = to_dict(value)
        elif isinstance(value, enum.Enum):
            value = value.value
        elif isinstance(value, tuple):
            value = list(value)
        out[configload.camel(f.name)] = value
    return out
