"""Label and field selectors as the API server parses and matches them.

Label selector strings (``?labelSelector=``): comma-separated requirements ``k=v``, ``k==v``,
``k!=v``, ``k in (a,b)``, ``k notin (a,b)``, ``k`` (exists) and ``!k`` (does not exist).
Field selector strings (``?fieldSelector=``): ``path=v``, ``path==v``, ``path!=v`` over a small
set of supported dotted paths per kind (a missing field compares as ``""``, as upstream does).
``LabelSelector`` objects (``matchLabels`` + ``matchExpressions`` with In/NotIn/Exists/
DoesNotExist), as used by webhook namespace/object selectors, are matched by ``match_label_selector``.

Bad input raises ``KubeError`` with status 400 (BadRequest), the answer a real API server gives.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from vgpu.localcluster import validation

Op = Literal["=", "!=", "in", "notin", "exists", "!exists"]
_KEY_RE = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_VALUE_RE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")

# Field selector paths each kind supports, beyond metadata.name and metadata.namespace.
_FIELDS: dict[str, frozenset[str]] = {
    "pods": frozenset(
        {"spec.nodeName", "status.phase", "spec.schedulerName", "spec.restartPolicy", "status.podIP"}
    ),
    "nodes": frozenset({"spec.unschedulable"}),
    "events": frozenset(
        {
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        }
    ),
    "namespaces": frozenset({"status.phase"}),
    # resourceslice/strategy.go's toSelectableFields (a slice without nodeName matches "")
    "resourceslices": frozenset({"spec.nodeName", "spec.driver"}),
}
_COMMON_FIELDS = frozenset({"metadata.name", "metadata.namespace"})


@dataclass(frozen=True)
class Requirement:
    """One label requirement: ``key op values``."""

    key: str
    op: Op
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        if self.op == "exists":
            return present
        if self.op == "!exists":
            return not present
        if self.op in ("=", "in"):
            return present and labels[self.key] in self.values
        # != and notin also match objects without the label, as upstream does
        return not present or labels[self.key] not in self.values


@dataclass(frozen=True)
class LabelSelector:
    """A parsed label selector; the empty selector matches everything."""

    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(r.matches(labels) for r in self.requirements)


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside parentheses."""
    parts: list[str] = []
    depth = 0
    start = 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                raise validation.bad_request(f"unable to parse requirement: unbalanced ')' in {text!r}")
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth != 0:
        raise validation.bad_request(f"unable to parse requirement: unbalanced '(' in {text!r}")
    parts.append(text[start:])
    return parts


def _check_key(key: str) -> str:
    if not key or len(key) > 317 or not _KEY_RE.match(key):
        raise validation.bad_request(f"unable to parse requirement: invalid label key {key!r}")
    return key


def _check_value(value: str) -> str:
    if len(value) > 63 or not _VALUE_RE.match(value):
        raise validation.bad_request(f"unable to parse requirement: invalid label value {value!r}")
    return value


_SET_RE = re.compile(r"^(?P<key>\S+)\s+(?P<op>in|notin)\s*\((?P<vals>[^()]*)\)$")


def _parse_requirement(part: str) -> Requirement:
    text = part.strip()
    if not text:
        raise validation.bad_request("unable to parse requirement: empty requirement")
    m = _SET_RE.match(text)
    if m:
        vals = [v.strip() for v in m.group("vals").split(",")]
        op: Op = "in" if m.group("op") == "in" else "notin"
        return Requirement(_check_key(m.group("key")), op, frozenset(_check_value(v) for v in vals))
    for token, parsed_op in (("!=", "!="), ("==", "="), ("=", "=")):
        if token in text:
            key, _, value = text.partition(token)
            eq_op: Op = "!=" if parsed_op == "!=" else "="
            return Requirement(_check_key(key.strip()), eq_op, frozenset({_check_value(value.strip())}))
    if text.startswith("!"):
        return Requirement(_check_key(text[1:].strip()), "!exists")
    return Requirement(_check_key(text), "exists")


def parse_label_selector(text: str | None) -> LabelSelector:
    """Parse a ``labelSelector`` query string; None or blank is the match-everything selector."""
    if text is None or not text.strip():
        return LabelSelector()
    return LabelSelector(tuple(_parse_requirement(p) for p in _split_top_level(text)))


