"""Kubernetes quantity parsing: exact values, MiB conversion, clear errors."""

from __future__ import annotations

import decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st
from vgpu.core import errors, quantity


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("4000", decimal.Decimal(4000)),
        ("4Gi", decimal.Decimal(4 * 2**30)),
        ("16G", decimal.Decimal(16 * 10**9)),
        ("1.5Ki", decimal.Decimal(1536)),
        ("500m", decimal.Decimal("0.5")),
        ("1e3", decimal.Decimal(1000)),
        ("2E-1", decimal.Decimal("0.2")),
        ("+7", decimal.Decimal(7)),
        ("-3", decimal.Decimal(-3)),
        (".5", decimal.Decimal("0.5")),
        (12, decimal.Decimal(12)),
        (0.25, decimal.Decimal("0.25")),
    ],
)
def test_parse(raw: object, expected: decimal.Decimal) -> None:
    assert quantity.parse(raw, field="f") == expected


@pytest.mark.parametrize(
    "raw", ["", "abc", "4GB", "4 Gi", "Gi", "1.2.3", "--1", "0x10", "4gi", True, None, [1]]
)
def test_parse_garbage_names_the_field(raw: object) -> None:
    with pytest.raises(errors.QuantityError) as info:
        quantity.parse(raw, field="container main: nvidia.com/gpumem")
    assert info.value.field == "container main: nvidia.com/gpumem"
    assert "invalid quantity" in str(info.value)


@pytest.mark.parametrize(
    ("raw", "mib"), [("4000", 4000), ("4Gi", 4096), ("16G", 15258), ("512Mi", 512), (2048, 2048)]
)
def test_parse_mib(raw: object, mib: int) -> None:
    assert quantity.parse_mib(raw, field="f") == mib


def test_parse_mib_rejects_fractional_bare_numbers() -> None:
    with pytest.raises(errors.QuantityError, match="whole number"):
        quantity.parse_mib("1.5", field="f")


def test_parse_int_rejects_fractions() -> None:
    assert quantity.parse_int("2", field="f") == 2
    assert quantity.parse_int("2000m", field="f") == 2
    with pytest.raises(errors.QuantityError, match="whole number"):
        quantity.parse_int("1500m", field="f")


@given(st.integers(min_value=0, max_value=2**40))
def test_plain_integers_round_trip(n: int) -> None:
    assert quantity.parse_int(str(n), field="f") == n
    assert quantity.parse_mib(f"{n}Mi", field="f") == n


@pytest.mark.parametrize(
    "raw",
    [
        *["1e999999999", "-1e999999999", "1e" + "9" * 5000, "9" * 5000, "1e19", "9e999"],
        *[1e308, -(2**64), float("inf"), float("nan"), 10**5000],
    ],
    ids=lambda raw: type(raw).__name__ + ":" + (repr(raw)[:12] if not isinstance(raw, int) else "int"),
)
def test_out_of_range_quantities_are_quantity_errors_naming_the_field(raw: object) -> None:
    # apimachinery caps every quantity at 2^63-1; decimal traps and huge ints never escape
    with pytest.raises(errors.QuantityError) as info:
        quantity.parse_int(raw, field="container c: nvidia.com/gpucores")
    assert info.value.field == "container c: nvidia.com/gpucores"
    assert len(str(info.value)) < 300


@pytest.mark.parametrize(("raw", "expected"), [("1e-999999999", 0), ("0e999999999", 0), ("1e18", 10**18)])
def test_extreme_exponents_within_range(raw: str, expected: int) -> None:
    assert quantity.parse(raw, field="f") == expected
