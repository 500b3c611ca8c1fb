"""``wait_at_most``: wait for something with a time limit, without ever losing a cancellation.

The pattern ``with suppress(TimeoutError): await asyncio.wait_for(event.wait(), t)`` waits at most
``t`` for an event. On Python 3.11 (the services' runtime) ``wait_for`` returns normally when the
waiting task is cancelled in the same step of the loop as the event is set (gh-86296, fixed in
3.12): the cancellation is lost, and a loop that waits this way runs on after a stop, or a bind
that kube-scheduler gave up on goes ahead as if nobody had cancelled it. ``asyncio.timeout``
keeps the cancellation; this wraps it for the waits that are allowed to time out.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable


async def wait_at_most(awaitable: Awaitable[object], timeout_s: float | None) -> bool:
    """Await ``awaitable`` for at most ``timeout_s`` (None: no limit); True when it finished, False
    when the time ran out (it is then cancelled). A cancellation of the caller always propagates."""
    try:
        async with asyncio.timeout(timeout_s):
            await awaitable
    except TimeoutError:
        return False
    return True
