"""What a ResourceClaim's request asked of a GPU, as opposed to what kube-scheduler consumed.

Our slices make every share consume at least 1 % of a GPU's ``cores`` (``slices``: so a claim
asking ``100`` needs an idle GPU, as in HAMi), and kube-scheduler writes that 1 % into the result's
``consumedCapacity`` when the claim asked no cores (or ``0``). HAMi's meaning of no ``gpucores`` is
"no SM limit", so Prepare, the views and the quota go by what the request *asked*:
``spec.devices.requests[].exactly.capacity.requests.cores``, or for a result naming
``<request>/<subrequest>`` the chosen ``firstAvailable`` entry's. Nothing asked is 0 (no limit). A
fraction is rounded up, as kube-scheduler rounds it (``Quantity.Value()``).
"""

from __future__ import annotations

import decimal
from collections.abc import Mapping
from typing import Any

from vgpu.core import quantity
from vgpu.core.dra import names
from vgpu.core.errors import VgpuError


class AskError(VgpuError):
    """The claim's spec does not name the result's request, or its amount cannot be read."""


def request_spec(claim: Mapping[str, Any], *, request: str) -> Mapping[str, Any]:
    """The part of ``claim``'s spec that result ``request`` (``<request>`` or
    ``<request>/<subrequest>``) was allocated for: the ``exactly`` body or the subrequest."""
    spec = claim.get("spec")
    devices = spec.get("devices") if isinstance(spec, Mapping) else None
    listed = devices.get("requests") if isinstance(devices, Mapping) else None
    main, _, sub = request.partition("/")
    for item in listed if isinstance(listed, list) else ():
        if not isinstance(item, Mapping) or item.get("name") != main:
            continue
        if not sub:
            exactly = item.get("exactly")
            if isinstance(exactly, Mapping):
                return exactly
            break
        options = item.get("firstAvailable")
        for option in options if isinstance(options, list) else ():
            if isinstance(option, Mapping) and option.get("name") == sub:
                return option
        break
    raise AskError(f"the claim's spec has no request {request!r}")


def cores(claim: Mapping[str, Any], *, request: str) -> int:
    """The cores (percent) result ``request`` of ``claim`` asked; 0 when it asked none. AskError
    when the spec has no such request or the amount is not a quantity from 0 to 100."""
    part = request_spec(claim, request=request)
    capacity = part.get("capacity")
    requests = capacity.get("requests") if isinstance(capacity, Mapping) else None
    raw = requests.get(names.CAPACITY_CORES) if isinstance(requests, Mapping) else None
    if raw is None:
        return 0
    field = f"request {request} capacity.requests.{names.CAPACITY_CORES}"
    try:
        amount = quantity.parse(raw, field=field)
    except VgpuError as exc:
        raise AskError(str(exc)) from None
    if not 0 <= amount <= 100:
        raise AskError(f"{field}: {raw!r} is not 0-100")
    return int(amount.to_integral_value(rounding=decimal.ROUND_CEILING))
