"""``OffloadedKubeApi`` beyond the adapters' shared contract (test_kube_adapters.py): the writes and
watches are made by a child process, a child that dies fails only the writes and watches it had and
is replaced, so is one that stops answering, writes waiting are counted for readiness, close() lets
the writes under way finish and stops the watches, and a broken channel fails its writes instead of
hanging them."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import pickle
import signal
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest
from vgpu.core import errors
from vgpu.kube import aioapi, offload, offloadwire, slim
from vgpu.kube.informer import Change, Informer
from vgpu.localcluster.store import Store

from tests.adapters import offload_factories
from tests.scheduler.gated import GatedApiServer


def pod(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"containers": [{"name": "c", "image": "i"}]}}


def _patches(method: str, path: str, query: str) -> bool:
    return method == "PATCH"


@pytest.fixture
async def gated() -> AsyncIterator[tuple[Store, GatedApiServer]]:
    store = Store()
    server = GatedApiServer(store, hold=_patches)
    await server.start()
    try:
        yield store, server
    finally:
        server.gate.set()
        await server.stop()


def offloaded(server: GatedApiServer, **kwargs: Any) -> offload.OffloadedKubeApi:
    return offload.OffloadedKubeApi(
        aioapi.AioKubeApi(server.url), functools.partial(aioapi.AioKubeApi, server.url), **kwargs
    )


async def _held(server: GatedApiServer, count: int) -> None:
    while server.held < count:  # woken by each held arrival, never by time
        server.another.clear()
        await asyncio.wait_for(server.another.wait(), 20)


async def test_writes_are_made_by_a_child_that_is_replaced_when_it_dies(
    gated: tuple[Store, GatedApiServer],
) -> None:
    store, server = gated
    async with offloaded(server) as api:
        assert api.writer_pid is None and api.starts == 0
        with pytest.raises(errors.NotFound):  # reads are made here: they never need the child
            await api.get("pods", "a", namespace="default")
        assert api.starts == 0
        await api.create("pods", pod("a"), namespace="default")
        first = api.writer_pid
        assert first is not None and first != os.getpid() and api.starts == 1
        # a write held by the API server when its child is killed fails as a broken connection
        # does (status 0: it may or may not have been made); nothing else is lost
        patch = asyncio.ensure_future(
            api.merge_patch("pods", "a", {"metadata": {"labels": {"k": "v"}}}, namespace="default")
        )
        await _held(server, 1)
        os.kill(first, signal.SIGKILL)
        with pytest.raises(errors.KubeError, match="may or may not") as lost:
            await asyncio.wait_for(patch, 20)
        assert lost.value.status == 0
        server.gate.set()
        # the next write starts another child, and it works
        await api.merge_patch("pods", "a", {"metadata": {"labels": {"k": "w"}}}, namespace="default")
        assert api.starts == 2 and api.writer_pid not in (None, first)
        assert store.get("pods", "a", namespace="default")["metadata"]["labels"]["k"] == "w"
        # the child's errors come back as the same errors, status and reason included
        with pytest.raises(errors.Conflict) as exists:
            await api.create("pods", pod("a"), namespace="default")
        assert (exists.value.status, exists.value.reason) == (409, "AlreadyExists")
        with pytest.raises(errors.NotFound):
            await api.merge_patch("pods", "missing", {"metadata": {"labels": {}}}, namespace="default")
    assert api.writer_pid is None


async def test_a_stuck_child_is_stopped_and_replaced(gated: tuple[Store, GatedApiServer]) -> None:
    store, server = gated
    server.gate.set()  # nothing held: the child itself stops answering
    async with offloaded(server, answer_timeout_s=5) as api:
        await api.create("pods", pod("a"), namespace="default")
        stuck = api.writer_pid
        assert stuck is not None
        os.kill(stuck, signal.SIGSTOP)  # alive, its socket open, and never answering
        with pytest.raises(errors.KubeError, match="no answer from the API writer process in 5 s") as lost:
            await api.create("pods", pod("b"), namespace="default")
        assert lost.value.status == 0
        await api.create("pods", pod("c"), namespace="default")  # a new child
        assert api.starts == 2 and api.writer_pid not in (None, stuck)
        with pytest.raises(ProcessLookupError):
            os.kill(stuck, 0)  # the stuck one was killed and collected, not left behind
    assert store.get("pods", "c", namespace="default") is not None


@pytest.mark.timeout(120)  # broken: three fresh interpreters' imports, each seconds on a loaded machine
@pytest.mark.parametrize(
    ("factory", "start_timeout_s", "how"),
    [
        # the default wait, not a short one: the child's exit, however slow its imports, comes first
        (
            offload_factories.broken,
            offload.START_TIMEOUT_S,
            "it exited with code 1 (its error is logged above)",
        ),
        (offload_factories.stuck, 3.0, "it said nothing for 3 s and was stopped"),
    ],
    ids=["broken", "stuck"],
)
async def test_a_child_that_cannot_start_fails_the_start_and_is_not_left_behind(
    factory: Any, start_timeout_s: float, how: str, caplog: pytest.LogCaptureFixture
) -> None:
    """broken: its configuration does not load, it exits. stuck: it never says it is ready, and is
    killed when the start gives up. Either way start() fails with the reason, the child is
    collected, and a later start tries again."""
    api = offload.OffloadedKubeApi(
        aioapi.AioKubeApi("http://127.0.0.1:9"), factory, start_timeout_s=start_timeout_s
    )
    try:
        for attempt in (1, 2):
            with pytest.raises(errors.KubeError, match="did not start") as failed:
                await api.start()
            assert failed.value.status == 0
            assert how in str(failed.value)
            assert "apiWriter: inline" in str(failed.value)  # what to do about it
            assert api.starts == attempt and api.writer_pid is None
        with pytest.raises(errors.KubeError, match="did not start"):  # a write cannot go either
            await api.create("pods", pod("a"), namespace="default")
    finally:
        await api.close()
    assert "API writer process started" not in caplog.text
    # each one collected: by its exit, or killed (-9) once the start gave up on it
    expected = "code 1" if factory is offload_factories.broken else f"code {-signal.SIGKILL}"
    assert caplog.text.count(f"exited with {expected}") == 3


async def test_writes_waiting_for_a_place_are_counted_for_readiness(
    gated: tuple[Store, GatedApiServer],
) -> None:
    store, server = gated
    store.create("pods", pod("a"), namespace="default")
    now = [50.0]
    async with offloaded(server, max_in_flight=1, clock=lambda: now[0]) as api:
        await api.start()
        writes = [
            asyncio.ensure_future(
                api.merge_patch("pods", "a", {"metadata": {"labels": {"n": str(i)}}}, namespace="default")
            )
            for i in range(3)
        ]
        await _held(server, 1)
        now[0] = 54.0
        assert (api.busy, api.queued, api.oldest_wait_s()) == (1, 2, 4.0)
        assert server.held == 1  # the cap is kept here: the child never had the other two
        server.gate.set()
        await asyncio.gather(*writes)
        assert (api.busy, api.queued, api.oldest_wait_s()) == (0, 0, 0.0)


async def test_close_lets_the_writes_under_way_finish(gated: tuple[Store, GatedApiServer]) -> None:
    store, server = gated
    store.create("pods", pod("a"), namespace="default")
    api = offloaded(server)
    await api.start()
    write = asyncio.ensure_future(
        api.merge_patch("pods", "a", {"metadata": {"labels": {"done": "yes"}}}, namespace="default")
    )
    await _held(server, 1)
    closing = asyncio.ensure_future(api.close())
    server.gate.set()
    await asyncio.wait_for(closing, 30)
    await write  # answered before the child went
    assert store.get("pods", "a", namespace="default")["metadata"]["labels"] == {"done": "yes"}
    with pytest.raises(errors.KubeError, match="closed"):
        await api.create("pods", pod("b"), namespace="default")


@pytest.mark.parametrize(
    "garbage",
    [offloadwire.HEADER.pack(offloadwire.MAX_FRAME_BYTES + 1), offloadwire.HEADER.pack(5) + b"\x80\x05xyz"],
    ids=["oversized-frame", "undecodable-frame"],
)
async def test_a_broken_channel_fails_its_writes_instead_of_hanging_them(garbage: bytes) -> None:
    ours, theirs = socket.socketpair()
    loop = asyncio.get_running_loop()
    transport, calls = await loop.create_unix_connection(offloadwire.Calls, sock=ours)
    try:
        pending = calls.call("create", ("pods", pod("a")), {"namespace": "default"})
        sent = theirs.recv(1 << 16)  # the request, framed and pickled
        rid, method, args, _ = pickle.loads(sent[offloadwire.HEADER.size :])
        assert (rid, method, args[0]) == (1, "create", "pods")
        theirs.sendall(garbage)
        with pytest.raises(errors.KubeError, match="may or may not"):
            await asyncio.wait_for(pending, 10)
        assert calls.closed.done()
        with pytest.raises(errors.KubeError, match="gone"):
            calls.call("create", ("pods", pod("b")), {})
    finally:
        transport.close()
        theirs.close()


async def test_the_child_refuses_anything_but_a_write_or_a_watch(gated: tuple[Store, GatedApiServer]) -> None:
    _, server = gated
    async with offloaded(server) as api:
        calls = await api._connected()
        with pytest.raises(errors.KubeError, match="not a write"):
            await asyncio.wait_for(calls.call("get", ("pods", "a"), {"namespace": "default"}), 20)


async def _first_event(stream: AsyncIterator[Any]) -> Any:
    return await asyncio.wait_for(anext(stream), 20)


async def test_a_watch_is_read_by_the_child_and_ends_with_it(gated: tuple[Store, GatedApiServer]) -> None:
    """The child carries the watch: killed, its watch fails as a broken connection does (status 0)
    and the next watch starts another child; a stopped reader's watch is stopped in the child."""
    store, server = gated
    store.create("nodes", {"metadata": {"name": "n1"}})
    async with offloaded(server, watches=True) as api:
        stream = api.watch("nodes", resource_version="0", timeout_s=60)
        assert (await _first_event(stream)).object["metadata"]["name"] == "n1"
        child = api.writer_pid
        assert child is not None and api.starts == 1 and store.watcher_count == 1
        os.kill(child, signal.SIGKILL)
        with pytest.raises(errors.KubeError, match="exited") as lost:
            await _first_event(stream)
        assert lost.value.status == 0
        # the next watch (an informer's retry) starts another child, and resumes
        again = api.watch("nodes", resource_version="0", timeout_s=60)
        assert (await _first_event(again)).type == "ADDED"
        assert api.starts == 2 and api.writer_pid not in (None, child)
        await again.aclose()  # the reader goes away: the child stops that watch at the server
        while store.watcher_count:  # woken by the server's watcher ending, never by time
            await asyncio.wait_for(asyncio.gather(*(w.ended.wait() for w in store.watchers)), 20)
        # the child goes on: a write and another watch still work
        await api.create("pods", pod("a"), namespace="default")
        third = api.watch("pods", resource_version="0", namespace="default", timeout_s=60)
        assert (await _first_event(third)).object["metadata"]["name"] == "a"
        await third.aclose()
        assert api.starts == 2


