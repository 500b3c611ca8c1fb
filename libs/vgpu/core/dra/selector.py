"""The small part of DRA's CEL device selectors the local cluster evaluates.

kube-scheduler compiles a DeviceClass's or a request's ``selectors[].cel.expression`` with the
full CEL environment of ``k8s.io/dynamic-resource-allocation/cel``. The local cluster only needs
what kube-vgpu's DeviceClasses and claim templates write, so this module evaluates exactly these
terms, where ``ATTR`` is ``device.attributes["<domain>"].<id>`` or
``device.attributes["<domain>"]["<id>"]``:

- ``device.driver == "<name>"``, ``ATTR == <literal>``, ``device.allowMultipleAllocations ==
  <bool>`` (and ``!=``), a literal being a string (double or single quotes), an integer or
  ``true``/``false``;
- ``ATTR.contains("<s>")`` and ``ATTR.lowerAscii().contains("<s>")``, optionally negated with ``!``;
- ``ATTR in [<literal>, ...]`` and ``!(ATTR in [...])``;
- terms joined with ``&&``, and such conjunctions joined with ``||`` (``&&`` binds tighter, as in
  CEL); no other parentheses.

Anything else is refused at parse time with ``UnsupportedSelector`` (say so, never guess). As in
CEL, an attribute the device does not have, or a comparison of values of different types, is a
runtime error (``SelectorError``), which kube-scheduler reports as a failed scheduling attempt; an
``||`` that is true on one side is true whatever the other side does. A device attribute ``<id>``
without a domain belongs to the device's driver's domain, as in DRA.
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
_LIT = rf"(?:{_STRING}|-?[0-9]+|true|false)"
_ATTR = (
    rf"device\.attributes\[\s*(?P<domain>{_STRING})\s*\]"
    rf"(?:\.(?P<id>[A-Za-z_][A-Za-z0-9_]*)|\[\s*(?P<key>{_STRING})\s*\])"
)
_COMPARE = re.compile(
    rf"^(?:(?P<driver>device\.driver)|(?P<multi>device\.allowMultipleAllocations)|{_ATTR})"
    rf"\s*(?P<op>==|!=)\s*(?P<lit>{_LIT})$"
)
_CONTAINS = re.compile(
    rf"^(?P<neg>!\s*)?{_ATTR}(?P<lower>\.lowerAscii\(\))?\.contains\(\s*(?P<lit>{_STRING})\s*\)$"
)
_IN = re.compile(rf"^(?P<neg>!\s*\(\s*)?{_ATTR}\s+in\s+\[(?P<list>[^\]]*)\](?(neg)\s*\))$")
_LIST_ITEM = re.compile(rf"\s*({_LIT})\s*(?:,|$)")


@dataclasses.dataclass(frozen=True, slots=True)
class Term:
    """One test of a device: ``subject`` (driver, multi, or an attribute) against ``values``."""

    subject: Literal["driver", "multi", "attribute"]
    op: Literal["==", "contains", "in"]
    negate: bool
    values: tuple[Value, ...]
    domain: str = ""
    name: str = ""
    lower: bool = False


Conjunction = tuple[Term, ...]
Expression = tuple[Conjunction, ...]  # any conjunction true: the expression is true


@dataclasses.dataclass(frozen=True, slots=True)
class DeviceView:
    """What a selector can see of a device: its driver, attributes (as published) and whether it
    allows multiple allocations."""

    driver: str
    attributes: Mapping[str, Any]
    allow_multiple: bool


def _unquote(text: str) -> str:
    return re.sub(r"\\(.)", r"\1", text[1:-1])


def _literal(text: str) -> Value:
    if text in ("true", "false"):
        return text == "true"
    if text[0] in "\"'":
        return _unquote(text)
    return int(text)


def _split(expression: str, operator: str) -> list[str]:
    """``expression`` split at ``operator`` outside string literals and brackets."""
    parts, current, quote, depth, i = [], [], "", 0, 0
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
        elif ch in "([":
            depth += 1
            current.append(ch)
        elif ch in ")]":
            depth -= 1
            current.append(ch)
        elif depth == 0 and expression.startswith(operator, i):
            parts.append("".join(current).strip())
            current = []
            i += len(operator) - 1
        else:
            current.append(ch)
        i += 1
    parts.append("".join(current).strip())
    return parts


def _attr_name(m: re.Match[str]) -> tuple[str, str]:
    return _unquote(m["domain"]), m["id"] if m["id"] is not None else _unquote(m["key"])


def _term(part: str, expression: str) -> Term:
    if m := _COMPARE.match(part):
        literal = _literal(m["lit"])
        negate = m["op"] == "!="
        if m["driver"]:
            return Term("driver", "==", negate, (literal,))
        if m["multi"]:
            return Term("multi", "==", negate, (literal,))
        domain, name = _attr_name(m)
        return Term("attribute", "==", negate, (literal,), domain, name)
    if m := _CONTAINS.match(part):
        domain, name = _attr_name(m)
        return Term(
            "attribute", "contains", bool(m["neg"]), (_unquote(m["lit"]),), domain, name, bool(m["lower"])
        )
    if m := _IN.match(part):
        items = _LIST_ITEM.findall(m["list"])
        if ",".join(i.strip() for i in items) != ",".join(
            x.strip() for x in m["list"].split(",") if x.strip()
        ):
            raise UnsupportedSelector(f"CEL expression {expression!r}: cannot read the list in {part!r}")
        domain, name = _attr_name(m)
        return Term("attribute", "in", bool(m["neg"]), tuple(_literal(i) for i in items), domain, name)
    raise UnsupportedSelector(
        f"CEL expression {expression!r}: {part!r} is outside the subset the local cluster evaluates "
        '(device.driver == "...", device.attributes["<domain>"].<name> == <literal>, .contains("..."), '
        "in [...], joined with && and ||)"
    )


def parse(expression: object) -> Expression:
    """The expression as alternatives of conjunctions, or ``UnsupportedSelector``."""
    if not isinstance(expression, str) or not expression.strip():
        raise UnsupportedSelector(f"CEL expression must be a non-empty string, got {expression!r}")
    text = expression.strip()
    return tuple(tuple(_term(part, text) for part in _split(alt, "&&")) for alt in _split(text, "||"))


def attribute(device: DeviceView, domain: str, name: str) -> Value:
    """The device's attribute ``<domain>/<name>``; ``SelectorError`` when it has none."""
    return _attribute(device, domain, name)


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