@dataclass(frozen=True)
class FieldRequirement:
    """One field requirement: ``path = value`` or ``path != value``."""

    path: str
    negate: bool
    value: str


@dataclass(frozen=True)
class FieldSelector:
    """A parsed field selector; the empty selector matches everything."""

    requirements: tuple[FieldRequirement, ...] = ()

    def matches(self, obj: Mapping[str, Any]) -> bool:
        for r in self.requirements:
            equal = field_value(obj, r.path) == r.value
            if equal == r.negate:
                return False
        return True


def field_value(obj: Mapping[str, Any], path: str) -> str:
    """The string value of a dotted field path; missing is ``""``, booleans are ``true``/``false``."""
    cur: Any = obj
    for part in path.split("."):
        if not isinstance(cur, Mapping):
            return ""
        cur = cur.get(part)
    if cur is None:
        return ""
    if isinstance(cur, bool):
        return "true" if cur else "false"
    if isinstance(cur, Mapping):
        # events' "source" is an object; upstream selects on source.component
        return str(cur.get("component", ""))
    return str(cur)


def parse_field_selector(text: str | None, *, kind: str) -> FieldSelector:
    """Parse a ``fieldSelector`` query string for ``kind`` (plural); unknown fields are a 400."""
    if text is None or not text.strip():
        return FieldSelector()
    allowed = _COMMON_FIELDS | _FIELDS.get(kind, frozenset())
    reqs: list[FieldRequirement] = []
    for part in text.split(","):
        item = part.strip()
        token = next((t for t in ("!=", "==", "=") if t in item), None)
        if token is None:
            raise validation.bad_request(f"invalid selector: {item!r}; can't understand {item!r}")
        path, _, value = item.partition(token)
        path = path.strip()
        negate = token == "!="
        if path not in allowed:
            raise validation.bad_request(f'field label not supported: "{path}"')
        reqs.append(FieldRequirement(path, negate, value.strip()))
    return FieldSelector(tuple(reqs))


def _from_object(selector: Any, *, where: str) -> LabelSelector:
    if selector is None:
        return LabelSelector()
    if not isinstance(selector, Mapping):
        raise validation.bad_request(f"{where}: a LabelSelector must be an object")
    reqs: list[Requirement] = []
    match_labels = selector.get("matchLabels") or {}
    if not isinstance(match_labels, Mapping):
        raise validation.bad_request(f"{where}.matchLabels: must be an object of strings")
    for key, value in match_labels.items():
        if not isinstance(value, str):
            raise validation.bad_request(f"{where}.matchLabels[{key}]: must be a string")
        reqs.append(Requirement(_check_key(str(key)), "=", frozenset({value})))
    ops: dict[str, Op] = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!exists"}
    expressions = selector.get("matchExpressions") or []
    if not isinstance(expressions, list):
        raise validation.bad_request(f"{where}.matchExpressions: must be a list")
    for i, expr in enumerate(expressions):
        if not isinstance(expr, Mapping) or expr.get("operator") not in ops:
            raise validation.bad_request(
                f"{where}.matchExpressions[{i}]: operator must be one of {sorted(ops)}"
            )
        op = ops[expr["operator"]]
        values = expr.get("values") or []
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise validation.bad_request(f"{where}.matchExpressions[{i}].values: must be a list of strings")
        if op in ("in", "notin") and not values:
            raise validation.bad_request(
                f"{where}.matchExpressions[{i}].values: must be non-empty for {expr['operator']}"
            )
        if op in ("exists", "!exists") and values:
            raise validation.bad_request(
                f"{where}.matchExpressions[{i}].values: must be empty for {expr['operator']}"
            )
        reqs.append(Requirement(_check_key(str(expr.get("key", ""))), op, frozenset(values)))
    return LabelSelector(tuple(reqs))


def compile_label_selector(selector: Any, *, where: str = "selector") -> Callable[[Mapping[str, str]], bool]:
    """Compile a LabelSelector object (``matchLabels``/``matchExpressions``) into a predicate."""
    return _from_object(selector, where=where).matches


def match_label_selector(selector: Any, labels: Mapping[str, str]) -> bool:
    """Does a LabelSelector object match ``labels``? None or ``{}`` matches everything."""
    return _from_object(selector, where="selector").matches(labels)
