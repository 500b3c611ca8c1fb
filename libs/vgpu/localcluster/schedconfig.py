"""The kube-scheduler emulation's reading of a KubeSchedulerConfiguration: profiles and percentage.

The extenders' part of the configuration is read by ``extender.parse_config``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vgpu.core import errors


def profile_names(config: Mapping[str, Any] | None) -> list[str]:
    """The ``schedulerName`` of every profile of a KubeSchedulerConfiguration."""
    profiles = (config or {}).get("profiles") or []
    if not isinstance(profiles, list):
        raise errors.ConfigError("profiles", f"expected a list, got {profiles!r}")
    names = []
    for i, profile in enumerate(profiles):
        name = profile.get("schedulerName") if isinstance(profile, Mapping) else None
        if not isinstance(name, str) or not name:
            raise errors.ConfigError(f"profiles[{i}].schedulerName", f"expected a name, got {profile!r}")
        names.append(name)
    return names


def percentage_of_nodes_to_score(config: Mapping[str, Any] | None) -> int:
    """``percentageOfNodesToScore``: 0 (kube-scheduler's adaptive default) when unset."""
    raw = (config or {}).get("percentageOfNodesToScore")
    if raw is None:
        return 0
    if not isinstance(raw, int) or isinstance(raw, bool) or not 0 <= raw <= 100:
        raise errors.ConfigError("percentageOfNodesToScore", f"must be an integer 0..100, got {raw!r}")
    return raw
