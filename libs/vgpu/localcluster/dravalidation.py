"""What kube-apiserver 1.36 checks and defaults on the DRA kinds (``pkg/apis/resource/validation``,
``pkg/apis/resource/v1/defaults.go``) and on a pod's claims (``pkg/apis/core/validation``), for the
fields kube-vgpu and kube-scheduler use. Errors are 422 ``Invalid`` with kube-apiserver's wording:
``<Kind>.resource.k8s.io "<name>" is invalid: <field errors>``.

- **defaults**: a request's (or subrequest's) ``allocationMode`` is ``ExactCount`` and its ``count``
  1; a device taint's ``timeAdded`` is now;
- **ResourceSlice**: ``driver`` (a CSI driver name), ``pool`` (name, ``resourceSliceCount`` > 0,
  ``generation`` >= 0), exactly one of ``nodeName``/``nodeSelector``/``allNodes``/
  ``perDeviceNodeSelection``; at most 128 devices (64 with taints), each a unique DNS label with
  at most 32 attributes and capacities (qualified names), attribute values of one type, taints with
  a known effect; a capacity's ``requestPolicy`` only on a device with ``allowMultipleAllocations``,
  and then consistent (a ``default``, ``validRange.min`` not above the value, ``max`` not above the
  value nor below ``min``, the default and max on the ``step`` grid, ``validValues`` sorted, the
  default among them); ``driver``, ``pool.name`` and ``nodeName`` immutable;
- **claims and templates**: requests (unique DNS labels, at most 32) with exactly one of
  ``exactly``/``firstAvailable`` (at most 8 subrequests), a ``deviceClassName``, a known
  ``allocationMode``, ``count`` > 0 for ExactCount and none for All, CEL selectors that are not
  empty (the expressions themselves are not compiled); a claim's spec is immutable;
- **claim status**: ``reservedFor`` only with an ``allocation``, entries with resource, name and uid;
  an allocation, once set, is immutable; each result names a request of the claim, a driver, a pool,
  a device and, when given, a ``shareID`` in normalised UUID form;
- **DeviceClass**: selectors with an expression;
- **pods**: ``spec.resourceClaims`` entries with unique DNS-label names and exactly one of
  ``resourceClaimName``/``resourceClaimTemplateName``; each container's ``resources.claims`` names
  one of them; ``spec.resourceClaims`` cannot change after creation.
"""

from __future__ import annotations

import datetime
import json
import uuid
from collections.abc import Mapping
from typing import Any

from vgpu.kube.port import JsonObj
from vgpu.localcluster import drafields as f
from vgpu.localcluster import draslicecheck

_MODES = ("All", "ExactCount")


# ----- claims -----


def _request_body(errs: f.Errors, path: str, body: Mapping[str, Any]) -> None:
    f.subdomain(errs, f"{path}.deviceClassName", body.get("deviceClassName"))
    mode, count = body.get("allocationMode"), body.get("count", 0)
    if mode == "All" and count:
        errs.invalid(f"{path}.count", count, "must not be specified when allocationMode is 'All'")
    elif mode == "ExactCount" and (not isinstance(count, int) or count <= 0):
        errs.invalid(f"{path}.count", count, "must be greater than zero")
    elif mode not in _MODES:
        errs.items.append(
            f'{path}.allocationMode: Unsupported value: {json.dumps(mode)}: supported values: "All", "ExactCount"'
        )
    selectors = body.get("selectors") or []
    if len(selectors) > 32:
        errs.invalid(f"{path}.selectors", len(selectors), "must have at most 32 items")
    for i, sel in enumerate(selectors):
        cel = sel.get("cel") if isinstance(sel, Mapping) else None
        if (
            not isinstance(cel, Mapping)
            or not isinstance(cel.get("expression"), str)
            or not cel["expression"].strip()
        ):
            errs.required(f"{path}.selectors[{i}].cel.expression")
    requests = (body.get("capacity") or {}).get("requests") or {}
    for key, value in requests.items() if isinstance(requests, Mapping) else ():
        f.qualified(errs, f"{path}.capacity.requests[{key}]", key)
        f.parsed(errs, f"{path}.capacity.requests[{key}]", value)


