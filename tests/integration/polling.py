"""``until``: wait for a cheap in-memory condition on the local cluster, bounded in time."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


async def until(predicate: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    """Yield to the stack's processes until ``predicate()`` holds; AssertionError naming ``what``
    after ``timeout_s``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(0.05)
