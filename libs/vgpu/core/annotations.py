"""The HAMi annotation codec (PROTOCOL.md F): the protocol between our scheduler and device plugin.

Every decoder takes the raw annotation string and returns typed values, or raises one
``AnnotationError`` whose ``field`` names the annotation key (and element) that was bad.
"""

from __future__ import annotations

import datetime
import enum
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from vgpu.core import errors
from vgpu.core.device import COMMON_TYPE, Gpu, GpuUuid, MigPlacement, MigProfile, Mode

DEFAULT_PREFIX = "hami.io"


@dataclass(frozen=True)
class Keys:
    """Annotation keys under one prefix (``hami.io`` by default, configurable)."""

    prefix: str = DEFAULT_PREFIX

    @property
    def node_register(self) -> str:
        return f"{self.prefix}/node-nvidia-register"

    @property
    def node_handshake(self) -> str:
        return f"{self.prefix}/node-handshake"

    @property
    def node_lock(self) -> str:
        return f"{self.prefix}/mutex.lock"

    @property
    def node_plugin_error(self) -> str:
        """Ours, not HAMi's: why the node's device plugin runs with zero devices (absent when fine)."""
        return f"{self.prefix}/node-nvidia-plugin-error"

    @property
    def node_outside_usage(self) -> str:
        """Ours, not HAMi's: GPU memory (MiB per GPU UUID) used outside kube-vgpu (vgpu.core.outside)."""
        return f"{self.prefix}/node-nvidia-outside-usage"

    @property
    def device_cordon(self) -> str:
        return f"{self.prefix}/device-cordon"

    @property
    def assigned_node(self) -> str:
        return f"{self.prefix}/vgpu-node"

    @property
    def assigned_time(self) -> str:
        return f"{self.prefix}/vgpu-time"

    @property
    def devices_to_allocate(self) -> str:
        return f"{self.prefix}/vgpu-devices-to-allocate"

    @property
    def devices_allocated(self) -> str:
        return f"{self.prefix}/vgpu-devices-allocated"

    @property
    def bind_phase(self) -> str:
        return f"{self.prefix}/bind-phase"

    @property
    def bind_time(self) -> str:
        return f"{self.prefix}/bind-time"

    @property
    def node_policy(self) -> str:
        return f"{self.prefix}/node-scheduler-policy"

    @property
    def gpu_policy(self) -> str:
        return f"{self.prefix}/gpu-scheduler-policy"

    @property
    def webhook_ignore_label(self) -> str:
        return f"{self.prefix}/webhook"

    def internal_pod_keys(self) -> tuple[str, ...]:
        """The pod annotations only the scheduler and device plugin may write (anti-forgery)."""
        return (
            self.assigned_node,
            self.assigned_time,
            self.devices_to_allocate,
            self.devices_allocated,
            self.bind_phase,
            self.bind_time,
        )


KEYS = Keys()


class BindPhase(enum.StrEnum):
    ALLOCATING = "allocating"
    SUCCESS = "success"
    FAILED = "failed"


def decode_bind_phase(raw: str, *, field: str = "bind-phase") -> BindPhase:
    try:
        return BindPhase(raw)
    except ValueError:
        raise errors.AnnotationError(
            field, f"unknown bind phase {raw!r}: expected allocating, success or failed"
        ) from None


# --- node register annotation (F.2) ---------------------------------------------------------------

_REGISTER_FIELD = "hami.io/node-nvidia-register"


def encode_node_register(gpus: Sequence[Gpu]) -> str:
    """HAMi v2.10's JSON: key order id, index, count, devmem, devcore, type, numa, mode,
    migProfiles, health, with Go's ``omitempty`` (zero values left out)."""
    items = []
    for gpu in gpus:
        item: dict[str, Any] = {"id": gpu.uuid}
        if gpu.index:
            item["index"] = gpu.index
        if gpu.count:
            item["count"] = gpu.count
        if gpu.memory_mib:
            item["devmem"] = gpu.memory_mib
        if gpu.cores:
            item["devcore"] = gpu.cores
        if gpu.type:
            item["type"] = gpu.type
        if gpu.numa:
            item["numa"] = gpu.numa
        item["mode"] = str(gpu.mode)
        if gpu.mig_profiles:
            item["migProfiles"] = [_encode_mig_profile(p) for p in gpu.mig_profiles]
        if gpu.health:
            item["health"] = True
        items.append(item)
    return json.dumps(items, separators=(",", ":"))


