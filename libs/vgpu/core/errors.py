"""The one error tree of kube-vgpu. Foreign errors are translated into it at the adapter edge.

VgpuError
├── ParseError            external input that does not parse; ``field`` names what was bad
│   ├── QuantityError     a Kubernetes quantity ("4Gi", "16G", "4000")
│   ├── AnnotationError   a HAMi annotation (register, pod devices, lock, handshake)
│   └── RequestError      a container's GPU request (resources, user annotations)
├── ConfigError           the YAML configuration; ``field`` is the dotted key
├── KubeError             the API server answered with an error (adapters raise these)
│   ├── NotFound          404
│   ├── Conflict          409: a stale resourceVersion or an object that already exists
│   ├── Gone              410: a watch resourceVersion too old; re-list
│   └── TooManyRequests   429: e.g. an eviction a PodDisruptionBudget forbids now
├── GpuBackendError       the GPU backend (NVML or fake) failed
├── AllocationError       a device-plugin Allocate that cannot be served
└── SchedulingError       a filter/bind that cannot be served
"""

from __future__ import annotations


class VgpuError(Exception):
    """Root of every error kube-vgpu raises on purpose."""


class ParseError(VgpuError):
    """External input that does not parse. ``field`` names the offending field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class QuantityError(ParseError):
    """A Kubernetes resource quantity that is not valid."""


class AnnotationError(ParseError):
    """A HAMi annotation value that does not decode."""


class RequestError(ParseError):
    """A container's GPU request that is invalid."""


class ConfigError(ParseError):
    """A configuration file or value that is invalid; ``field`` is the dotted key."""


class KubeError(VgpuError):
    """An API server error. ``status`` is the HTTP code (0 when the server was not reached)."""

    def __init__(self, message: str, *, status: int = 0, reason: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason


class NotFound(KubeError):
    """The object does not exist (404)."""


class Conflict(KubeError):
    """Optimistic-concurrency conflict or already exists (409)."""


class Gone(KubeError):
    """The watch's resourceVersion is too old (410); the caller must re-list."""


class TooManyRequests(KubeError):
    """Refused for now (429): an eviction that a PodDisruptionBudget does not allow at the moment."""


class GpuBackendError(VgpuError):
    """The GPU backend (NVML, fake) failed."""


class AllocationError(VgpuError):
    """A device-plugin Allocate that cannot be served; the message names the pod and why."""


class SchedulingError(VgpuError):
    """A filter or bind that cannot be served."""
