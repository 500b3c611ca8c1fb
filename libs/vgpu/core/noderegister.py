"""The node register annotation (docs/protocol.md#the-register-annotation): the device plugin's inventory of a node's GPUs.

``hami.io/node-nvidia-register`` holds HAMi's JSON array (v2.8+) or the legacy colon/comma form;
both decode to ``Gpu`` values, and a bad value raises one ``AnnotationError`` naming the element.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from vgpu.core import errors, goscalars
from vgpu.core.device import Gpu, GpuUuid, MigPlacement, MigProfile, Mode

_REGISTER_FIELD = "hami.io/node-nvidia-register"


def encode_node_register(gpus: Sequence[Gpu]) -> str:
    """HAMi v2.10's JSON: key order id, index, count, devmem, devcore, type, numa, mode,
    migProfiles, health, with Go's ``omitempty`` (zero values left out)."""
    items = []
    for gpu in gpus:
        item: dict[str, Any] = {"id": gpu.uuid}
        omitempty = (
            ("index", gpu.index),
            ("count", gpu.count),
            ("devmem", gpu.memory_mib),
            ("devcore", gpu.cores),
            ("type", gpu.type),
            ("numa", gpu.numa),
        )
        item.update((key, value) for key, value in omitempty if value)
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


def _want_int(obj: dict[str, Any], key: str, field: str, default: int = 0) -> int:
    value = obj.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise errors.AnnotationError(f"{field}.{key}", f"expected an integer, got {str(value)[:40]!r}")
    if abs(value) > goscalars.INT32_MAX:
        raise errors.AnnotationError(f"{field}.{key}", "integer out of range (a 32-bit integer)")
    return value


def _want_str(obj: dict[str, Any], key: str, field: str, default: str = "") -> str:
    value = obj.get(key, default)
    if not isinstance(value, str):
        raise errors.AnnotationError(f"{field}.{key}", f"expected a string, got {value!r}")
    return value


_SEPARATORS = frozenset(",:;")  # the pod device string's: a UUID with one cannot be written there


def _uuid(raw: str, field: str) -> GpuUuid:
    """A register entry's GPU UUID: not empty, and free of the pod device string's separators (a
    UUID with one would decode as another GPU, or not at all, from every pod bound to it)."""
    if not raw:
        raise errors.AnnotationError(field, "missing GPU UUID")
    if not _SEPARATORS.isdisjoint(raw):
        raise errors.AnnotationError(
            field, f"GPU UUID {raw!r} contains ',', ':' or ';', the pod device string's separators"
        )
    return GpuUuid(raw)


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
        uuid = _uuid(_want_str(item, "id", field), f"{field}.id")
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
            index = goscalars.parse_int32(parts[7], f"{field}.index")
            try:
                mode = Mode(parts[8] or Mode.HAMI_CORE.value)
            except ValueError:
                raise errors.AnnotationError(f"{field}.mode", f"unknown mode {parts[8]!r}") from None
        gpus.append(
            Gpu(
                uuid=_uuid(parts[0], f"{field}.id"),
                index=index,
                count=goscalars.parse_int32(parts[1], f"{field}.count"),
                memory_mib=goscalars.parse_int32(parts[2], f"{field}.devmem"),
                cores=goscalars.parse_int32(parts[3], f"{field}.devcore"),
                type=parts[4],
                numa=goscalars.parse_int32(parts[5], f"{field}.numa"),
                mode=mode,
                health=goscalars.parse_bool(parts[6], f"{field}.health"),
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
