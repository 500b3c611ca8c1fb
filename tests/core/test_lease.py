"""The device plugin Lease's wire forms: its name and Kubernetes MicroTime."""

from __future__ import annotations

import datetime

import pytest
from vgpu.core import lease


def test_name_and_node_of_are_inverse_and_other_leases_are_no_node() -> None:
    assert lease.name("gpu-a") == "vgpu-device-plugin-gpu-a"
    assert lease.node_of(lease.name("gpu-a")) == "gpu-a"
    for other in ("kube-scheduler", "gpu-a", "", "vgpu-device-plugin"):
        assert lease.node_of(other) is None


def test_micro_time_format_is_utc_with_six_fractional_digits() -> None:
    when = datetime.datetime(2026, 11, 23, 2, 2, 3, 5, tzinfo=datetime.timezone(datetime.timedelta(hours=1)))
    assert lease.format_micro_time(when) == "2026-11-23T01:02:03.000005Z"


def test_parse_micro_time_reads_what_format_writes_and_refuses_garbage() -> None:
    assert lease.parse_micro_time("2026-11-23T01:02:03.250000Z") == datetime.datetime(
        2026, 11, 23, 1, 2, 3, 250000, tzinfo=datetime.UTC
    )
    when = datetime.datetime(2026, 11, 23, 7, 38, 8, 123456, tzinfo=datetime.UTC)
    assert lease.parse_micro_time(lease.format_micro_time(when)) == when
    for bad in ("yesterday", "2026-11-23T01:02:03", "", "2026-13-01T00:00:00Z"):
        with pytest.raises(ValueError):
            lease.parse_micro_time(bad)
