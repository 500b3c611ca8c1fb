"""kube-vgpu's own CDI spec: HAMi-core's container edits that every GPU container of a node shares.

With ``deviceListStrategy: cdi-annotations`` or ``cdi-cri`` the runtime builds a GPU container from
CDI specs (``/etc/cdi``, ``/var/run/cdi``). A GPU's own spec (kind ``nvidia.com/gpu``: device
nodes, the driver's libraries, the toolkit's hooks) comes from the NVIDIA Container Toolkit
(``nvidia-ctk cdi generate``): only it discovers those, and a second spec of that kind would
conflict with it. What is ours is HAMi-core: the library, ``/etc/ld.so.preload`` and the lock
directory mounts and the env the config sets are the same for every container
(``allocation.shared_edits``), so they go in a spec of our own kind, ``kube-vgpu.io/hami-core``,
with one device, ``shared``; the Allocate answer names ``kube-vgpu.io/hami-core=shared`` next to
``nvidia.com/gpu=<id>`` and keeps only what differs per container (the limits, the cache dir).

``cdiVersion`` is 0.3.0, the earliest the CDI library (``tags.cncf.io/container-device-interface``)
loads: containerd 1.7 and CRI-O ≥ 1.23 vendor libraries that read it, and a spec whose version is
newer than its reader knows is rejected whole. The edits used (env, mounts with options) exist
since 0.3.0; a device name starting with a digit would need 0.5.0, a dot in the kind's name
segment 0.6.0. ``validate`` checks a document against those rules and the required fields (the
library refuses a spec with no devices, a device without a name or with empty edits, an env entry
without ``=``, a mount without paths). Pure: the caller reads the host and writes the file.
"""

import json
import re
from collections.abc import Collection, Mapping
from typing import Any

from vgpu.core import allocation
from vgpu.core.config import DevicePluginConfig

VENDOR = "kube-vgpu.io"
CLASS = "hami-core"
KIND = f"{VENDOR}/{CLASS}"
DEVICE = "shared"
QUALIFIED_NAME = f"{KIND}={DEVICE}"
CDI_VERSION = "0.3.0"
FILE_NAME = f"{VENDOR}-{CLASS}.json"  # the library's own naming: <vendor>-<class>.<ext>
STRATEGIES = ("cdi-annotations", "cdi-cri")

KNOWN_VERSIONS = ("0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0")
_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_VENDOR = re.compile(rf"^[a-z]([-a-z0-9]*[a-z0-9])?(\.{_LABEL})*$")
_CLASS = re.compile(r"^[A-Za-z]([A-Za-z0-9_.-]*[A-Za-z0-9])?$")
_DEVICE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?$")
_EDIT_KEYS = ("env", "deviceNodes", "hooks", "mounts")


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split("."))


def select(
    config: DevicePluginConfig, *, present: Collection[str]
) -> tuple[allocation.SharedEdits | None, list[allocation.Mount]]:
    """The shared edits to write, keeping only mounts whose host path is in ``present``, and the
    mounts left out. None when nothing is left (a device with empty edits is not a valid spec)."""
    envs, mounts = allocation.shared_edits(config)
    kept = tuple(m for m in mounts if m.host_path in present)
    missing = [m for m in mounts if m.host_path not in present]
    if not kept and not envs:
        return None, missing
    return allocation.SharedEdits(QUALIFIED_NAME, envs=tuple(sorted(envs.items())), mounts=kept), missing


def document(edits: allocation.SharedEdits) -> dict[str, Any]:
    """The spec carrying ``edits`` as device ``shared`` of kind ``kube-vgpu.io/hami-core``."""
    container_edits: dict[str, Any] = {}
    if edits.envs:
        container_edits["env"] = [f"{k}={v}" for k, v in edits.envs]
    if edits.mounts:
        container_edits["mounts"] = [
            {
                "hostPath": m.host_path,
                "containerPath": m.container_path,
                # a bind mount: without "bind" and with no type runc would not know what to mount
                "options": ["ro" if m.read_only else "rw", "nosuid", "nodev", "bind"],
            }
            for m in edits.mounts
        ]
    return {
        "cdiVersion": CDI_VERSION,
        "kind": KIND,
        "devices": [{"name": DEVICE, "containerEdits": container_edits}],
    }


