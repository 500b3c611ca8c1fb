"""``vgpu.waits.wait_at_most``: a bounded wait that says whether it finished and never loses a
cancellation, even one made in the same step of the loop as the thing waited for happens (where
Python 3.11's ``asyncio.wait_for`` returns as if nothing had been cancelled)."""

from __future__ import annotations

import asyncio

import pytest
from vgpu.waits import wait_at_most


async def test_true_when_it_finishes_false_when_the_time_runs_out() -> None:
    done = asyncio.Event()
    done.set()
    assert await wait_at_most(done.wait(), 10) is True
    assert await wait_at_most(asyncio.Event().wait(), 0.01) is False  # never set: the limit ends it
    assert await wait_at_most(done.wait(), None) is True


async def test_a_cancel_in_the_same_step_as_the_event_is_not_lost() -> None:
    event, waiting = asyncio.Event(), asyncio.Event()

    async def wait_for_event() -> None:
        waiting.set()
        await event.wait()

    async def loop_that_waits() -> str:
        await wait_at_most(wait_for_event(), 10)
        return "went on after a cancel"

    task = asyncio.create_task(loop_that_waits())
    await waiting.wait()  # the task is suspended inside the wait
    event.set()
    task.cancel()  # the same step: a stop, or kube-scheduler giving up on a bind
    with pytest.raises(asyncio.CancelledError):
        await task
