"""Field errors as kube-apiserver words them (``field.ErrorList``) and the name and quantity rules
the DRA kinds use (DNS labels and subdomains, CSI driver names, qualified names with C-identifier
ids, quantities), shared by ``dravalidation`` and ``draslicecheck``."""

from __future__ import annotations

import json
import re
from typing import Any

from vgpu.core import errors, quantity
from vgpu.core.names import is_dns_subdomain
from vgpu.localcluster.validation import invalid

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_CSI_DRIVER = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_C_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class Errors:
    """A field.ErrorList: collects errors, then raises them as one 422."""

    def __init__(self) -> None:
        self.items: list[str] = []

    def required(self, path: str, detail: str = "") -> None:
        self.items.append(f"{path}: Required value" + (f": {detail}" if detail else ""))

    def invalid(self, path: str, value: Any, detail: str) -> None:
        shown = json.dumps(value) if isinstance(value, str | int | bool) or value is None else "{...}"
        self.items.append(f"{path}: Invalid value: {shown}: {detail}")

    def forbidden(self, path: str, detail: str) -> None:
        self.items.append(f"{path}: Forbidden: {detail}")

    def raise_for(self, kind: str, name: str) -> None:
        if not self.items:
            return
        body = self.items[0] if len(self.items) == 1 else "[" + ", ".join(self.items) + "]"
        raise invalid(f'{kind} "{name}" is invalid: {body}')


def label(errs: Errors, path: str, value: Any) -> None:
    if not isinstance(value, str) or not value:
        errs.required(path)
    elif len(value) > 63 or not _DNS_LABEL.fullmatch(value):
        errs.invalid(
            path,
            value,
            "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-'",
        )


def subdomain(errs: Errors, path: str, value: Any) -> None:
    if not isinstance(value, str) or not value:
        errs.required(path)
    elif not is_dns_subdomain(value):
        errs.invalid(
            path,
            value,
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.'",
        )


def driver(errs: Errors, path: str, value: Any) -> None:
    if not isinstance(value, str) or not value:
        errs.required(path)
    elif len(value) > 63:
        errs.invalid(path, value, "must be 63 characters or less")
    elif not _CSI_DRIVER.fullmatch(value):
        errs.invalid(path, value, "a valid name must consist of alphanumeric characters, '-', '_' or '.'")


def qualified(errs: Errors, path: str, name: str) -> None:
    domain, _, ident = name.rpartition("/")
    if "/" in name and not domain:
        errs.invalid(path, "", "the domain must not be empty")
    elif domain:
        driver(errs, path, domain)
    if len(ident) > 32:
        errs.invalid(path, ident, "may not be more than 32 bytes")
    elif not _C_IDENTIFIER.fullmatch(ident):
        errs.invalid(
            path,
            ident,
            "a valid C identifier must start with alphabetic character or '_', followed by a string of alphanumeric characters or '_'",
        )


def parsed(errs: Errors, path: str, raw: Any) -> Any:
    try:
        return quantity.parse(raw, field=path)
    except errors.QuantityError as exc:
        errs.invalid(path, raw, str(exc))
        return None
