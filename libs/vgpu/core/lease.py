"""The device plugin's node Lease as the wire has it: its name and its Kubernetes MicroTime.

Each node's device plugin renews ``coordination.k8s.io/v1`` Lease ``vgpu-device-plugin-<node>``
(``name``); the scheduler and ``vgpu status`` read which node a Lease speaks for (``node_of``) and
how old its ``renewTime`` is (``parse_micro_time``). A MicroTime is RFC 3339 in UTC with exactly six
fractional digits (``2026-11-23T07:38:08.123456Z``, ``format_micro_time``).
"""

from __future__ import annotations

import datetime

PREFIX = "vgpu-device-plugin-"


def name(node: str) -> str:
    return f"{PREFIX}{node}"


def node_of(lease_name: str) -> str | None:
    """The node a Lease named by ``name`` speaks for; None for any other Lease."""
    return lease_name[len(PREFIX) :] if lease_name.startswith(PREFIX) else None


def format_micro_time(when: datetime.datetime) -> str:
    return when.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_micro_time(raw: str) -> datetime.datetime:
    """A Kubernetes (Micro)Time as an aware datetime; ValueError when unreadable or without a zone
    (the API server never writes one without)."""
    when = datetime.datetime.fromisoformat(raw.strip().replace("Z", "+00:00"))
    if when.tzinfo is None:
        raise ValueError(f"time {raw!r} has no zone")
    return when
