"""``pacing.Pacer``: a turn of the loop once a slice is used up, and the work measured without the turns."""

from __future__ import annotations

import asyncio

from vgpu_scheduler import pacing


class Manual:
    """A clock the test sets."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_a_turn_comes_once_the_slice_is_used_up_and_others_run_in_it() -> None:
    wall, cpu = Manual(), Manual()
    pacer = pacing.Pacer(slice_s=1.0, clock=wall, work_clock=cpu)
    ran: list[str] = []
    asyncio.get_running_loop().call_soon(ran.append, "other")
    await pacer.pace()  # the slice is not used up: no turn, the other callback has not run
    assert pacer.turns == 0 and ran == []
    wall.now = cpu.now = 1.0
    await pacer.pace()
    assert pacer.turns == 1 and ran == ["other"]
    await pacer.pace()  # a new slice began at the turn
    assert pacer.turns == 1


async def test_the_work_done_leaves_out_what_others_did_during_a_turn() -> None:
    wall, cpu = Manual(), Manual()
    pacer = pacing.Pacer(slice_s=1.0, clock=wall, work_clock=cpu)
    cpu.now = 2.0
    assert pacer.worked_s() == 2.0
    wall.now = 1.0

    def others_work() -> None:  # runs during the turn
        cpu.now += 5.0

    asyncio.get_running_loop().call_soon(others_work)
    await pacer.pace()
    assert pacer.turns == 1 and pacer.worked_s() == 2.0
    cpu.now += 1.0
    assert pacer.worked_s() == 3.0
