"""Kubernetes resource quantities ("4000", "4Gi", "16G", "500m", "1e3") parsed exactly.

The grammar is apimachinery's: a signed decimal number followed by a binary suffix (Ki..Ei), a
decimal suffix (n, u, m, "", k, M, G, T, P, E) or a decimal exponent (e3, E-2). Values are
``decimal.Decimal`` so "0.5Gi" and "1500m" stay exact.
"""

from __future__ import annotations

import decimal
import re

from vgpu.core import errors

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": decimal.Decimal("1e-9"),
    "u": decimal.Decimal("1e-6"),
    "m": decimal.Decimal("1e-3"),
    "": decimal.Decimal(1),
    "k": decimal.Decimal("1e3"),
    "M": decimal.Decimal("1e6"),
    "G": decimal.Decimal("1e9"),
    "T": decimal.Decimal("1e12"),
    "P": decimal.Decimal("1e15"),
    "E": decimal.Decimal("1e18"),
}
_QUANTITY = re.compile(
    r"^(?P<num>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?$"
)
_CTX = decimal.Context(prec=60)
MAX_MAGNITUDE = decimal.Decimal(2**63 - 1)  # apimachinery's bound on any quantity
MAX_EXPONENT_DIGITS = 3  # e999 at most; anything larger is out of range (or 0) before computing
MIB = 2**20


def parse(value: object, *, field: str) -> decimal.Decimal:
    """Parse a quantity (a string, or a number as YAML/JSON may give one).

    Like apimachinery, no quantity may be larger than 2^63-1 in magnitude: a bigger one (``1e999999999``,
    a 400-digit number, infinity) is a ``QuantityError`` naming the field, never a decimal trap or a
    huge integer built for nothing.
    """
    try:
        amount = _parse(value, field=field)
    except decimal.DecimalException:  # belt and braces: the checks below keep the context in range
        raise errors.QuantityError(field, f"invalid quantity {_shown(value)}: out of range") from None
    if amount.is_nan():
        raise errors.QuantityError(field, f"invalid quantity {_shown(value)}: not a number")
    if not amount.is_finite() or abs(amount) > MAX_MAGNITUDE:
        raise errors.QuantityError(
            field, f"invalid quantity {_shown(value)}: out of range (at most 2^63-1 in magnitude)"
        )
    return amount


def _shown(value: object) -> str:
    """``value`` for a message, short (never the repr of a huge or deeply nested value)."""
    if isinstance(value, str):
        return repr(value) if len(value) <= 60 else repr(value[:57]) + "..."
    if isinstance(value, bool | float) or (isinstance(value, int) and abs(value) < 10**40):
        return repr(value)
    if isinstance(value, int):
        return "a very large integer"
    return f"of type {type(value).__name__}"


def _parse(value: object, *, field: str) -> decimal.Decimal:
    if isinstance(value, bool):
        raise errors.QuantityError(field, f"invalid quantity {value!r}: a boolean is not a quantity")
    if isinstance(value, int):
        return decimal.Decimal(value)
    if isinstance(value, float):
        return decimal.Decimal(repr(value))
    if not isinstance(value, str):
        raise errors.QuantityError(field, f"invalid quantity {_shown(value)}: expected a string or a number")
    text = value.strip()
    match = _QUANTITY.match(text)
    if not match:
        raise errors.QuantityError(
            field,
            f"invalid quantity {_shown(value)}: expected a number with an optional suffix like Mi, Gi, G, m",
        )
    number = decimal.Decimal(match["num"])
    suffix = match["suffix"] or ""
    if suffix in _BINARY:
        return _CTX.multiply(number, decimal.Decimal(_BINARY[suffix]))
    if suffix in _DECIMAL:
        return _CTX.multiply(number, _DECIMAL[suffix])
    digits = suffix[1:].lstrip("+-").lstrip("0")
    if len(digits) > MAX_EXPONENT_DIGITS:  # 1e999999999: refused before any arithmetic
        if number.is_zero() or suffix[1:].startswith("-"):
            return decimal.Decimal(0)
        return decimal.Decimal("Infinity")
    return _CTX.multiply(number, _CTX.power(10, int(suffix[1:])))


def parse_int(value: object, *, field: str) -> int:
    """Parse a quantity that must be a whole number (a GPU count, a percentage)."""
    amount = parse(value, field=field)
    if amount != amount.to_integral_value():
        raise errors.QuantityError(field, f"invalid quantity {value!r}: must be a whole number")
    return int(amount)


def parse_mib(value: object, *, field: str) -> int:
    """Parse a GPU memory amount into MiB.

    A bare number is MiB (HAMi's unit for ``nvidia.com/gpumem``: "4000" is 4000 MiB). A number with
    a unit suffix is bytes, so "4Gi" is 4096 MiB and "16G" is 15258 MiB (rounded down). HAMi drops
    the whole request on a suffix (PROTOCOL.md I.11); we read what the user meant.
    """
    amount = parse(value, field=field)
    has_suffix = isinstance(value, str) and bool(re.search(r"[A-Za-z]$", value.strip()))
    mib = amount / MIB if has_suffix else amount
    if not has_suffix and mib != mib.to_integral_value():
        raise errors.QuantityError(field, f"invalid memory {value!r}: MiB must be a whole number")
    return int(mib.to_integral_value(rounding=decimal.ROUND_FLOOR))