def encode(doc: Mapping[str, Any]) -> str:
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def _kind_problems(kind: object, version: tuple[int, ...]) -> list[str]:
    if not isinstance(kind, str) or kind.count("/") != 1:
        return [f"kind {kind!r} is not <vendor>/<class>"]
    vendor, cls = kind.split("/")
    problems = []
    if len(vendor) > 253 or not _VENDOR.match(vendor):
        problems.append(f"kind {kind!r}: vendor {vendor!r} is not a DNS subdomain starting with a letter")
    if len(cls) > 63 or not _CLASS.match(cls):
        problems.append(f"kind {kind!r}: class {cls!r} is not a letter then letters, digits, '-', '_'")
    elif "." in cls and version < (0, 6, 0):
        problems.append(f"kind {kind!r}: a dot in the class needs cdiVersion 0.6.0")
    return problems


def _device_problems(device: object, version: tuple[int, ...], seen: set[str]) -> list[str]:
    if not isinstance(device, Mapping):
        return [f"device {device!r} is not an object"]
    name = device.get("name")
    if not isinstance(name, str) or not _DEVICE.match(name):
        return [f"device name {name!r} is not letters, digits, '-', '_', '.', ':' (alphanumeric ends)"]
    problems = []
    if name in seen:
        problems.append(f"device {name!r} is defined twice")
    seen.add(name)
    if name[0].isdigit() and version < (0, 5, 0):
        problems.append(f"device {name!r}: a name starting with a digit needs cdiVersion 0.5.0")
    edits = device.get("containerEdits")
    if not isinstance(edits, Mapping) or not any(edits.get(k) for k in _EDIT_KEYS):
        return [*problems, f"device {name!r} has no containerEdits"]
    return problems + [f"device {name!r}: {p}" for p in _edit_problems(edits)]


def _edit_problems(edits: Mapping[str, Any]) -> list[str]:
    problems = []
    env = edits.get("env") or []
    if not isinstance(env, list):
        return [f"env {env!r} is not a list"]
    for entry in env:
        if not isinstance(entry, str) or not entry.split("=", 1)[0] or "=" not in entry:
            problems.append(f"env entry {entry!r} is not NAME=value")
    mounts = edits.get("mounts") or []
    if not isinstance(mounts, list):
        return [*problems, f"mounts {mounts!r} is not a list"]
    for mount in mounts:
        if not isinstance(mount, Mapping):
            problems.append(f"mount {mount!r} is not an object")
            continue
        for key in ("hostPath", "containerPath"):
            path = mount.get(key)
            if not isinstance(path, str) or not path.startswith("/"):
                problems.append(f"mount {key} {path!r} is not an absolute path")
        options = mount.get("options", [])
        if not isinstance(options, list) or not all(isinstance(o, str) for o in options):
            problems.append(f"mount options {options!r} are not a list of strings")
    return problems


def validate(doc: object) -> list[str]:
    """What makes ``doc`` (decoded JSON or YAML) an invalid CDI spec; [] when it is valid."""
    if not isinstance(doc, Mapping):
        return ["the spec is not an object"]
    raw_version = doc.get("cdiVersion")
    if raw_version not in KNOWN_VERSIONS:
        return [f"cdiVersion {raw_version!r} is not one of {', '.join(KNOWN_VERSIONS)}"]
    version = _version(str(raw_version))
    problems = _kind_problems(doc.get("kind"), version)
    devices = doc.get("devices")
    if not isinstance(devices, list) or not devices:
        return [*problems, "devices must be a non-empty list"]
    seen: set[str] = set()
    for device in devices:
        problems += _device_problems(device, version, seen)
    top = doc.get("containerEdits")
    if top is not None:
        problems += (
            [f"containerEdits: {p}" for p in _edit_problems(top)]
            if isinstance(top, Mapping)
            else ["containerEdits is not an object"]
        )
    return problems


def device_edits(doc: Mapping[str, Any], name: str) -> list[Mapping[str, Any]]:
    """The edits a runtime applies for device ``name`` of a valid spec: the spec's own, then the
    device's ([] when the spec has no such device)."""
    for device in doc.get("devices") or []:
        if device.get("name") == name:
            return [e for e in (doc.get("containerEdits"), device.get("containerEdits")) if e]
    return []
