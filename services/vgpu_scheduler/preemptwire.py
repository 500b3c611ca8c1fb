"""The ``/preempt`` verb's wire forms: ExtenderPreemptionArgs read, ExtenderPreemptionResult written.

``parse_args`` validates the request (its pod, and per node kube-scheduler's victims by UID, from
``NodeNameToMetaVictims`` or ``NodeNameToVictims``, and their budget violations) and raises
``ParseError`` (HTTP 400) naming the field; ``encoded`` writes the answer, always as
``NodeNameToMetaVictims``, leaving out nodes without victims (kube-scheduler takes an empty list
for an error), with the reason of a refusal in an extra ``Error`` member. Both work a slice of
nodes at a time with a turn of the loop between slices (``pacing.Pacer``). The judging is
``vgpu_scheduler.preempt``'s.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vgpu.core import errors
from vgpu.kube.port import JsonObj

from vgpu_scheduler import bodies, pacing

NODES_PER_CHECK = 32  # nodes of the body read, or of the answer written, between two pacing checks


@dataclass(frozen=True)
class PreemptReply:
    """The ExtenderPreemptionResult's JSON text and what happened (for logs and tests)."""

    data: bytes
    outcome: str  # "passthrough", "victims", "none", "error"

    @property
    def body(self) -> dict[str, Any]:
        """The answer decoded (for tests and logs)."""
        decoded: dict[str, Any] = json.loads(self.data)
        return decoded


@dataclass(frozen=True)
class Args:
    """The request: its pod, and per node kube-scheduler's victims and their budget violations.
    In the common case (no victims: the empty tuple) maps of strings and numbers only, which the
    cyclic GC does not track, however many nodes (issue 49: fewer young collections)."""

    pod: JsonObj
    victims: dict[str, tuple[str, ...]]  # node -> victim uids
    violations: dict[str, int]  # node -> kube-scheduler's PDB count


def _uid_of(item: Any, *, meta: bool, field: str) -> str:
    """The UID of a victim: a MetaPod's ``UID``, or a Pod's ``metadata.uid``."""
    if not isinstance(item, Mapping):
        raise errors.ParseError(field, f"expected an object, got {type(item).__name__}")
    if meta:
        uid = bodies.go_field(item, "UID")
    else:
        metadata = item.get("metadata")
        if metadata is not None and not isinstance(metadata, Mapping):
            raise errors.ParseError(f"{field}.metadata", f"expected an object, got {type(metadata).__name__}")
        uid = None if metadata is None else metadata.get("uid")
    if not isinstance(uid, str) or not uid:
        raise errors.ParseError(field, "expected a pod with a UID")
    return uid


def _node_field(key: str, node: object) -> str:
    return f"ExtenderPreemptionArgs.{key}[{str(node)[:253]!r}]"


def _proposals(raw: Mapping[str, Any]) -> Iterator[tuple[str, tuple[str, ...], int]]:
    """Each node of ExtenderPreemptionArgs' victims map: (node, victim uids, kube-scheduler's PDB
    count), checked one at a time (the caller paces between them)."""
    for key, is_meta in (("NodeNameToMetaVictims", True), ("NodeNameToVictims", False)):
        given = bodies.go_field(raw, key)
        if given is None:
            continue
        if not isinstance(given, Mapping):
            raise errors.ParseError(f"ExtenderPreemptionArgs.{key}", "expected a map of node names")
        for node, raw_victims in given.items():  # hundreds of nodes: the common shape read directly
            victims = {} if raw_victims is None else raw_victims
            if not isinstance(victims, Mapping):
                raise errors.ParseError(
                    _node_field(key, node), f"expected Victims, got {type(victims).__name__}"
                )
            pods = (victims["Pods"] if "Pods" in victims else bodies.go_field(victims, "Pods")) or []
            count = (
                victims["NumPDBViolations"]
                if "NumPDBViolations" in victims
                else bodies.go_field(victims, "NumPDBViolations")
            ) or 0
            if not isinstance(pods, list) or not isinstance(count, int) or isinstance(count, bool):
                raise errors.ParseError(
                    _node_field(key, node), "expected Pods (a list) and NumPDBViolations (an integer)"
                )
            if not pods:
                yield str(node), (), count
                continue
            field = _node_field(key, node)
            uids = [_uid_of(p, meta=is_meta, field=f"{field}.Pods[{i}]") for i, p in enumerate(pods)]
            yield str(node), tuple(dict.fromkeys(uids)), count  # a pod named twice goes once
        return  # kube-scheduler fills exactly one of them


async def parse_args(raw: Any, *, pacer: pacing.Pacer) -> Args:
    """Validate ExtenderPreemptionArgs, a turn of the loop between slices of nodes; ``ParseError``
    (HTTP 400) names what is wrong."""
    if not isinstance(raw, Mapping):
        raise errors.ParseError("ExtenderPreemptionArgs", "expected a JSON object")
    bodies.check_extender_args(raw)  # the pod's metadata value types
    pod = bodies.go_field(raw, "Pod")
    if not isinstance(pod, dict):
        raise errors.ParseError("ExtenderPreemptionArgs.Pod", "missing pod")
    meta = pod.get("metadata")
    if not isinstance(meta, dict) or not meta.get("name") or not meta.get("uid"):
        raise errors.ParseError("ExtenderPreemptionArgs.Pod.metadata", "pod needs metadata.name and uid")
    victims: dict[str, tuple[str, ...]] = {}
    violations: dict[str, int] = {}
    for i, (node, uids, count) in enumerate(_proposals(raw), 1):
        victims[node] = uids
        violations[node] = count
        if i % NODES_PER_CHECK == 0:
            await pacer.pace()
    return Args(pod, victims, violations)


# a string's JSON text (the C escaper; ASCII, as the listener's encoder writes)
_text = json.JSONEncoder().encode


async def encoded(
    answers: Iterable[tuple[str, Sequence[str], int]], error: str, *, pacer: pacing.Pacer
) -> bytes:
    """ExtenderPreemptionResult as JSON text, written a node at a time with turns of the loop
    between slices (encoded whole, 500 nodes' answer held it for 0.4-0.8 ms); nodes without
    victims are left out (kube-scheduler takes an empty list for an error)."""
    parts: list[str] = []
    for i, (node, uids, count) in enumerate(answers, 1):
        if uids:
            pods = ",".join([f'{{"UID":{_text(uid)}}}' for uid in uids])
            parts.append(f'{_text(node)}:{{"Pods":[{pods}],"NumPDBViolations":{count}}}')
        if i % NODES_PER_CHECK == 0:
            await pacer.pace()
    tail = f',"Error":{_text(error)}' if error else ""
    return f'{{"NodeNameToMetaVictims":{{{",".join(parts)}}}{tail}}}'.encode()
