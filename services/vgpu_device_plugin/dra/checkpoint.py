"""The DRA kubelet plugin's checkpoint: the claims it prepared and what it answered for each.

kubelet retries NodePrepareResources (a timeout, its own restart) and calls NodeUnprepareResources
after ours: the answer to a claim prepared before must be the same, from this file, without the
API server (the claim may be deleted by then). One JSON document,
``<plugin dir>/checkpoint.json``: ``{"version": 1, "claims": {<uid>: {namespace, name, specFile,
cacheDirs, devices: [{request, pool, device, shareID, cdiDeviceIDs}]}}}``, written atomically (a
temp file, fsync, rename). ``decode`` is pure; a file that does not decode is logged and read as
empty, never a crash: Unprepare then works from the names a claim UID gives (spec file, cache
directories). Blocking file work: call ``load`` and ``save`` off the event loop.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import pathlib
from collections.abc import Mapping
from typing import Any

from vgpu.core.dra import cdiclaim

from vgpu_device_plugin import cdispecfile

log = logging.getLogger(__name__)

FILE_NAME = "checkpoint.json"
VERSION = 1


class CheckpointError(ValueError):
    """The checkpoint file's content is not a checkpoint."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Entry:
    """One prepared claim."""

    uid: str
    namespace: str
    name: str
    spec_file: str  # the CDI spec's file name (in the CDI directory)
    cache_dirs: tuple[str, ...]  # host paths
    devices: tuple[cdiclaim.PreparedDevice, ...]


def _device(raw: Any) -> cdiclaim.PreparedDevice:
    if not isinstance(raw, Mapping):
        raise CheckpointError(f"device {raw!r} is not an object")
    share = raw.get("shareID")
    ids = raw.get("cdiDeviceIDs", [])
    strings = [raw.get(k) for k in ("request", "pool", "device")]
    if not all(isinstance(v, str) for v in strings) or not (share is None or isinstance(share, str)):
        raise CheckpointError(f"device {raw!r}: request, pool, device must be strings")
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise CheckpointError(f"device {raw!r}: cdiDeviceIDs is not a list of strings")
    return cdiclaim.PreparedDevice(
        request=str(strings[0]),
        pool=str(strings[1]),
        device=str(strings[2]),
        share_id=share,
        cdi_device_ids=tuple(ids),
    )


def _entry(uid: str, raw: Any) -> Entry:
    if not isinstance(raw, Mapping):
        raise CheckpointError(f"claim {uid}: not an object")
    fields = {k: raw.get(k) for k in ("namespace", "name", "specFile")}
    if not all(isinstance(v, str) for v in fields.values()):
        raise CheckpointError(f"claim {uid}: namespace, name, specFile must be strings")
    dirs = raw.get("cacheDirs", [])
    devices = raw.get("devices", [])
    if not isinstance(dirs, list) or not all(isinstance(d, str) for d in dirs):
        raise CheckpointError(f"claim {uid}: cacheDirs is not a list of strings")
    if not isinstance(devices, list):
        raise CheckpointError(f"claim {uid}: devices is not a list")
    cdiclaim.check_uid(uid)
    return Entry(
        uid=uid,
        namespace=str(fields["namespace"]),
        name=str(fields["name"]),
        spec_file=str(fields["specFile"]),
        cache_dirs=tuple(dirs),
        devices=tuple(_device(d) for d in devices),
    )


def decode(text: str) -> dict[str, Entry]:
    """The entries of a checkpoint document; CheckpointError for anything else."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise CheckpointError(f"not JSON: {exc}") from None
    if not isinstance(doc, Mapping) or doc.get("version") != VERSION:
        raise CheckpointError(f"not a version {VERSION} checkpoint")
    claims = doc.get("claims")
    if not isinstance(claims, Mapping):
        raise CheckpointError("claims is not an object")
    try:
        return {str(uid): _entry(str(uid), raw) for uid, raw in claims.items()}
    except cdiclaim.ClaimError as exc:
        raise CheckpointError(str(exc)) from None


def encode(entries: Mapping[str, Entry]) -> str:
    claims = {
        uid: {
            "namespace": e.namespace,
            "name": e.name,
            "specFile": e.spec_file,
            "cacheDirs": list(e.cache_dirs),
            "devices": [
                {
                    "request": d.request,
                    "pool": d.pool,
                    "device": d.device,
                    "shareID": d.share_id,
                    "cdiDeviceIDs": list(d.cdi_device_ids),
                }
                for d in e.devices
            ],
        }
        for uid, e in sorted(entries.items())
    }
    return json.dumps({"version": VERSION, "claims": claims}, indent=1, sort_keys=True) + "\n"


def load(path: pathlib.Path) -> dict[str, Entry]:
    """The checkpoint at ``path``; {} when there is none or it does not decode (logged)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as exc:
        log.error("DRA checkpoint %s cannot be read (%s): starting with no prepared claims", path, exc)
        return {}
    try:
        return decode(text)
    except CheckpointError as exc:
        log.error("DRA checkpoint %s is not readable (%s): starting with no prepared claims", path, exc)
        return {}


def save(path: pathlib.Path, entries: Mapping[str, Entry]) -> None:
    """Write ``entries`` to ``path`` atomically; OSError when it cannot."""
    cdispecfile.write_atomically(path, encode(entries))
