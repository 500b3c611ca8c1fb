"""Kubernetes' name rules that several parts check: an RFC 1123 DNS subdomain (object names, the
prefix of annotation and label keys)."""

from __future__ import annotations

import re

_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def is_dns_subdomain(text: str, *, max_len: int = 253) -> bool:
    """Whether ``text`` is a lowercase RFC 1123 subdomain of at most ``max_len`` characters (the whole
    text: a trailing newline does not pass, as it would with ``re.match`` and ``$``)."""
    return len(text) <= max_len and _DNS_SUBDOMAIN.fullmatch(text) is not None