async def test_a_child_silent_past_the_watch_timeout_is_stopped(gated: tuple[Store, GatedApiServer]) -> None:
    store, server = gated
    async with offloaded(server, stream_silence_s=1, watches=True) as api:
        store.create("nodes", {"metadata": {"name": "n1"}})
        stream = api.watch("nodes", resource_version="0", timeout_s=1)
        await _first_event(stream)
        stuck = api.writer_pid
        assert stuck is not None
        os.kill(stuck, signal.SIGSTOP)  # its socket open, and never sending the watch's end
        with pytest.raises(errors.KubeError, match="nothing from the API writer process in 2 s") as lost:
            async for _ in stream:
                pass
        assert lost.value.status == 0
        await api.create("pods", pod("b"), namespace="default")  # a new child
        assert api.starts == 2 and api.writer_pid not in (None, stuck)
        with pytest.raises(ProcessLookupError):
            os.kill(stuck, 0)  # the stuck one was killed and collected


async def test_close_with_a_watch_open_is_prompt(gated: tuple[Store, GatedApiServer]) -> None:
    """The child stops its watches at once when told to go (they never end by themselves), then
    exits; the reader's stream ends with an error rather than hanging."""
    store, server = gated
    store.create("nodes", {"metadata": {"name": "n1"}})
    api = offloaded(server, watches=True)
    stream = api.watch("nodes", resource_version="0", timeout_s=3600)
    await _first_event(stream)
    loop = asyncio.get_running_loop()
    started = loop.time()
    await api.close()
    assert loop.time() - started < offloadwire.CLOSE_TIMEOUT_S
    assert api.writer_pid is None
    with pytest.raises(errors.KubeError, match="exited"):
        await _first_event(stream)