def _default_request(body: Any) -> None:
    if isinstance(body, dict):
        body.setdefault("allocationMode", "ExactCount")
        if body["allocationMode"] == "ExactCount" and not body.get("count"):
            body["count"] = 1


def _claim_spec(errs: f.Errors, path: str, spec: Any) -> dict[str, set[str]]:
    """Validate (and default) a ResourceClaimSpec; the request names and their subrequests."""
    devices = spec.get("devices") if isinstance(spec, Mapping) else None
    requests = devices.get("requests") or [] if isinstance(devices, Mapping) else []
    if len(requests) > 32:
        errs.invalid(f"{path}.devices.requests", len(requests), "must have at most 32 items")
    known: dict[str, set[str]] = {}
    for i, request in enumerate(requests):
        at = f"{path}.devices.requests[{i}]"
        if not isinstance(request, dict):
            errs.required(at)
            continue
        f.label(errs, f"{at}.name", request.get("name"))
        if request.get("name") in known:
            errs.items.append(f'{at}.name: Duplicate value: "{request.get("name")}"')
        exactly, first = request.get("exactly"), request.get("firstAvailable") or []
        if (exactly is not None) + bool(first) != 1:
            which = "required" if exactly is None and not first else "required, but multiple fields are set"
            errs.required(
                at, f"exactly one of `exactly` or `firstAvailable` is {which}"
            ) if exactly is None and not first else errs.invalid(
                at, None, f"exactly one of `exactly` or `firstAvailable` is {which}"
            )
        subs: set[str] = set()
        if isinstance(exactly, dict):
            _default_request(exactly)
            _request_body(errs, f"{at}.exactly", exactly)
        if len(first) > 8:
            errs.invalid(f"{at}.firstAvailable", len(first), "must have at most 8 items")
        for j, sub in enumerate(first):
            _default_request(sub)
            if isinstance(sub, dict):
                f.label(errs, f"{at}.firstAvailable[{j}].name", sub.get("name"))
                subs.add(str(sub.get("name")))
                _request_body(errs, f"{at}.firstAvailable[{j}]", sub)
        known[str(request.get("name"))] = subs
    return known


def _claim_status(errs: f.Errors, status: Any, old: Any, known: dict[str, set[str]]) -> None:
    status = status if isinstance(status, Mapping) else {}
    old = old if isinstance(old, Mapping) else {}
    allocation = status.get("allocation")
    for i, ref in enumerate(status.get("reservedFor") or []):
        for key in ("resource", "name", "uid"):
            if not isinstance(ref, Mapping) or not ref.get(key):
                errs.required(f"status.reservedFor[{i}].{key}")
    if status.get("reservedFor") and allocation is None:
        errs.forbidden("status.reservedFor", "may not be specified when `allocated` is not set")
    if old.get("allocation") is not None and allocation is not None:
        if allocation != old["allocation"]:
            errs.invalid("status.allocation", None, "field is immutable")
        return
    if not isinstance(allocation, Mapping):
        return
    results = (allocation.get("devices") or {}).get("results") or []
    for i, result in enumerate(results):
        at = f"status.allocation.devices.results[{i}]"
        if not isinstance(result, Mapping):
            errs.required(at)
            continue
        request = str(result.get("request") or "")
        parent, _, sub = request.partition("/")
        if parent not in known or (sub and sub not in known[parent]) or (not sub and known[parent]):
            errs.invalid(
                f"{at}.request",
                request,
                "must be the name of a request in the claim or the name of a request and a subrequest separated by '/'",
            )
        f.driver(errs, f"{at}.driver", result.get("driver"))
        f.subdomain(errs, f"{at}.pool", result.get("pool"))
        f.label(errs, f"{at}.device", result.get("device"))
        share = result.get("shareID")
        if share is not None and not _is_uuid(share):
            errs.invalid(
                f"{at}.shareID",
                share,
                "uid must be in RFC 4122 normalized form, `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` with lowercase hexadecimal characters",
            )


def _is_uuid(value: Any) -> bool:
    if not isinstance(value, str) or len(value) != 36 or value != value.lower():
        return False
    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return True


