"""The container runtime's CDI resolution, for the emulated kubelet (containerd ≥ 1.7 with
``enable_cdi``, CRI-O ≥ 1.23).

A container's CDI devices are the names kubelet passes in the CRI's ``CDIDevices`` (the Allocate
answer's ``cdi_devices``, ``deviceListStrategy: cdi-cri``) and those in its ``cdi.k8s.io/*``
annotations (comma-separated, ``cdi-annotations``). When the container is created the runtime
loads the specs (``.json``, ``.yaml``) of its spec directories, the later directory winning a name
both define (``/var/run/cdi`` over ``/etc/cdi``); a spec that does not parse or is invalid
(``vgpu.core.cdispec.validate``) defines nothing. A name no spec defines fails the container
creation: ``CDI device injection failed: unresolvable CDI devices <names>``. Blocking file reads:
call ``resolve`` off the event loop.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from vgpu.core import cdispec

log = logging.getLogger(__name__)

ANNOTATION_PREFIX = "cdi.k8s.io/"


class Unresolvable(Exception):
    """Some requested CDI devices are defined by no spec; the message is the runtime's."""

    def __init__(self, names: Sequence[str]) -> None:
        super().__init__(f"CDI device injection failed: unresolvable CDI devices {', '.join(names)}")
        self.names = list(names)


def requested(entry: Mapping[str, Any]) -> list[str]:
    """The CDI device names of one container's recorded answers (cdiDevices, then annotations)."""
    names = list(entry.get("cdiDevices") or [])
    for key, value in sorted((entry.get("annotations") or {}).items()):
        if key.startswith(ANNOTATION_PREFIX):
            names += [n.strip() for n in str(value).split(",") if n.strip()]
    return names


def _load(path: Path) -> object:
    text = path.read_text()
    return json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)


def registry(spec_dirs: Sequence[Path]) -> dict[str, list[Mapping[str, Any]]]:
    """Qualified device name → its edits, from the valid specs of ``spec_dirs`` (lowest priority first)."""
    found: dict[str, list[Mapping[str, Any]]] = {}
    for directory in spec_dirs:
        try:
            files = sorted(p for p in directory.iterdir() if p.suffix in (".json", ".yaml", ".yml"))
        except OSError:
            continue
        for path in files:
            try:
                doc = _load(path)
            except (OSError, ValueError, yaml.YAMLError) as exc:
                log.info("CDI spec %s skipped: %s", path, exc)
                continue
            problems = cdispec.validate(doc)
            if problems or not isinstance(doc, Mapping):
                log.info("CDI spec %s skipped: %s", path, "; ".join(problems))
                continue
            for device in doc["devices"]:
                found[f"{doc['kind']}={device['name']}"] = cdispec.device_edits(doc, device["name"])
    return found


def resolve(names: Sequence[str], *, spec_dirs: Sequence[Path]) -> dict[str, Any]:
    """The edits the runtime applies for ``names`` (env and mounts, merged in order); raises
    ``Unresolvable`` naming every device no spec defines."""
    if not names:
        return {}
    known = registry(spec_dirs)
    missing = [n for n in names if n not in known]
    if missing:
        raise Unresolvable(missing)
    env: list[str] = []
    mounts: list[Any] = []
    for name in dict.fromkeys(names):
        for edits in known[name]:
            env += edits.get("env") or []
            mounts += edits.get("mounts") or []
    return {"env": env, "mounts": mounts}
