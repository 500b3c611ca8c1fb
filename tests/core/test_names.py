"""Kubernetes' DNS subdomain rule, shared by object names and annotation key prefixes."""

from __future__ import annotations

import pytest
from vgpu.core.names import is_dns_subdomain


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("hami.io", True),
        ("node-1.example.com", True),
        ("a" * 253, True),
        ("a" * 254, False),
        ("", False),
        ("Hami.io", False),
        ("hami.io/", False),
        ("-a", False),
        ("a.", False),
        ("abc\n", False),  # re.match with "$" let a trailing newline through
    ],
)
def test_is_dns_subdomain(text: str, want: bool) -> None:
    assert is_dns_subdomain(text) is want


def test_a_shorter_limit() -> None:
    assert is_dns_subdomain("a" * 63, max_len=63) and not is_dns_subdomain("a" * 64, max_len=63)