def _holds(term: Term, device: DeviceView) -> bool:
    actual: Value
    if term.subject == "driver":
        actual = device.driver
    elif term.subject == "multi":
        actual = device.allow_multiple
    else:
        actual = _attribute(device, term.domain, term.name)
    if term.op == "contains":
        if not isinstance(actual, str):
            raise SelectorError(
                f"no such overload: {type(actual).__name__}.contains ({term.domain}/{term.name})"
            )
        result = str(term.values[0]) in (actual.lower() if term.lower else actual)
    else:
        for value in term.values:
            if type(actual) is not type(value):
                raise SelectorError(
                    f"no such overload: {type(actual).__name__} == {type(value).__name__} "
                    f"({term.domain}/{term.name})"
                )
        result = actual in term.values
    return result != term.negate


def matches(expression: Expression, device: DeviceView) -> bool:
    """Whether ``expression`` holds for ``device``; ``SelectorError`` for a CEL runtime error."""
    failure: SelectorError | None = None
    for conjunction in expression:
        try:
            if _all(conjunction, device):
                return True
        except SelectorError as exc:
            failure = exc
    if failure is not None:
        raise failure
    return False


def _all(conjunction: Conjunction, device: DeviceView) -> bool:
    """CEL's ``&&``: false when a term is false, even if another one errs; else the error."""
    failure: SelectorError | None = None
    for term in conjunction:
        try:
            if not _holds(term, device):
                return False
        except SelectorError as exc:
            failure = failure or exc
    if failure is not None:
        raise failure
    return True
