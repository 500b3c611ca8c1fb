"""LimitLog: one line per limit hit, at most LOG_BURST a second per limit, the rest counted."""

from __future__ import annotations

import logging

import pytest
from vgpu_scheduler import listener


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_burst_is_cut_at_log_burst_and_the_rest_reported_with_the_next_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    limit_log = listener.LimitLog("service", clock=clock)
    with caplog.at_level(logging.WARNING, logger=listener.__name__):
        for i in range(listener.LOG_BURST + 3):
            limit_log.hit("connections", f"refused {i}")
        limit_log.hit("body", "a different limit has its own budget")
        clock.now += 1.0
        limit_log.hit("connections", "refused later")
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        *(f"service listener: refused {i}" for i in range(listener.LOG_BURST)),
        "service listener: a different limit has its own budget",
        "service listener: refused later (3 more like it not logged)",
    ]
    assert limit_log.hits == {"connections": listener.LOG_BURST + 4, "body": 1}
    assert all(r.exc_info is None for r in caplog.records)  # a line, never a traceback
