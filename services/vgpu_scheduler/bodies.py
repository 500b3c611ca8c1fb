"""Shape checks of the extender's request bodies, before any handler reads them.

kube-scheduler sends ExtenderArgs built from objects the API server validated, so every metadata
value is a string; a body that breaks that is not from kube-scheduler and gets HTTP 400 naming
the first wrong value (``ExtenderArgs.Nodes.items[2].metadata.annotations["hami.io/..."]``).
The checks cover what ``/filter`` reads without its own type checks: the pod's and each Node's
metadata (name, namespace, uid, labels, annotations). The pod's spec is read by
``vgpu.core.request``, which names its own bad fields.

``cannot_be_extender_args`` refuses, before any parse, a body over 1 MiB that cannot be ExtenderArgs:
not a JSON object, or with more objects and arrays than real ones have for their size. Python's
parser builds the whole document first (a small dict for every ``{}``: 4 MiB of them took 100 MiB
and about 0.3 s), and a check after it comes too late.

``loads`` is the JSON parse of these bodies and of the webhook's AdmissionReview: strict RFC 8259,
where Python's ``json`` also takes ``NaN``, ``Infinity`` and ``-Infinity`` (and makes a number like
``1e999`` an infinite float). Such a value is not JSON, and ``/filter``'s answer in Nodes mode
echoes the caller's Node objects: accepted, it would come back as an answer Go cannot decode.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

from vgpu.core import errors

_STRING_FIELDS = ("name", "namespace", "uid", "generateName", "resourceVersion")
# bodies larger than this are checked before they are parsed; kube-scheduler's are smaller (a pod
# of a few KiB and about 14 bytes a node name: 70 KiB at 5,000 nodes), and pay nothing for it. The
# worst a body this size can cost unchecked: about 25 MiB and 50 ms of parsing, on loopback only
PRECHECK_BYTES = 1 << 20
# an object or array of a real pod or Node object, with its keys and values, takes far more than
# this many bytes of JSON (an empty ``{}`` in a pod spec is next to a long key); ``[{},{},...]`` takes 3
MIN_BYTES_PER_CONTAINER = 16
_OBJECT_START = re.compile(rb"[ \t\r\n]*\{")


def _not_json(constant: str) -> Any:
    raise ValueError(f"{constant} is not a JSON value")


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"number {text[:40]} is out of range")
    return value


# one decoder (json.loads with hooks builds one per call); the hooks run only for what they refuse
# and for fractional numbers, which kube-scheduler's bodies do not hold
_DECODER = json.JSONDecoder(parse_constant=_not_json, parse_float=_finite)


def cannot_be_extender_args(body: bytes) -> str | None:
    """Why ``body``, when over ``PRECHECK_BYTES``, cannot be ExtenderArgs (or the preemption and
    binding arguments), told without parsing it: it is not a JSON object, or it holds more ``{``
    and ``[`` than one per ``MIN_BYTES_PER_CONTAINER`` bytes. None: parse it. Two passes of C
    over the bytes (under 1 ms a MiB), against the parse's 3 ms a MiB or more."""
    if len(body) <= PRECHECK_BYTES:
        return None
    if _OBJECT_START.match(body) is None:
        return f"a body of {len(body)} bytes that is not a JSON object"
    containers = body.count(b"{") + body.count(b"[")
    if containers * MIN_BYTES_PER_CONTAINER > len(body):
        return (
            f"a body of {len(body)} bytes with {containers} objects and arrays: more than one per "
            f"{MIN_BYTES_PER_CONTAINER} bytes, which kube-scheduler's bodies never hold; not parsed"
        )
    return None


def loads(body: bytes) -> Any:
    """``json.loads(body)`` without NaN, Infinity, -Infinity or a number past a float's range
    (ValueError); as ``json.loads``, UTF-8, -16 or -32, and RecursionError for nesting too deep."""
    return _DECODER.decode(body.decode(json.detect_encoding(body), "surrogatepass"))


def go_key(raw: Mapping[str, Any], key: str) -> str | None:
    """The key of ``raw`` that Go's decoder reads for the field ``key``: the exact spelling, else the
    first case-insensitive match; None when there is none. Every reader of an extender body uses
    this one rule, so that what is checked (``untrusted``) is what is read."""
    if key in raw:
        return key
    lowered = key.lower()
    return next((k for k in raw if isinstance(k, str) and k.lower() == lowered), None)


def go_field(raw: Mapping[str, Any], key: str) -> Any:
    """The value ``go_key`` finds for ``key`` in ``raw``, or None."""
    found = go_key(raw, key)
    return None if found is None else raw[found]


def _check_metadata(meta: Any, field: str) -> None:
    if meta is None:
        return
    if not isinstance(meta, Mapping):
        raise errors.ParseError(field, f"expected an object, got {type(meta).__name__}")
    for key in _STRING_FIELDS:
        value = meta.get(key)
        if value is not None and not isinstance(value, str):
            raise errors.ParseError(f"{field}.{key}", f"expected a string, got {type(value).__name__}")
    for key in ("labels", "annotations"):
        values = meta.get(key)
        if values is None:
            continue
        if not isinstance(values, Mapping):
            raise errors.ParseError(
                f"{field}.{key}", f"expected a map of strings, got {type(values).__name__}"
            )
        for name, value in values.items():
            if not isinstance(value, str):
                raise errors.ParseError(
                    f"{field}.{key}[{str(name)[:253]!r}]", f"expected a string, got {type(value).__name__}"
                )


def extender_args_pod_uid(raw: object) -> str:
    """The uid of ExtenderArgs' pod, or "" where there is none to read."""
    pod = go_field(raw, "Pod") if isinstance(raw, Mapping) else None
    meta = pod.get("metadata") if isinstance(pod, Mapping) else None
    uid = meta.get("uid") if isinstance(meta, Mapping) else None
    return uid if isinstance(uid, str) else ""


def check_extender_args(raw: object) -> None:
    """``ParseError`` for the first metadata value of the wrong type in ExtenderArgs; the rest of
    the validation (required members, node names) is the filter's own."""
    if not isinstance(raw, Mapping):
        return
    pod = go_field(raw, "Pod")
    if isinstance(pod, Mapping):
        _check_metadata(pod.get("metadata"), "ExtenderArgs.Pod.metadata")
    nodes = go_field(raw, "Nodes")
    items = nodes.get("items") if isinstance(nodes, Mapping) else None
    if isinstance(items, list):
        for i, node in enumerate(items):
            field = f"ExtenderArgs.Nodes.items[{i}]"
            if not isinstance(node, Mapping):
                raise errors.ParseError(field, f"expected a Node object, got {type(node).__name__}")
            _check_metadata(node.get("metadata"), f"{field}.metadata")
