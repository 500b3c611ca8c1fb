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


def _suffix(value: object) -> str:
    """The suffix a quantity was written with ("" for none, or a number given as a number)."""
    match = _QUANTITY.match(value.strip()) if isinstance(value, str) else None
    return (match["suffix"] or "") if match else ""


def parse_mib(value: object, *, field: str) -> int:
    """Parse a GPU memory amount into MiB.

    A number is MiB, HAMi's unit for ``nvidia.com/gpumem``, whatever decimal suffix or exponent
    it carries: kube-apiserver stores quantities in canonical form, so a limit written ``2000``
    reads back as ``2k`` and ``1000000`` as ``1M`` (and HAMi reads the number, 2000). A binary
    suffix is bytes, so ``4Gi`` is 4096 MiB and ``1536Ki`` 1 MiB (rounded down); the API server
    never turns a plain number into one. HAMi reads a binary suffix's bytes into a 32-bit MiB field,
    so ``16Gi`` wraps to no memory term (docs/protocol.md#resources-and-requests); we read what the
    user meant. A fraction of a MiB (``1.5``, ``500m``) and a positive amount under 1 MiB (``512Ki``) are errors: read as 0 they would mean "no memory term", the
    whole GPU.
    """
    amount = parse(value, field=field)
    binary = _suffix(value) in _BINARY
    mib = amount / MIB if binary else amount
    if not binary and mib != mib.to_integral_value():
        raise errors.QuantityError(field, f"invalid memory {value!r}: MiB must be a whole number")
    whole = int(mib.to_integral_value(rounding=decimal.ROUND_FLOOR))
    if binary and amount > 0 and whole == 0:
        raise errors.QuantityError(field, f"invalid memory {value!r}: less than 1 MiB")
    return whole


_DECIMAL_SUFFIX = {-9: "n", -6: "u", -3: "m", 0: "", 3: "k", 6: "M", 9: "G", 12: "T", 15: "P", 18: "E"}
_BINARY_SUFFIX = ("", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei")


def canonical(value: object, *, field: str = "quantity") -> str:
    """The string kube-apiserver stores for a quantity (apimachinery's ``CanonicalizeBytes``):
    ``2000`` -> ``2k``, ``1500`` -> ``1500``, ``0.5`` -> ``500m``, ``2048Mi`` -> ``2Gi``,
    ``1.5Gi`` -> ``1536Mi``, ``1e3`` -> ``1e3``, ``1000m`` -> ``1``. The format follows the
    suffix written: binary (Ki..Ei) stays binary when the value is a whole number of at least
    1024 in magnitude, an exponent stays an exponent, anything else is decimal SI; the number is
    an integer with the largest exponent that is a multiple of 3 (a multiple of 1024 for binary)."""
    amount = parse(value, field=field)
    if amount.is_zero():
        return "0"
    suffix = _suffix(value)
    if suffix in _BINARY and abs(amount) >= 1024 and amount == amount.to_integral_value():
        mantissa, power = int(amount), 0
        while mantissa % 1024 == 0 and power < len(_BINARY_SUFFIX) - 1:
            mantissa //= 1024
            power += 1
        return f"{mantissa}{_BINARY_SUFFIX[power]}"
    sign, digits, exponent = amount.normalize(_CTX).as_tuple()
    assert isinstance(exponent, int)  # finite: parse refused the rest
    mantissa = int("".join(map(str, digits)))
    shift = exponent % 3  # lower the exponent to a multiple of 3, the mantissa grows to match
    mantissa, exponent = mantissa * 10**shift, exponent - shift
    number = f"{'-' if sign else ''}{mantissa}"
    if len(suffix) > 1 and suffix[0] in "eE":  # an exponent (a bare E is exa)
        return number + (f"e{exponent}" if exponent else "")
    if exponent in _DECIMAL_SUFFIX:
        return number + _DECIMAL_SUFFIX[exponent]
    return f"{number}e{exponent}"
