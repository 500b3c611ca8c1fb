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
    ("raw", "mib"),
    [
        ("4000", 4000),
        (2048, 2048),
        # kube-apiserver's canonical forms of plain MiB numbers: 2000 is stored as 2k, 40000 as 40k
        ("2k", 2000),
        ("40k", 40000),
        ("1M", 1_000_000),
        ("1.5k", 1500),
        ("1e3", 1000),
        ("16G", 16_000_000_000),  # a number of MiB, as HAMi reads it (no GPU is that big)
        # binary suffixes are bytes (the API server never makes one out of a plain number)
        ("4Gi", 4096),
        ("512Mi", 512),
        ("1536Ki", 1),
        ("0Gi", 0),
    ],
)
def test_parse_mib(raw: object, mib: int) -> None:
    assert quantity.parse_mib(raw, field="f") == mib


@pytest.mark.parametrize(
    ("raw", "why"), [("1.5", "whole number"), ("500m", "whole number"), ("512Ki", "1 MiB")]
)
def test_parse_mib_rejects_amounts_that_are_not_whole_mib(raw: str, why: str) -> None:
    """Read as 0 they would mean no memory term: the whole GPU."""
    with pytest.raises(errors.QuantityError, match=why):
        quantity.parse_mib(raw, field="f")


@given(st.integers(min_value=0, max_value=2**40))
def test_plain_mib_read_the_same_in_kube_apiservers_canonical_form(n: int) -> None:
    """2000 -> 2k, 1000000 -> 1M: what a pod's limit reads back as from a real API server."""
    assert quantity.parse_mib(quantity.canonical(str(n)), field="f") == n


# each pair as kube-apiserver v1.20.2 stored it (a pod's cpu limits, read back; docs/benchmarks.md)
KUBE_APISERVER_STORED = [
    ("2000", "2k"), ("1500", "1500"), ("0.5", "500m"), ("2048Mi", "2Gi"), ("1.5Gi", "1536Mi"),
    ("1e3", "1e3"), ("1000m", "1"), ("40960", "40960"), ("100m", "100m"), ("128Mi", "128Mi"),
    ("64", "64"), ("512Gi", "512Gi"), ("1k", "1k"), ("16G", "16G"), ("1M", "1M"), ("4096", "4096"),
    ("1024Ki", "1Mi"), ("12e2", "1200"), ("500", "500"), ("0.1", "100m"), ("1Ki", "1Ki"),
    ("1023Ki", "1023Ki"), ("2.5k", "2500"), ("7E", "7E"), ("3e6", "3e6"), ("1500000", "1500k"),
]  # fmt: skip


@pytest.mark.parametrize(("written", "stored"), KUBE_APISERVER_STORED)
def test_canonical_is_what_kube_apiserver_stores(written: str, stored: str) -> None:
    assert quantity.canonical(written) == stored


@given(st.integers(min_value=-(2**30), max_value=2**30), st.sampled_from(["", "k", "Mi", "m", "e2", "Gi"]))
def test_canonical_keeps_the_value(number: int, suffix: str) -> None:
    written = f"{number}{suffix}"
    assert quantity.parse(quantity.canonical(written), field="f") == quantity.parse(written, field="f")
    assert quantity.canonical(quantity.canonical(written)) == quantity.canonical(written)


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
