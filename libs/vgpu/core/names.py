"""Kubernetes' name rules that several parts check: an RFC 1123 DNS subdomain (object names, the
prefix of annotation and label keys), a qualified name, and an extended resource name (what a
device plugin may register with kubelet)."""

from __future__ import annotations

import re

_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def is_dns_subdomain(text: str, *, max_len: int = 253) -> bool:
    """Whether ``text`` is a lowercase RFC 1123 subdomain of at most ``max_len`` characters (the whole
    text: a trailing newline does not pass, as it would with ``re.match`` and ``$``)."""
    return len(text) <= max_len and _DNS_SUBDOMAIN.fullmatch(text) is not None


_QUALIFIED_NAME_PART = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_REQUESTS_PREFIX = "requests."
_NATIVE_PREFIX = "kubernetes.io/"


def is_qualified_name(name: str) -> bool:
    """apimachinery's ``IsQualifiedName``: ``[prefix/]name``, prefix a DNS subdomain, name <= 63."""
    parts = name.split("/")
    if len(parts) == 1:
        local = parts[0]
    elif len(parts) == 2:
        prefix, local = parts
        if not prefix or not is_dns_subdomain(prefix):
            return False
    else:
        return False
    return 0 < len(local) <= 63 and _QUALIFIED_NAME_PART.fullmatch(local) is not None


def is_extended_resource_name(name: str) -> bool:
    """Kubernetes' ``IsExtendedResourceName`` (docs/protocol.md#how-kubelet-uses-them): what kubelet accepts in a device
    plugin's Register. It must contain a ``/``, must not be a ``kubernetes.io/`` (or
    ``*.kubernetes.io/``) name, must not start with ``requests.``, and ``requests.<name>`` must be a
    qualified name."""
    if "/" not in name or _NATIVE_PREFIX in name or name.startswith(_REQUESTS_PREFIX):
        return False
    return is_qualified_name(_REQUESTS_PREFIX + name)
