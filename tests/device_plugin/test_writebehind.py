"""The queue of writes made after Allocate answers, and what the plugin remembers meanwhile."""

import asyncio
import logging

import pytest
from vgpu.core import errors
from vgpu_device_plugin import podoverlay, writebehind


async def test_writes_land_in_order_and_failures_are_retried_with_backoff() -> None:
    pauses: list[float] = []
    done: list[str] = []
    failures = {"a": 3}

    async def pause(seconds: float) -> None:
        pauses.append(seconds)

    def job(name: str) -> writebehind.Write:
        async def write() -> None:
            if failures.get(name, 0):
                failures[name] -= 1
                raise errors.KubeError("etcdserver: request timed out", status=500)
            done.append(name)

        return write

    queue = writebehind.WriteQueue(retry_s=1, max_retry_s=3, sleep=pause)
    await queue.submit("a", job("a"))
    await queue.submit("b", job("b"))
    assert queue.pending == 2
    await asyncio.wait_for(queue.drain(), 5)
    assert done == ["a", "b"] and pauses == [1, 2, 3] and queue.landed == 2 and queue.pending == 0


@pytest.mark.parametrize(
    "failure", [errors.NotFound("pods p not found", status=404), RuntimeError("bug")], ids=["gone", "bug"]
)
async def test_a_write_that_cannot_land_is_given_up_and_the_next_one_still_made(failure: Exception) -> None:
    done: list[str] = []

    async def broken() -> None:
        raise failure

    async def fine() -> None:
        done.append("fine")

    queue = writebehind.WriteQueue()
    await queue.submit("broken", broken)
    await queue.submit("fine", fine)
    await asyncio.wait_for(queue.drain(), 5)
    assert done == ["fine"] and queue.given_up == 1


async def test_close_waits_a_bounded_time_and_names_what_was_not_written(
    caplog: pytest.LogCaptureFixture,
) -> None:
    never = asyncio.Event()

    async def hung() -> None:
        await never.wait()

    queue = writebehind.WriteQueue()
    await queue.submit("pod default/p: writing the allocation", hung)
    await queue.submit("pod default/q: writing the allocation", hung)
    with caplog.at_level(logging.ERROR):
        await queue.close(timeout_s=0.05)
    assert "pod default/q: writing the allocation: not made before the plugin stopped" in caplog.text
    assert queue.pending == 0
    await asyncio.wait_for(queue.drain(), 1)


async def test_inline_writes_at_once_and_logs_a_failure() -> None:
    done: list[str] = []

    async def write() -> None:
        done.append("x")

    async def broken() -> None:
        raise errors.KubeError("nope", status=500)

    await writebehind.Inline().submit("x", write)
    await writebehind.Inline().submit("broken", broken)
    assert done == ["x"]


def pod(uid: str = "u1", rv: str = "5", **notes: str) -> dict[str, object]:
    return {
        "metadata": {"namespace": "ns", "name": "p", "uid": uid, "resourceVersion": rv, "annotations": notes}
    }


def test_overlay_shows_the_unwritten_pod_then_the_answer_until_the_watch_catches_up() -> None:
    overlay = podoverlay.PodOverlay()
    cached = pod(phase="allocating")
    seq = overlay.will_write(
        cached, {"metadata": {"annotations": {"phase": "success"}, "labels": {"n": "x"}}}
    )
    shown = overlay.current(cached)
    assert shown["metadata"]["annotations"] == {"phase": "success"} and shown["metadata"]["labels"] == {
        "n": "x"
    }
    overlay.written(seq, pod(rv="7", phase="success"))
    assert overlay.current(cached)["metadata"]["resourceVersion"] == "7"  # the watch is behind
    caught_up = pod(rv="7", phase="success")
    assert overlay.current(caught_up) is caught_up
    assert overlay.current(cached) is cached  # the answer was forgotten once the watch showed it


def test_overlay_keeps_the_latest_write_and_forgets_gone_or_new_pods() -> None:
    overlay = podoverlay.PodOverlay()
    cached = pod(step="0")
    first = overlay.will_write(cached, {"metadata": {"annotations": {"step": "1"}}})
    overlay.will_write(cached, {"metadata": {"annotations": {"step": "2"}}})
    overlay.written(first, pod(rv="6", step="1"))  # an older write landing does not hide the newer
    assert overlay.current(cached)["metadata"]["annotations"]["step"] == "2"
    assert overlay.current(pod(uid="u2")) == pod(uid="u2")  # a new pod of that name
    overlay.will_write(cached, {"metadata": {"annotations": {"step": "3", "gone": None}}})
    overlay.keep_only([])
    assert overlay.current(cached) is cached


def test_garbage_resource_versions_read_as_zero() -> None:
    assert podoverlay.rv({"metadata": {"resourceVersion": "x"}}) == 0
    assert podoverlay.rv({"metadata": {"resourceVersion": None}}) == 0
    assert podoverlay.rv({}) == 0