def _encode_mig_profile(profile: MigProfile) -> dict[str, Any]:
    out: dict[str, Any] = {"name": profile.name, "memoryMB": profile.memory_mib, "core": profile.cores}
    out["sliceCount"] = profile.slice_count
    if profile.placements:
        out["placements"] = [{"start": p.start, "size": p.size} for p in profile.placements]
    return out


def decode_node_register(raw: object) -> list[Gpu]:
    """Decode the register annotation: HAMi's JSON (v2.8+) or the legacy colon/comma form."""
    if not isinstance(raw, str):
        raise errors.AnnotationError(_REGISTER_FIELD, f"expected a string, got {type(raw).__name__}")
    text = raw.strip()
    if text.startswith(("[", "{")):
        return _decode_register_json(text)
    return _decode_register_legacy(text)


INT32_MAX = 2**31 - 1  # HAMi's device fields are Go int32s


def _want_int(obj: dict[str, Any], key: str, field: str, default: int = 0) -> int:
    value = obj.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise errors.AnnotationError(f"{field}.{key}", f"expected an integer, got {str(value)[:40]!r}")
    if abs(value) > INT32_MAX:
        raise errors.AnnotationError(f"{field}.{key}", "integer out of range (a 32-bit integer)")
    return value


def _want_str(obj: dict[str, Any], key: str, field: str, default: str = "") -> str:
    value = obj.get(key, default)
    if not isinstance(value, str):
        raise errors.AnnotationError(f"{field}.{key}", f"expected a string, got {value!r}")
    return value


def _decode_register_json(text: str) -> list[Gpu]:
    try:
        items = json.loads(text)
    except json.JSONDecodeError as exc:
        raise errors.AnnotationError(_REGISTER_FIELD, f"invalid JSON: {exc.msg} at {exc.pos}") from None
    except (ValueError, RecursionError) as exc:  # a 4,300-digit integer, nesting too deep
        raise errors.AnnotationError(_REGISTER_FIELD, f"invalid JSON: {exc}") from None
    if not isinstance(items, list):
        raise errors.AnnotationError(_REGISTER_FIELD, "expected a JSON array of devices")
    if not items:
        raise errors.AnnotationError(_REGISTER_FIELD, "no gpu found on node")
    gpus: list[Gpu] = []
    for i, item in enumerate(items):
        field = f"{_REGISTER_FIELD}[{i}]"
        if not isinstance(item, dict):
            raise errors.AnnotationError(field, f"expected an object, got {item!r}")
        uuid = _want_str(item, "id", field)
        if not uuid:
            raise errors.AnnotationError(f"{field}.id", "missing GPU UUID")
        health = item.get("health", False)
        if not isinstance(health, bool):
            raise errors.AnnotationError(f"{field}.health", f"expected a boolean, got {health!r}")
        mode_raw = _want_str(item, "mode", field, Mode.HAMI_CORE.value) or Mode.HAMI_CORE.value
        try:
            mode = Mode(mode_raw)
        except ValueError:
            raise errors.AnnotationError(f"{field}.mode", f"unknown mode {mode_raw!r}") from None
        gpu = Gpu(
            uuid=GpuUuid(uuid),
            index=_want_int(item, "index", field),
            count=_want_int(item, "count", field),
            memory_mib=_want_int(item, "devmem", field),
            cores=_want_int(item, "devcore", field),
            type=_want_str(item, "type", field),
            numa=_want_int(item, "numa", field),
            mode=mode,
            health=health,
            mig_profiles=_decode_mig_profiles(item.get("migProfiles"), f"{field}.migProfiles"),
        )
        for name in ("count", "memory_mib", "cores", "index"):
            if getattr(gpu, name) < 0:
                raise errors.AnnotationError(f"{field}.{name}", "must not be negative")
        gpus.append(gpu)
    _check_unique(gpus)
    return gpus