# ----- pods -----


def _pod_claims(errs: f.Errors, spec: Mapping[str, Any]) -> None:
    claims = spec.get("resourceClaims") or []
    names: set[str] = set()
    for i, claim in enumerate(claims):
        at = f"spec.resourceClaims[{i}]"
        name = claim.get("name") if isinstance(claim, Mapping) else None
        if not name:
            errs.required(f"{at}.name")
        elif name in names:
            errs.items.append(f'{at}.name: Duplicate value: "{name}"')
        else:
            f.label(errs, f"{at}.name", name)
            names.add(name)
        has = [
            k
            for k in ("resourceClaimName", "resourceClaimTemplateName")
            if isinstance(claim, Mapping) and claim.get(k) is not None
        ]
        if len(has) == 2:
            errs.invalid(
                at, None, "at most one of `resourceClaimName` or `resourceClaimTemplateName` may be specified"
            )
        elif not has:
            errs.invalid(at, None, "must specify one of: `resourceClaimName`, `resourceClaimTemplateName`")
        else:
            f.subdomain(errs, f"{at}.{has[0]}", claim[has[0]])
    for group in ("initContainers", "containers"):
        for i, container in enumerate(spec.get(group) or []):
            refs = (
                ((container or {}).get("resources") or {}).get("claims") or []
                if isinstance(container, Mapping)
                else []
            )
            for j, ref in enumerate(refs):
                at = f"spec.{group}[{i}].resources.claims[{j}]"
                name = ref.get("name") if isinstance(ref, Mapping) else None
                if not name:
                    errs.required(at)
                elif name not in names:
                    listed = ", ".join(sorted(names))
                    errs.items.append(
                        f'{at}: Not found: "{name}": must be one of the names in pod.spec.resourceClaims'
                        + (f": {listed}" if listed else " which is empty")
                    )


# ----- entry points -----

_KINDS = {
    "resourceslices": "ResourceSlice.resource.k8s.io",
    "resourceclaims": "ResourceClaim.resource.k8s.io",
    "resourceclaimtemplates": "ResourceClaimTemplate.resource.k8s.io",
    "deviceclasses": "DeviceClass.resource.k8s.io",
    "pods": "Pod",
}


def check(plural: str, obj: JsonObj, *, old: JsonObj | None = None, now: datetime.datetime) -> None:
    """Default and validate ``obj`` of ``plural`` (a create when ``old`` is None) in place; 422
    with every field error when invalid. Kinds this module does not know pass untouched."""
    if plural not in _KINDS:
        return
    errs = f.Errors()
    raw_spec = obj.get("spec")
    spec: JsonObj = raw_spec if isinstance(raw_spec, dict) else {}
    old_spec: JsonObj = (old or {}).get("spec") or {}
    if plural == "resourceslices":
        for device in spec.get("devices") or []:
            for taint in (device or {}).get("taints") or [] if isinstance(device, dict) else []:
                if isinstance(taint, dict):
                    taint.setdefault("timeAdded", now.strftime("%Y-%m-%dT%H:%M:%SZ"))
        draslicecheck.check_spec(errs, spec, old_spec if old is not None else None)
    elif plural == "resourceclaims":
        known = _claim_spec(errs, "spec", spec)
        if old is not None and spec != old_spec:
            errs.invalid("spec", None, "field is immutable")
        _claim_status(errs, obj.get("status"), (old or {}).get("status"), known)
    elif plural == "resourceclaimtemplates":
        _claim_spec(errs, "spec.spec", spec.get("spec") or {})
    elif plural == "deviceclasses":
        for i, sel in enumerate(spec.get("selectors") or []):
            cel = sel.get("cel") if isinstance(sel, Mapping) else None
            if not isinstance(cel, Mapping) or not str(cel.get("expression") or "").strip():
                errs.required(f"spec.selectors[{i}].cel.expression")
    else:
        _pod_claims(errs, spec)
        if old is not None and spec.get("resourceClaims") != old_spec.get("resourceClaims"):
            errs.forbidden("spec.resourceClaims", "field is immutable")
    errs.raise_for(_KINDS[plural], str((obj.get("metadata") or {}).get("name")))
