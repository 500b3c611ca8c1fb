"""kube-apiserver 1.36's validation of a ResourceSlice's spec (``validateResourceSliceSpec``), for
``dravalidation``: see its docstring for the rules."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from vgpu.localcluster import drafields as f

_EFFECTS = ("NoSchedule", "NoExecute", "None")


def _policy(errs: f.Errors, path: str, value: Any, policy: Mapping[str, Any]) -> None:
    default = (
        f.parsed(errs, f"{path}.default", policy["default"]) if policy.get("default") is not None else None
    )
    rng, values = policy.get("validRange"), policy.get("validValues") or []
    if rng and values:
        errs.forbidden(
            path,
            'exactly one policy can be specified, cannot specify "validValues" and "validRange" at the same time',
        )
        return
    if (rng or values) and policy.get("default") is None:
        errs.required(f"{path}.default", f"required when {'validRange' if rng else 'validValues'} is defined")
        return
    if values:
        parsed = [f.parsed(errs, f"{path}.validValues[{i}]", v) for i, v in enumerate(values)]
        if any(p is None for p in parsed):
            return
        for i in range(len(parsed) - 1):
            if parsed[i] > parsed[i + 1]:
                errs.invalid(
                    f"{path}.validValues[{i + 1}]",
                    str(values[i + 1]),
                    "values must be sorted in ascending order",
                )
        if default not in parsed:
            errs.invalid(
                f"{path}.validValues",
                str(policy["default"]),
                "default value is not valid according to the requestPolicy",
            )
    elif isinstance(rng, Mapping) and default is not None and value is not None:
        at = f"{path}.validRange"
        if rng.get("min") is None:
            errs.required(f"{at}.min", "required when validRange is defined")
            return
        low = f.parsed(errs, f"{at}.min", rng["min"])
        high = f.parsed(errs, f"{at}.max", rng["max"]) if rng.get("max") is not None else None
        step = f.parsed(errs, f"{at}.step", rng["step"]) if rng.get("step") is not None else None
        if low is None:
            return
        if low > value:
            errs.invalid(f"{at}.min", str(rng["min"]), f"min is larger than capacity value: {value}")
        if default < low:
            errs.invalid(f"{at}.min", str(policy["default"]), f"default is less than min: {rng['min']}")
        if high is not None:
            if low > high:
                errs.invalid(f"{at}.max", str(rng["min"]), f"min is larger than max: {rng['max']}")
            if high > value:
                errs.invalid(f"{at}.max", str(rng["max"]), f"max is larger than capacity value: {value}")
            if default > high:
                errs.invalid(f"{at}.max", str(policy["default"]), f"default is more than max: {rng['max']}")
        if step is not None:
            if step <= 0 or low + step > value:
                errs.invalid(f"{at}.step", str(rng["step"]), "one step is larger than capacity value")
                return
            for v in (default, high):
                if v is not None and (v - low) % step != 0:
                    errs.invalid(
                        f"{at}.step",
                        str(v),
                        f"value is not a multiple of a given step ({rng['step']}) from ({rng['min']})",
                    )


def _device(errs: f.Errors, path: str, device: Any) -> None:
    if not isinstance(device, Mapping):
        errs.invalid(path, None, "must be an object")
        return
    f.label(errs, f"{path}.name", device.get("name"))
    attributes, capacity = device.get("attributes") or {}, device.get("capacity") or {}
    if len(attributes) + len(capacity) > 32:
        errs.invalid(
            path,
            len(attributes) + len(capacity),
            "the total number of attributes and capacities must not exceed 32",
        )
    for key, attr in attributes.items():
        f.qualified(errs, f"{path}.attributes[{key}]", key)
        set_fields = [
            k
            for k in ("int", "bool", "string", "version", "ints", "bools", "strings", "versions")
            if isinstance(attr, Mapping) and attr.get(k) is not None
        ]
        if len(set_fields) != 1:
            errs.invalid(f"{path}.attributes[{key}]", None, "exactly one value must be specified")
        elif set_fields[0] == "string" and len(str(attr["string"])) > 64:
            errs.invalid(f"{path}.attributes[{key}].string", attr["string"], "may not be more than 64 bytes")
    multi = device.get("allowMultipleAllocations") is True
    for key, cap in capacity.items():
        at = f"{path}.capacity[{key}]"
        f.qualified(errs, at, key)
        if not isinstance(cap, Mapping) or cap.get("value") is None:
            errs.required(f"{at}.value")
            continue
        value = f.parsed(errs, f"{at}.value", cap["value"])
        policy = cap.get("requestPolicy")
        if policy is not None and not multi:
            errs.forbidden(f"{at}.requestPolicy", "allowMultipleAllocations must be true")
        elif isinstance(policy, Mapping):
            _policy(errs, f"{at}.requestPolicy", value, policy)
    taints = device.get("taints") or []
    if len(taints) > 16:
        errs.invalid(f"{path}.taints", len(taints), "must have at most 16 items")
    for i, taint in enumerate(taints):
        at = f"{path}.taints[{i}]"
        if not isinstance(taint, Mapping) or not taint.get("key"):
            errs.required(f"{at}.key")
            continue
        if taint.get("effect") not in _EFFECTS:
            errs.items.append(
                f'{at}.effect: Unsupported value: {json.dumps(taint.get("effect"))}: supported values: "NoExecute", "NoSchedule", "None"'
            )


def check_spec(errs: f.Errors, spec: Mapping[str, Any], old: Mapping[str, Any] | None) -> None:
    f.driver(errs, "spec.driver", spec.get("driver"))
    raw_pool = spec.get("pool")
    pool: Mapping[str, Any] = raw_pool if isinstance(raw_pool, Mapping) else {}
    name = pool.get("name")
    if not isinstance(name, str) or not name:
        errs.required("spec.pool.name")
    else:
        for part in name.split("/"):
            f.subdomain(errs, "spec.pool.name", part)
    if not isinstance(pool.get("resourceSliceCount"), int) or pool["resourceSliceCount"] <= 0:
        errs.invalid(
            "spec.pool.resourceSliceCount", pool.get("resourceSliceCount", 0), "must be greater than zero"
        )
    if not isinstance(pool.get("generation", 0), int) or pool.get("generation", 0) < 0:
        errs.invalid("spec.pool.generation", pool.get("generation"), "must be greater than or equal to zero")
    set_fields = [
        f"`{k}`"
        for k in ("nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection")
        if spec.get(k) not in (None, False, "")
    ]
    if spec.get("nodeName") == "":
        errs.invalid("spec.nodeName", "", "must be either unset or set to a non-empty string")
    elif isinstance(spec.get("nodeName"), str):
        f.subdomain(errs, "spec.nodeName", spec["nodeName"])
    if not set_fields:
        errs.required(
            "spec",
            "exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` is required",
        )
    elif len(set_fields) > 1:
        errs.invalid(
            "spec",
            "{" + ", ".join(set_fields) + "}",
            "exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` is required, but multiple fields are set",
        )
    devices = spec.get("devices") or []
    limit = 64 if any((d or {}).get("taints") for d in devices if isinstance(d, Mapping)) else 128
    if len(devices) > limit:
        errs.items.append(f"spec.devices: Too many: {len(devices)}: must have at most {limit} items")
    seen: set[str] = set()
    for i, device in enumerate(devices):
        _device(errs, f"spec.devices[{i}]", device)
        dev_name = device.get("name") if isinstance(device, Mapping) else None
        if isinstance(dev_name, str) and dev_name in seen:
            errs.items.append(f'spec.devices[{i}]: Duplicate value: "{dev_name}"')
        seen.add(str(dev_name))
    if old is not None:
        for field, new_v, old_v in (
            ("spec.pool.name", name, (old.get("pool") or {}).get("name")),
            ("spec.driver", spec.get("driver"), old.get("driver")),
            ("spec.nodeName", spec.get("nodeName"), old.get("nodeName")),
        ):
            if new_v != old_v:
                errs.invalid(field, new_v, "field is immutable")
