"""``vgpu simulate --dra FILE``: the DRA objects of a cluster, read for the run (``draplace``
places DRA pods on them) and for the report's section on what the file's claims held already.

The file is what ``kubectl get resourceslices,resourceclaims -A -o yaml`` writes (a ``kind: List``
with ``items``), or the objects as a YAML list or as documents of a multi-document file. Read:
ResourceSlices, ResourceClaims, DeviceClasses, ResourceClaimTemplates (a workload pod may name one)
and Namespaces (their labels choose a pod's admission mode); objects of other kinds, and objects of
these kinds without a ``metadata.name``, are ignored and counted. The held usage is the views'
(``vgpu.core.dra.usage``): the shares kube-scheduler allocated, per node and GPU, with the pods
holding them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vgpu.core import device, errors
from vgpu.core.dra import usage

JsonObj = dict[str, Any]
_KINDS = ("ResourceSlice", "ResourceClaim", "DeviceClass", "ResourceClaimTemplate", "Namespace")


@dataclass(frozen=True)
class DraObjects:
    """The objects of the file the run reads, as written (``draplace`` reads them defensively)."""

    slices: tuple[JsonObj, ...] = ()
    claims: tuple[JsonObj, ...] = ()
    classes: tuple[JsonObj, ...] = ()
    templates: tuple[JsonObj, ...] = ()
    namespaces: tuple[JsonObj, ...] = ()

    def namespace_labels(self, namespace: str) -> dict[str, str] | None:
        """The labels of ``namespace`` when the file has it (None: unknown, as no label)."""
        for ns in self.namespaces:
            if ns["metadata"]["name"] == namespace:
                labels = ns["metadata"].get("labels")
                if isinstance(labels, Mapping):
                    return {str(k): str(v) for k, v in labels.items()}
                return {}
        return None


@dataclass(frozen=True)
class DraHeld:
    """What the file gave: the usage its claims hold, how many objects were ignored, the objects."""

    usage: usage.DraUsage
    ignored: int = 0
    objects: DraObjects = DraObjects()


def load(documents: Sequence[Any]) -> DraHeld:
    """The DRA usage of the objects in ``documents`` (YAML documents). A document that is not an
    object, or a ``List`` whose ``items`` is not a list, is a ``ConfigError`` naming it; garbage
    inside a slice or claim is reported with the usage (``problems``), as the views report it."""
    found: dict[str, list[Any]] = {k: [] for k in _KINDS}
    ignored = 0
    for i, doc in enumerate(documents):
        if doc is None:
            continue
        if not isinstance(doc, Mapping):
            raise errors.ConfigError(f"document {i}", f"expected an object, got {type(doc).__name__}")
        items: Any = doc.get("items") if doc.get("kind") == "List" else None
        if doc.get("kind") == "List" and not isinstance(items, list):
            raise errors.ConfigError(f"document {i}.items", "a List's items must be a list")
        for obj in items if items is not None else [doc]:
            kind = obj.get("kind") if isinstance(obj, Mapping) else None
            meta = obj.get("metadata") if isinstance(obj, Mapping) else None
            named = isinstance(meta, Mapping) and isinstance(meta.get("name"), str)
            if kind in found and (named or kind in ("ResourceSlice", "ResourceClaim")):
                found[kind].append(obj)  # slices and claims: the views report their garbage
            else:
                ignored += 1
    objects = DraObjects(
        slices=tuple(found["ResourceSlice"]),
        claims=tuple(found["ResourceClaim"]),
        classes=tuple(found["DeviceClass"]),
        templates=tuple(found["ResourceClaimTemplate"]),
        namespaces=tuple(found["Namespace"]),
    )
    return DraHeld(usage.build(found["ResourceSlice"], found["ResourceClaim"]), ignored, objects)


def _pct(part: int, whole: int) -> str:
    return f"{100.0 * part / whole:.1f}%" if whole else "-"


def render_text(held: DraHeld) -> str:
    """The report's section on what the file's claims held before the run: one line per GPU, then
    the totals and the problems (the run's own table shows the DRA nodes after the run)."""
    found = held.usage
    out = [
        "",
        f"DRA held before the run (the --dra file's allocated claims): {len(found.nodes)} nodes"
        + (f"; {held.ignored} objects of other kinds ignored" if held.ignored else ""),
    ]
    memory = [0, 0]
    cores = [0, 0]
    shares = 0
    for name, node in found.nodes.items():
        for gpu in node.inventory.gpus:
            used = node.used.get(gpu.uuid, device.EMPTY_USAGE)
            pods = ",".join(sorted({h.shown for h in node.holders.get(gpu.uuid, ())})) or "-"
            health = "ok" if gpu.health else "UNHEALTHY"
            out.append(
                f"  {name} GPU {gpu.index} {device.model_name(gpu.type)} {health}: memory "
                f"{used.memory_mib}/{gpu.memory_mib} MiB ({_pct(used.memory_mib, gpu.memory_mib)}), "
                f"cores {used.cores}/{gpu.cores}, {used.slots} shares; pods {pods}"
            )
            memory[0] += used.memory_mib
            memory[1] += gpu.memory_mib
            cores[0] += used.cores
            cores[1] += gpu.cores
            shares += used.slots
        out.extend(f"  ! {name}: {p}" for p in node.problems)
    out.extend(f"  ! {p}" for p in found.problems)
    out.append(
        f"DRA allocated: memory {memory[0]}/{memory[1]} MiB ({_pct(memory[0], memory[1])}), "
        f"cores {cores[0]}/{cores[1]} ({_pct(cores[0], cores[1])}), {shares} shares"
    )
    return "\n".join(out) + "\n"


def to_json(held: DraHeld) -> dict[str, Any]:
    """The ``dra`` key of the JSON report."""
    found = held.usage
    return {
        "simulated": False,
        "ignoredObjects": held.ignored,
        "nodes": [
            {
                "name": name,
                "gpus": [
                    {
                        "index": gpu.index,
                        "uuid": gpu.uuid,
                        "model": device.model_name(gpu.type),
                        "healthy": gpu.health,
                        "memoryMib": gpu.memory_mib,
                        "usedMib": node.used.get(gpu.uuid, device.EMPTY_USAGE).memory_mib,
                        "cores": gpu.cores,
                        "usedCores": node.used.get(gpu.uuid, device.EMPTY_USAGE).cores,
                        "shares": node.used.get(gpu.uuid, device.EMPTY_USAGE).slots,
                        "pods": [
                            {"holder": h.shown, "claim": h.claim, "memoryMib": h.memory_mib, "cores": h.cores}
                            for h in node.holders.get(gpu.uuid, ())
                        ],
                    }
                    for gpu in node.inventory.gpus
                ],
                "problems": list(node.problems),
            }
            for name, node in found.nodes.items()
        ],
        "problems": list(found.problems),
    }