async def test_an_informer_over_the_child_resumes_when_it_dies_and_misses_nothing(
    gated: tuple[Store, GatedApiServer],
) -> None:
    """The informer's watch runs in the child; killed, the informer watches again from the last
    resourceVersion it saw (a new child), with no relist, and the changes made meanwhile arrive."""
    store, server = gated
    store.create("nodes", {"metadata": {"name": "n1"}})
    seen: list[tuple[str, str]] = []
    arrived = asyncio.Event()

    def record(change: Change) -> None:
        seen.append((change.type, change.object["metadata"]["name"]))
        arrived.set()

    async def until(expected: tuple[str, str]) -> None:
        while expected not in seen:  # woken by each change, never by time
            arrived.clear()
            await asyncio.wait_for(arrived.wait(), 20)

    async with offloaded(server, watches=True) as api:
        inf = Informer(
            api, "nodes", on_event=record, backoff_initial_s=0.01, transform=slim.node_for_scheduling
        )
        task = asyncio.create_task(inf.run())
        try:
            await asyncio.wait_for(inf.synced.wait(), 20)
            store.create("nodes", {"metadata": {"name": "n2"}})
            await until(("ADDED", "n2"))
            first = api.writer_pid
            assert first is not None
            os.kill(first, signal.SIGKILL)
            store.create("nodes", {"metadata": {"name": "n3"}})  # while no child runs
            store.delete("nodes", "n1")
            await until(("DELETED", "n1"))
            assert ("ADDED", "n3") in seen and api.writer_pid not in (None, first)
            assert inf.relists == 1  # resumed from its resourceVersion, not listed again
            assert sorted(o["metadata"]["name"] for o in inf.items()) == ["n2", "n3"]
            # the transform ran in the child: what the scheduler caches of a node, no more
            assert inf.get(None, "n3") == slim.node_for_scheduling(store.get("nodes", "n3"))
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def test_without_watches_the_child_carries_none(gated: tuple[Store, GatedApiServer]) -> None:
    """Without ``watches`` (scheduler.apiWatches: inline) they are read here; no child is started
    for them."""
    store, server = gated
    store.create("nodes", {"metadata": {"name": "n1"}})
    async with offloaded(server) as api:
        assert not api.watches_in_child
        stream = api.watch("nodes", resource_version="0", timeout_s=60, transform=offload_factories.tag_pid)
        event = await _first_event(stream)
        await stream.aclose()
        assert event.object["metadata"]["annotations"]["pid"] == str(os.getpid())
        assert api.starts == 0 and api.writer_pid is None