def _decode_mig_profiles(raw: Any, field: str) -> tuple[MigProfile, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise errors.AnnotationError(field, "expected a list")
    out = []
    for i, item in enumerate(raw):
        f = f"{field}[{i}]"
        if not isinstance(item, dict):
            raise errors.AnnotationError(f, "expected an object")
        placements_raw = item.get("placements") or []
        if not isinstance(placements_raw, list):
            raise errors.AnnotationError(f"{f}.placements", "expected a list")
        placements = []
        for j, p in enumerate(placements_raw):
            if not isinstance(p, dict):
                raise errors.AnnotationError(f"{f}.placements[{j}]", "expected an object")
            placements.append(
                MigPlacement(_want_int(p, "start", f"{f}.placements[{j}]"), _want_int(p, "size", f))
            )
        out.append(
            MigProfile(
                name=_want_str(item, "name", f),
                memory_mib=_want_int(item, "memoryMB", f),
                cores=_want_int(item, "core", f),
                slice_count=_want_int(item, "sliceCount", f),
                placements=tuple(placements),
            )
        )
    return tuple(out)


def _check_unique(gpus: list[Gpu]) -> None:
    seen: set[str] = set()
    for gpu in gpus:
        if gpu.uuid in seen:
            raise errors.AnnotationError(_REGISTER_FIELD, f"duplicate GPU UUID {gpu.uuid}")
        seen.add(gpu.uuid)


def _parse_int(text: str, field: str) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise errors.AnnotationError(field, f"invalid integer {text[:40]!r}") from None
    if abs(value) > INT32_MAX:
        raise errors.AnnotationError(field, "integer out of range (a 32-bit integer)")
    return value


def _parse_bool(text: str, field: str) -> bool:
    # Go's strconv.ParseBool
    if text in ("1", "t", "T", "TRUE", "true", "True"):
        return True
    if text in ("0", "f", "F", "FALSE", "false", "False"):
        return False
    raise errors.AnnotationError(field, f"invalid boolean {text!r}")


def _decode_register_legacy(text: str) -> list[Gpu]:
    if ":" not in text:
        raise errors.AnnotationError(_REGISTER_FIELD, "node annotation missing device separator ':'")
    gpus: list[Gpu] = []
    for i, segment in enumerate(text.split(":")):
        if not segment:
            continue
        field = f"{_REGISTER_FIELD}[{i}]"
        if "," not in segment:
            raise errors.AnnotationError(field, f"malformed node annotation segment {segment!r}")
        parts = segment.split(",")
        if len(parts) not in (7, 9):
            raise errors.AnnotationError(field, f"unexpected field count {len(parts)} in node annotation")
        index, mode = 0, Mode.HAMI_CORE
        if len(parts) == 9:
            index = _parse_int(parts[7], f"{field}.index")
            try:
                mode = Mode(parts[8] or Mode.HAMI_CORE.value)
            except ValueError:
                raise errors.AnnotationError(f"{field}.mode", f"unknown mode {parts[8]!r}") from None
        gpus.append(
            Gpu(
                uuid=GpuUuid(parts[0]),
                index=index,
                count=_parse_int(parts[1], f"{field}.count"),
                memory_mib=_parse_int(parts[2], f"{field}.devmem"),
                cores=_parse_int(parts[3], f"{field}.devcore"),
                type=parts[4],
                numa=_parse_int(parts[5], f"{field}.numa"),
                mode=mode,
                health=_parse_bool(parts[6], f"{field}.health"),
            )
        )
    _check_unique(gpus)
    return gpus


def encode_node_register_legacy(gpus: Sequence[Gpu]) -> str:
    """The pre-v2.8 colon form, always 9 fields (what HAMi's encoder wrote)."""
    return "".join(
        f"{g.uuid},{g.count},{g.memory_mib},{g.cores},{g.type},{g.numa},{str(g.health).lower()},"
        f"{g.index},{g.mode}:"
        for g in gpus
    )


# --- pod device string (F.5) ---------------------------------------------------------------------


@dataclass(frozen=True)
class ContainerDevice:
    """One GPU handed to one container: memory MiB and cores percent on that GPU."""

    uuid: GpuUuid
    memory_mib: int
    cores: int
    type: str = COMMON_TYPE


ContainerDevices = tuple[ContainerDevice, ...]
PodDevices = tuple[ContainerDevices, ...]  # one entry per container: init containers first


def encode_pod_devices(pod: PodDevices) -> str:
    """``uuid,TYPE,mem,cores:`` per device, ``;`` after every container; () encodes to ""."""
    return "".join(
        "".join(f"{d.uuid},{d.type},{d.memory_mib},{d.cores}:" for d in container) + ";" for container in pod
    )


def decode_pod_devices(raw: str, *, field: str = "hami.io/vgpu-devices-to-allocate") -> PodDevices:
    """Inverse of ``encode_pod_devices``.

    Unlike HAMi, the one empty piece after the final ``;`` is not a container, so
    ``encode(decode(s)) == s`` (HAMi appends a ``;`` per round trip, PROTOCOL.md F.5).
    """
    if raw == "":
        return ()
    pieces = raw.split(";")
    if raw.endswith(";"):
        pieces.pop()
    out: list[ContainerDevices] = []
    for ci, piece in enumerate(pieces):
        devices: list[ContainerDevice] = []
        for di, item in enumerate(piece.split(":")):
            if "," not in item:
                continue
            f = f"{field}[container {ci}][device {di}]"
            parts = item.split(",")
            if len(parts) < 4:
                raise errors.AnnotationError(
                    f, "pod annotation format error, missing fields, do not use nodeName in task spec"
                )
            if not parts[0]:
                raise errors.AnnotationError(f, "empty GPU UUID")
            memory = _parse_int(parts[2], f"{f}.memory")
            cores = _parse_int(parts[3], f"{f}.cores")
            if memory < 0 or cores < 0:
                raise errors.AnnotationError(f, "memory and cores must not be negative")
            devices.append(ContainerDevice(GpuUuid(parts[0]), memory, cores, parts[1]))
        out.append(tuple(devices))
    return tuple(out)


# --- node lock (F.7) -----------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeLock:
    """``<RFC3339>,<namespace>,<pod>``; the legacy value is the bare time (namespace/pod empty)."""

    time: datetime.datetime
    namespace: str = ""
    pod: str = ""

    @property
    def legacy(self) -> bool:
        return not self.pod

    def held_by(self, namespace: str, pod: str) -> bool:
        return self.namespace == namespace and self.pod == pod


def format_rfc3339(when: datetime.datetime) -> str:
    """Go's time.RFC3339 for a UTC time: ``2026-08-21T06:20:39Z``."""
    when = when.astimezone(datetime.UTC).replace(microsecond=0)
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse_rfc3339(text: str, field: str) -> datetime.datetime:
    try:
        when = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise errors.AnnotationError(field, f"invalid RFC3339 time {text!r}") from None
    if when.tzinfo is None:
        raise errors.AnnotationError(field, f"RFC3339 time {text!r} has no zone")
    return when


def encode_node_lock(lock: NodeLock) -> str:
    if lock.legacy:
        return format_rfc3339(lock.time)
    return f"{format_rfc3339(lock.time)},{lock.namespace},{lock.pod}"


def decode_node_lock(raw: str, *, field: str = "hami.io/mutex.lock") -> NodeLock:
    if "," not in raw:
        return NodeLock(_parse_rfc3339(raw.strip(), field))
    parts = raw.split(",")
    if len(parts) != 3 or not parts[1] or not parts[2]:
        raise errors.AnnotationError(field, f"malformed lock annotation {raw!r}")
    return NodeLock(_parse_rfc3339(parts[0], field), parts[1], parts[2])


# --- handshake (F.3) -----------------------------------------------------------------------------

_HANDSHAKE_LAYOUT = "%Y-%m-%d %H:%M:%S"


def encode_handshake_requesting(now: datetime.datetime) -> str:
    return "Requesting_" + now.strftime(_HANDSHAKE_LAYOUT)


def decode_handshake(
    raw: str, *, field: str = "hami.io/node-handshake"
) -> tuple[str, datetime.datetime | None]:
    """(state, time): ``Requesting_2026-08-21 06:20:39`` → ("Requesting", time). Other values
    (``Reported ...``, ``Deleted_...``) give their first word and no time."""
    state, sep, rest = raw.partition("_")
    if not sep:
        return raw.split(" ", 1)[0], None
    try:
        return state, datetime.datetime.strptime(rest, _HANDSHAKE_LAYOUT)
    except ValueError:
        raise errors.AnnotationError(field, f"invalid handshake time {rest!r}") from None


def decode_cordon(raw: str) -> frozenset[GpuUuid]:
    """``hami.io/device-cordon``: comma-separated UUIDs, blanks trimmed, empties skipped."""
    return frozenset(GpuUuid(part.strip()) for part in raw.split(",") if part.strip())
