"""The small part of DRA's CEL device selectors the local cluster evaluates.

kube-scheduler compiles a DeviceClass's or a request's ``selectors[].cel.expression`` with the
full CEL environment of ``k8s.io/dynamic-resource-allocation/cel``. The local cluster only needs
what kube-vgpu's DeviceClass and claim templates write, so this module evaluates exactly:

- ``device.driver == "<name>"`` (and ``!=``);
- ``device.attributes["<domain>"].<id> == <literal>`` and ``device.attributes["<domain>"]["<id>"]``
  (and ``!=``), where the literal is a string (double or single quotes), an integer or
  ``true``/``false``;
- ``device.allowMultipleAllocations`` compared with a boolean;
- terms joined with ``&&`` (no parentheses, no ``||``).

Anything else is refused at parse time with ``UnsupportedSelector`` (say so, never guess). As in
CEL, an attribute the device does not have, or a comparison of values of different types, is a
runtime error (``SelectorError``), which kube-scheduler reports as a failed scheduling attempt.
A device attribute ``<id>`` without a domain belongs to the device's driver's domain, as in DRA.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any, Literal

from vgpu.core.errors import VgpuError

Value = str | int | bool


class SelectorError(VgpuError):
    """A selector that fails when evaluated against a device (CEL's runtime error)."""


class UnsupportedSelector(SelectorError):
    """A CEL expression outside the subset this module evaluates."""


_STRING = r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\''
_LITERAL = rf"(?P<lit>{_STRING}|-?[0-9]+|true|false)"
_OP = r"\s*(?P<op>==|!=)\s*"
_DRIVER = re.compile(rf"^device\.driver{_OP}{_LITERAL}$")
_MULTI = re.compile(rf"^device\.allowMultipleAllocations{_OP}{_LITERAL}$")
_ATTR = re.compile(
    rf"^device\.attributes\[\s*(?P<domain>{_STRING})\s*\]"
    rf"(?:\.(?P<id>[A-Za-z_][A-Za-z0-9_]*)|\[\s*(?P<key>{_STRING})\s*\]){_OP}{_LITERAL}$"
)


@dataclasses.dataclass(frozen=True, slots=True)
class Term:
    """One comparison: ``subject`` (driver, multi, or an attribute) against ``literal``."""

    subject: Literal["driver", "multi", "attribute"]
    negate: bool
    literal: Value
    domain: str = ""
    name: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class DeviceView:
    """What a selector can see of a device: its driver, attributes (as published) and whether it
    allows multiple allocations."""

    driver: str
    attributes: Mapping[str, Any]
    allow_multiple: bool


def _unquote(text: str) -> str:
    body = text[1:-1]
    return re.sub(r"\\(.)", r"\1", body)


def _literal(text: str) -> Value:
    if text in ("true", "false"):
        return text == "true"
    if text[0] in "\"'":
        return _unquote(text)
    return int(text)


def _split_and(expression: str) -> list[str]:
    """``expression`` split at top-level ``&&`` (outside string literals)."""
    parts, current, quote, i = [], [], "", 0
    while i < len(expression):
        ch = expression[i]
        if quote:
            current.append(ch)
            if ch == "\\" and i + 1 < len(expression):
                current.append(expression[i + 1])
                i += 1
            elif ch == quote:
                quote = ""
        elif ch in "\"'":
            quote = ch
            current.append(ch)
        elif expression.startswith("&&", i):
            parts.append("".join(current).strip())
            current = []
            i += 1
        else:
            current.append(ch)
        i += 1
    parts.append("".join(current).strip())
    return parts


def parse(expression: object) -> tuple[Term, ...]:
    """The terms of ``expression`` (all must hold), or ``UnsupportedSelector``."""
    if not isinstance(expression, str) or not expression.strip():
        raise UnsupportedSelector(f"CEL expression must be a non-empty string, got {expression!r}")
    terms = []
    for part in _split_and(expression.strip()):
        if m := _DRIVER.match(part):
            literal = _literal(m["lit"])
            terms.append(Term("driver", m["op"] == "!=", literal))
        elif m := _MULTI.match(part):
            terms.append(Term("multi", m["op"] == "!=", _literal(m["lit"])))
        elif m := _ATTR.match(part):
            name = m["id"] if m["id"] is not None else _unquote(m["key"])
            terms.append(Term("attribute", m["op"] == "!=", _literal(m["lit"]), _unquote(m["domain"]), name))
        else:
            raise UnsupportedSelector(
                f"CEL expression {expression!r}: {part!r} is outside the subset the local cluster "
                'evaluates (device.driver == "...", device.attributes["<domain>"].<name> == <literal>, '
                "joined with &&)"
            )
    return tuple(terms)


def _attribute(device: DeviceView, domain: str, name: str) -> Value:
    raw: Any = device.attributes.get(f"{domain}/{name}")
    if raw is None and domain == device.driver:
        raw = device.attributes.get(name)
    if not isinstance(raw, Mapping) or len(raw) != 1:
        raise SelectorError(f'no such key: {name} (device.attributes["{domain}"])')
    ((kind, value),) = raw.items()
    if kind == "int" and isinstance(value, int) and not isinstance(value, bool):
        return value
    if kind == "bool" and isinstance(value, bool):
        return value
    if kind in ("string", "version") and isinstance(value, str):
        return value
    raise SelectorError(f"attribute {domain}/{name}: unsupported value {raw!r}")


def _same_type(a: Value, b: Value) -> bool:
    return type(a) is type(b)


def matches(terms: tuple[Term, ...], device: DeviceView) -> bool:
    """Whether every term holds for ``device``; ``SelectorError`` for a CEL runtime error."""
    for term in terms:
        actual: Value
        if term.subject == "driver":
            actual = device.driver
        elif term.subject == "multi":
            actual = device.allow_multiple
        else:
            actual = _attribute(device, term.domain, term.name)
        if not _same_type(actual, term.literal):
            raise SelectorError(
                f"no such overload: {type(actual).__name__} == {type(term.literal).__name__} "
                f"({term.domain}/{term.name})"
            )
        if (actual == term.literal) == term.negate:
            return False
    return True