class Collected(offloadwire.Frames):
    """Records what each frame carried and what else the loop ran between them."""

    def __init__(self) -> None:
        super().__init__()
        self.got: list[object] = []
        self.between: list[int] = []  # how many frames had been handed over when the other ran
        self.want = 50
        self.enough = asyncio.Event()  # ``want`` frames handed over, and the other has run

    def received(self, message: object) -> None:
        self.got.append(message)
        if len(self.got) == 1:  # something else becomes ready as the burst starts
            self._loop.call_soon(self._other)
        self._check()

    def _other(self) -> None:
        self.between.append(len(self.got))
        self._check()

    def _check(self) -> None:
        if len(self.got) >= self.want and self.between:
            self.enough.set()


@pytest.mark.parametrize(("slice_s", "handed_first"), [(0.0, 1), (3600.0, 50)])
async def test_a_read_of_many_frames_is_handed_over_in_slices_with_reading_paused_between(
    monkeypatch: pytest.MonkeyPatch, slice_s: float, handed_first: int
) -> None:
    """A burst of frames in one read (the helper's watch events, its answers) gives the loop a turn
    every ``SLICE_S``, so a /filter waits for at most a slice; one slice for the lot is the
    behaviour without it (the second case). Nothing is lost or reordered, and reading resumes."""
    monkeypatch.setattr(offloadwire, "SLICE_S", slice_s)
    ours, theirs = socket.socketpair()
    loop = asyncio.get_running_loop()
    transport, frames = await loop.create_unix_connection(Collected, sock=ours)
    try:
        paused: list[bool] = []
        real_pause = transport.pause_reading
        monkeypatch.setattr(transport, "pause_reading", lambda: (paused.append(True), real_pause())[1])
        theirs.sendall(b"".join(offloadwire.frame(("event", i)) for i in range(50)))
        await asyncio.wait_for(frames.enough.wait(), 5)
        assert frames.between == [handed_first]
        assert frames.got == [("event", i) for i in range(50)]
        assert bool(paused) is (slice_s == 0.0)
        assert transport.is_reading()  # resumed once the buffer was done
        frames.want, frames.enough = 51, asyncio.Event()
        theirs.sendall(offloadwire.frame(("event", 50)))  # and it still reads
        await asyncio.wait_for(frames.enough.wait(), 5)
    finally:
        transport.close()
        theirs.close()


class PausableTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.reading = True

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def is_closing(self) -> bool:
        return False


async def test_frames_still_buffered_when_the_connection_goes_are_handed_over_before_it_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Answers that came before the close are answers: a write they answer is not failed as lost."""
    monkeypatch.setattr(offloadwire, "SLICE_S", 0.0)
    frames = Collected()
    transport = PausableTransport()
    frames.connection_made(transport)
    frames.data_received(b"".join(offloadwire.frame(("event", i)) for i in range(5)))
    assert frames.got == [("event", 0)] and not transport.reading  # one slice, the rest to come
    frames.connection_lost(None)
    assert frames.got == [("event", i) for i in range(5)]
    assert frames.closed.done()


async def test_a_frame_that_fails_to_be_handed_over_in_a_later_slice_closes_the_channel(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """As asyncio closes a transport whose data_received raised: the rest is not left paused."""
    monkeypatch.setattr(offloadwire, "SLICE_S", 0.0)

    class Failing(Collected):
        def received(self, message: object) -> None:
            if len(self.got) == 2:
                raise RuntimeError("a bug")
            super().received(message)

    ours, theirs = socket.socketpair()
    loop = asyncio.get_running_loop()
    transport, frames = await loop.create_unix_connection(Failing, sock=ours)
    try:
        theirs.sendall(b"".join(offloadwire.frame(("event", i)) for i in range(5)))
        await asyncio.wait_for(frames.closed, 5)
        assert frames.got == [("event", 0), ("event", 1)]
        assert "handing over a frame failed" in caplog.text
    finally:
        transport.close()
        theirs.close()
