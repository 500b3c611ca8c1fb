"""The names kube-vgpu's DRA mode publishes and every side (device plugin, scheduler service, local
cluster, views) reads: the driver, its DeviceClass, the capacities and attributes of a GPU device,
the kubelet plugin's sockets and the CDI kind of a prepared claim. Changing one is a wire change."""

from __future__ import annotations

from typing import Final

DRIVER: Final = "gpu.kube-vgpu.io"
"""The DRA driver name: ResourceSlices' ``spec.driver``, allocation results' ``driver``, the name the
kubelet plugin registers under."""

DEVICE_CLASS: Final = "gpu.kube-vgpu.io"
"""The DeviceClass the chart installs; it selects every device of :data:`DRIVER`."""

CAPACITY_MEMORY: Final = "memory"
"""Device capacity: GPU memory, a quantity in bytes as Kubernetes writes it (``81559Mi``)."""

CAPACITY_CORES: Final = "cores"
"""Device capacity: streaming-multiprocessor share in percent (``100``); HAMi's ``gpucores``. Every
share consumes at least 1, so a claim asking ``100`` needs an idle GPU and a GPU whose cores are all
taken takes no one (HAMi's extender rules)."""

CAPACITY_SLOTS: Final = "slots"
"""Device capacity: how many shares the GPU takes at most, the node's ``deviceSplitCount``; each
share consumes exactly 1 (HAMi's per-GPU sharer limit)."""

ATTR_UUID: Final = "uuid"
ATTR_MODEL: Final = "model"
ATTR_INDEX: Final = "index"
ATTR_NUMA: Final = "numaNode"
ATTR_MIG: Final = "migEnabled"
ATTR_DRIVER_VERSION: Final = "driverVersion"
ATTR_MEMORY_MIB: Final = "memoryMiB"

DEVICE_PREFIX: Final = "gpu-"
"""A published device is named ``gpu-<index>`` (a DNS label), its pool is the node's name."""

UNHEALTHY_TAINT_KEY: Final = "gpu.kube-vgpu.io/unhealthy"

MODE_ANNOTATION: Final = "kube-vgpu.io/mode"
"""Pod annotation: ``dra`` or ``extender``; the webhook writes the mode it admitted the pod in."""

MODE_DRA: Final = "dra"
MODE_EXTENDER: Final = "extender"

CLAIM_PREFIX: Final = "vgpu-"
"""Pod ``resourceClaims`` entries the webhook adds are named ``vgpu-<container index>``."""

TEMPLATE_LABEL: Final = "kube-vgpu.io/claim-template"
"""Label on the ResourceClaimTemplates the scheduler service keeps (value ``"true"``)."""

REGISTRATION_DIR: Final = "/var/lib/kubelet/plugins_registry"
PLUGIN_DIR: Final = "/var/lib/kubelet/plugins/" + DRIVER
REGISTRATION_SOCKET: Final = DRIVER + "-reg.sock"
DRA_SOCKET: Final = "dra.sock"

KUBELET_SERVICES: Final = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
"""What the plugin's GetInfo lists as supported versions: kubelet picks the first it knows."""

CDI_KIND: Final = "kube-vgpu.io/claim"
"""CDI kind of a prepared claim's devices: ``kube-vgpu.io/claim=<claim uid>-<request>``."""


def device_name(index: int) -> str:
    """The published name of the GPU with NVML index ``index``."""
    return f"{DEVICE_PREFIX}{index}"


def claim_name(container_index: int) -> str:
    """The pod-level claim name the webhook gives container ``container_index``'s GPUs."""
    return f"{CLAIM_PREFIX}{container_index}"


def cdi_device(claim_uid: str, request: str) -> str:
    """The CDI device name (the part after ``=``) for one request of one prepared claim. A
    ``firstAvailable`` request's result names ``<request>/<subrequest>``; CDI names allow no ``/``."""
    return f"{claim_uid}-{request.replace('/', '-')}"
