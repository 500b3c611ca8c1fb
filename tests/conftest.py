"""Suite-wide hygiene: no asyncio task may outlive the test that started it; hypothesis judges
behaviour, not speed (its timing health checks and deadlines flake on a loaded 2-core machine)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("suite", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("suite")


@pytest.fixture(autouse=True)
async def _no_leaked_tasks() -> AsyncIterator[None]:
    before = set(asyncio.all_tasks())
    yield

    def pending() -> list[asyncio.Task[object]]:
        return [t for t in asyncio.all_tasks() - before if not t.done() and t is not asyncio.current_task()]

    # Tasks that are already finishing (cancelled ones unwinding, grpc.aio's status handler whose
    # future has just resolved) need a few loop turns; a leaked task never finishes. Bounded turns,
    # no timed sleep.
    for _ in range(50):
        if not pending():
            break
        await asyncio.sleep(0)
    if pending():
        # grpc.aio's status handler waits on a future that grpc's own poller thread resolves: on a
        # loaded machine (the suite runs in parallel processes) that can take longer than 50 turns.
        # Wait on the tasks themselves, bounded; a leaked one is still pending after it.
        await asyncio.wait(pending(), timeout=5)
    leaked = pending()
    assert not leaked, f"tasks leaked by the test: {leaked}"
