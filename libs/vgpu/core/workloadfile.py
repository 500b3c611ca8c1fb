"""The workload file that ``vgpu demo --workload`` and ``vgpu simulate --workload`` both read: pods.

The file holds Pod manifests, as ``kubectl apply -f`` takes them: a YAML list of them, a
multi-document stream (``---`` between pods), or a ``kind: List`` with ``items``. Each manifest
may carry two keys of ours beside ``metadata`` and ``spec``, never submitted:

- ``replicas: N``: N pods ``<name>-0 .. <name>-(N-1)`` instead of one;
- ``expect: pending``: ``vgpu demo`` checks that the pod stays Pending with the scheduler's
  reason (every other pod must run); ``vgpu simulate`` reports what happens either way.

A pod may also be written short, ``{name, namespace, labels, annotations, priority, replicas,
expect, containers, initContainers}``, and a file may be a mapping ``pods: [...]`` of such items.

Pure: the caller parses the YAML; errors are ``ConfigError`` naming the item (``workload[3].spec``).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from vgpu.core import errors

MAX_REPLICAS = 100_000

Expect = Literal["running", "pending"]
_EXPECT: tuple[Expect, ...] = ("running", "pending")
_OURS = {"replicas", "expect"}
_MANIFEST_KEYS = {"apiVersion", "kind", "metadata", "spec", "status", *_OURS}
_SHORT_KEYS = {
    "name",
    "namespace",
    "annotations",
    "labels",
    "containers",
    "initContainers",
    "priority",
    *_OURS,
}


@dataclass(frozen=True)
class PodItem:
    """One pod of the file (a replica is one item): the manifest to submit or place, and what the
    demo expects of it."""

    manifest: dict[str, Any]
    expect: Expect
    where: str  # the item it came from, for messages: "workload[2]"

    @property
    def key(self) -> str:
        meta = self.manifest["metadata"]
        return f"{meta['namespace']}/{meta['name']}"


def bad(where: str, message: str) -> errors.ConfigError:
    return errors.ConfigError(where, message)


def mapping(raw: Any, allowed: set[str], where: str) -> Mapping[str, Any]:
    """``raw`` as a mapping with only ``allowed`` keys."""
    if not isinstance(raw, Mapping):
        raise bad(where, f"expected a mapping, got {type(raw).__name__}")
    unknown = sorted(str(k) for k in raw if k not in allowed)
    if unknown:
        raise bad(where, f"unknown keys {unknown} (known keys: {', '.join(sorted(allowed))})")
    return raw


def integer(raw: Mapping[str, Any], key: str, where: str, *, default: int, minimum: int = 0) -> int:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad(f"{where}.{key}", f"expected an integer, got {value!r}")
    if value < minimum:
        raise bad(f"{where}.{key}", f"must be at least {minimum}, got {value}")
    return value


def name(raw: Mapping[str, Any], key: str, where: str) -> str:
    value = raw.get(key)
    if not isinstance(value, str) or not value.strip():
        raise bad(f"{where}.{key}", f"expected a non-empty string, got {value!r}")
    return value.strip()


def replicas(raw: Mapping[str, Any], where: str) -> int:
    """``replicas`` (or its alias ``count``), 1 when absent, at most ``MAX_REPLICAS``."""
    if "count" in raw and "replicas" in raw:
        raise bad(where, "give count or replicas, not both")
    key = "replicas" if "replicas" in raw else "count"
    n = integer(raw, key, where, default=1, minimum=1)
    if n > MAX_REPLICAS:
        raise bad(f"{where}.{key}", f"at most {MAX_REPLICAS}, got {n}")
    return n


def _items(documents: Sequence[Any]) -> list[tuple[str, Any]]:
    """Every pod item of the file's documents, with where it is."""
    out: list[tuple[str, Any]] = []
    for doc in documents:
        if doc is None:
            continue
        if isinstance(doc, list):
            out.extend((f"workload[{len(out) + i}]", item) for i, item in enumerate(doc))
        elif isinstance(doc, Mapping) and doc.get("kind") == "List":
            items = doc.get("items")
            if not isinstance(items, list):
                raise bad("workload.items", "expected a list of Pod manifests")
            out.extend((f"workload[{len(out) + i}]", item) for i, item in enumerate(items))
        elif isinstance(doc, Mapping) and "pods" in doc and not {"kind", "spec", "metadata"} & set(doc):
            mapping(doc, {"pods"}, "workload")
            pods = doc["pods"]
            if not isinstance(pods, list) or not pods:
                raise bad("workload.pods", "expected a non-empty list of pods")
            out.extend((f"workload.pods[{i}]", item) for i, item in enumerate(pods))
        else:
            out.append((f"workload[{len(out)}]", doc))
    return out


