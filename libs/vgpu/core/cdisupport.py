"""Whether this node's kubelet passes the CDI device names of the ``cdi-cri`` strategy on.

``cdi-cri`` answers Allocate with ``cdi_devices`` (``ContainerAllocateResponse.cdi_devices``, field
5), which kubelet forwards to the runtime in the CRI's ``CDIDevices`` only from 1.28 (KEP-4009,
feature gate ``DevicePluginCDIDevices``: alpha and off by default in 1.28, beta and on in 1.29, GA
in 1.31). An older kubelet drops the field without a word and the container starts with no GPU;
so such a node is refused with a reason, and 1.28 (where the gate may be off) is warned about.
``cdi-annotations`` works on any kubelet (it needs a runtime that reads ``cdi.k8s.io/`` annotations:
containerd ≥ 1.7 with ``enable_cdi``, CRI-O ≥ 1.23); ``envvar`` and ``volume-mounts`` need the
NVIDIA container runtime. Pure: the caller reads ``status.nodeInfo.kubeletVersion``.
"""

import re
from dataclasses import dataclass
from typing import Literal

CDI_CRI_MIN = (1, 28)
CDI_CRI_DEFAULT_ON = (1, 29)

_VERSION = re.compile(r"^v?(\d+)\.(\d+)(?:\.\d+)?(?:[-+].*)?$")


def parse_minor(version: str) -> tuple[int, int] | None:
    """``v1.28.3``, ``v1.27.3-eks-2f008fe``, ``v1.29.0+k3s1`` → (1, 28); anything else → None."""
    match = _VERSION.match(version.strip()) if isinstance(version, str) else None
    if match is None:
        return None
    return int(match.group(1)), int(match.group(2))


@dataclass(frozen=True)
class Verdict:
    level: Literal["ok", "warn", "refuse"]
    message: str = ""


def check(strategy: str, kubelet_version: str | None) -> Verdict:
    """Whether ``strategy`` works with the kubelet of ``kubelet_version`` (None: not known yet)."""
    if strategy != "cdi-cri":
        return Verdict("ok")
    minor = parse_minor(kubelet_version) if kubelet_version else None
    if minor is None:
        return Verdict(
            "warn",
            f"deviceListStrategy cdi-cri needs kubelet >= 1.28 (DevicePluginCDIDevices); this node's kubelet "
            f"version is {kubelet_version or 'unknown'}: not checked",
        )
    shown = f"v{minor[0]}.{minor[1]}"
    if minor < CDI_CRI_MIN:
        return Verdict(
            "refuse",
            f"deviceListStrategy cdi-cri needs kubelet >= 1.28 (DevicePluginCDIDevices); this node's kubelet is "
            f"{kubelet_version}, which drops cdi_devices and would start the container without its GPU: use "
            f"cdi-annotations or envvar on this node (nodes.<node>.devicePlugin.deviceListStrategy)",
        )
    if minor < CDI_CRI_DEFAULT_ON:
        return Verdict(
            "warn",
            f"deviceListStrategy cdi-cri on kubelet {shown} works only with --feature-gates="
            f"DevicePluginCDIDevices=true (alpha in 1.28, on by default from 1.29); without it the container "
            f"starts without its GPU",
        )
    return Verdict("ok")


CDI_SPEC_DIRS = ("/etc/cdi", "/var/run/cdi")  # the runtimes' default spec directories


def spec_device_names(doc: object, *, kind: str) -> set[str]:
    """The device names a CDI spec document (decoded JSON or YAML) defines for ``kind``; nothing
    for another kind or a document that is not a spec."""
    if not isinstance(doc, dict) or doc.get("kind") != kind:
        return set()
    devices = doc.get("devices")
    if not isinstance(devices, list):
        return set()
    return {d["name"] for d in devices if isinstance(d, dict) and isinstance(d.get("name"), str)}


def missing_spec_message(strategy: str, *, kind: str, missing: list[str]) -> str:
    shown = ", ".join(f"{kind}={name}" for name in missing[:8]) + (" ..." if len(missing) > 8 else "")
    return (
        f"deviceListStrategy {strategy} hands out CDI devices that no spec in {' or '.join(CDI_SPEC_DIRS)} "
        f"defines ({shown}): the runtime would fail to create those containers (unresolvable CDI devices). "
        f"The NVIDIA Container Toolkit writes the spec: nvidia-ctk cdi generate --output=/var/run/cdi/nvidia.yaml "
        f"(the GPU Operator does it for you)"
    )