def expand(documents: Sequence[Any]) -> list[PodItem]:
    """The pods of a workload file's YAML documents, in order, replicas expanded, names unique."""
    pods: list[PodItem] = []
    seen: set[str] = set()
    for where, item in _items(documents):
        if isinstance(item, Mapping) and {"kind", "spec", "metadata", "apiVersion"} & set(item):
            template, count = _from_manifest(item, where)
        else:
            template, count = _from_short(item, where)
        expect = item.get("expect", "running")
        if expect not in _EXPECT:
            raise bad(f"{where}.expect", f"expected running or pending, got {expect!r}")
        base = template["metadata"]["name"]
        for r in range(count):
            pod = copy.deepcopy(template) if count > 1 else template
            pod["metadata"]["name"] = base if count == 1 else f"{base}-{r}"
            one = PodItem(pod, expect, where)
            if one.key in seen:
                raise bad(f"{where}.name", f"pod {one.key!r} is defined twice")
            seen.add(one.key)
            pods.append(one)
    if not pods:
        raise bad("workload", "the workload has no pods")
    return pods


def _from_manifest(item: Mapping[str, Any], where: str) -> tuple[dict[str, Any], int]:
    raw = mapping(item, _MANIFEST_KEYS, where)
    kind = raw.get("kind", "Pod")
    if kind != "Pod":
        raise bad(f"{where}.kind", f"expected a Pod manifest, got kind {kind!r}")
    meta = raw.get("metadata")
    if not isinstance(meta, Mapping):
        raise bad(f"{where}.metadata", "expected a mapping with the pod's name")
    spec = raw.get("spec")
    if not isinstance(spec, Mapping):
        raise bad(f"{where}.spec", "expected a mapping")
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            **copy.deepcopy(dict(meta)),
            "name": name(meta, "name", f"{where}.metadata"),
            "namespace": _namespace(meta, f"{where}.metadata"),
        },
        "spec": copy.deepcopy(dict(spec)),
    }
    _check_containers(pod["spec"], f"{where}.spec")
    return pod, replicas(raw, where)


def _from_short(item: Any, where: str) -> tuple[dict[str, Any], int]:
    short = mapping(item, _SHORT_KEYS, where)
    meta: dict[str, Any] = {"name": name(short, "name", where), "namespace": _namespace(short, where)}
    for key in ("annotations", "labels"):
        if key in short:
            value = short[key]
            if not isinstance(value, Mapping) or not all(isinstance(v, str) for v in value.values()):
                raise bad(f"{where}.{key}", "expected a mapping of strings")
            meta[key] = {str(k): v for k, v in value.items()}
    spec: dict[str, Any] = {"containers": copy.deepcopy(short.get("containers"))}
    if "priority" in short:
        spec["priority"] = short["priority"]
    if "initContainers" in short:
        spec["initContainers"] = copy.deepcopy(short["initContainers"])
    _check_containers(spec, where)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}, replicas(short, where)


def _namespace(raw: Mapping[str, Any], where: str) -> str:
    if "namespace" not in raw:
        return "default"
    return name(raw, "namespace", where)


def _check_containers(spec: Mapping[str, Any], where: str) -> None:
    value = spec.get("priority", 0)
    if not isinstance(value, int) or isinstance(value, bool) or abs(value) > 2_000_000_000:
        raise bad(f"{where}.priority", f"expected an integer priority, got {value!r}")
    containers = spec.get("containers")
    if not isinstance(containers, list) or not containers:
        raise bad(f"{where}.containers", "expected a non-empty list of containers")
    init = spec.get("initContainers", [])
    if not isinstance(init, list):
        raise bad(f"{where}.initContainers", "expected a list of containers")
    for key, items in (("initContainers", init), ("containers", containers)):
        for i, c in enumerate(items):
            if not isinstance(c, Mapping):
                raise bad(f"{where}.{key}[{i}]", "expected a mapping")
