"""A ``/filter`` that comes while ``/preempt`` works is answered at once (issue 49), through real HTTP.

kube-scheduler's serial cycle waits for every ``/filter``; a ``/preempt`` judging hundreds of nodes
on the same loop must give the loop to it between slices of its work, and the request that came
during a slice must go before the next slice, not after it.

The test owns the ``/preempt``'s clocks. The one that cuts its work into slices (and measures it)
reads 0 (no slice is ever used up) until the ``/preempt`` has judged ``SEND_AFTER`` nodes; at the
next read, from inside the ``/preempt``'s work, the test sends a ``/filter`` on a connection of
its own, waits until the bytes are at the server's socket, and from then on the clock reads one
slice more: the slice under way is used up, and no later one ever is. The ``/filter`` must be answered before the ``/preempt`` judges another node, and the
``/preempt`` must still answer every node correctly. No timing is measured: only the order.
"""

from __future__ import annotations

import asyncio
import contextlib
import select
import socket
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from vgpu.core.config import Config
from vgpu_scheduler import bodies, listener
from vgpu_scheduler.events import EventRecorder
from vgpu_scheduler.extender_http import ExtenderServer
from vgpu_scheduler.extender_wire import Reply, Verb
from vgpu_scheduler.preempt import Preempter
from vgpu_scheduler.state import ClusterState

from bench import fleet, preempt_clients
from tests.scheduler.test_extender_http import read_response, request

NOW = 1_000_000.0
NODES = 40
SEND_AFTER = 5  # nodes judged before the /filter is sent
SLICE_S = 0.001


class Clocks:
    """The ``/preempt``'s clock (read once per node it judges: counted) and its work clock."""

    def __init__(self, send: Callable[[], None]) -> None:
        self._send = send
        self.judged = 0  # nodes the /preempt has begun to judge
        self.sent_after: int | None = None  # nodes judged when the /filter was sent
        self._work_s = 0.0

    def clock(self) -> float:
        self.judged += 1
        return NOW

    def work(self) -> float:
        if self.sent_after is None and self.judged >= SEND_AFTER:
            self.sent_after = self.judged
            self._send()
            self._work_s = SLICE_S  # the slice under way is used up from now on
        return self._work_s


def _server_end(server: ExtenderServer, client: socket.socket) -> Any:
    """The server's end of ``client``'s connection (its transport's socket)."""
    for conn in server.connections:
        transport = conn._transport
        sock = None if transport is None else transport.get_extra_info("socket")
        if sock is not None and sock.getpeername() == client.getsockname():
            return sock
    raise AssertionError("the server has not accepted the connection")


@dataclass
class Served:
    """A ``Preempter`` with the test's clocks behind ``/preempt``, and a ``/filter`` that notes
    how far the ``/preempt`` had got when it ran."""

    server: ExtenderServer
    clocks: Clocks
    seen: dict[str, object] = field(default_factory=dict)
    done: bool = False


@contextlib.asynccontextmanager
async def serving(send: Callable[[], None]) -> AsyncIterator[tuple[Served, str, int]]:
    state = ClusterState(Config(), clock=lambda: NOW)
    fleet.feed(state, NODES, NOW)  # every GPU holds a priority-0 pod: one victim a node
    state.apply("pods", "ADDED", preempt_clients.preemptor(1))  # as the pod watch has it
    clocks = Clocks(send)
    preempter = Preempter(
        config=Config(),
        state=state,
        events=EventRecorder(None, component="test"),  # type: ignore[arg-type]
        clock=clocks.clock,
        work_clock=clocks.work,
        pace_clock=clocks.work,
        slice_s=SLICE_S,
        budget_s=3600.0,
    )

    def filter_verb(body: bytes) -> Reply:
        served.seen.update(judged=clocks.judged, preempt_done=served.done)
        return Reply(200, {"Error": ""})

    async def preempt_verb(body: bytes) -> Reply:  # routes.preempt_verb's core
        reply = await preempter.preempt(bodies.loads(body))
        served.done = True
        return Reply(200, reply.body)

    server = ExtenderServer(
        {"/filter": Verb(filter_verb, inline=True), "/preempt": Verb(preempt_verb, inline=False)},
        limits=listener.Limits(max_body_bytes=1 << 20),
        limit_log=listener.LimitLog("extender", clock=lambda: 0.0),
    )
    served = Served(server, clocks)
    host, port = (await server.start("127.0.0.1", 0)).rsplit(":", 1)
    try:
        yield served, host, int(port)
    finally:
        await server.stop(timeout_s=1.0)


async def test_a_filter_sent_while_preempt_judges_is_answered_before_it_judges_another_node() -> None:
    probe = socket.socket()
    server: ExtenderServer | None = None

    def send() -> None:  # inside the /preempt's work: a blocking write, then wait for its arrival
        assert server is not None
        probe.sendall(request("/filter", b"{}"))
        readable, _, _ = select.select([_server_end(server, probe)], [], [], 10.0)
        assert readable, "the /filter's bytes did not reach the server"

    async with serving(send) as (served, host, port):
        server = served.server
        with probe:
            loop = asyncio.get_running_loop()
            probe.setblocking(False)
            await loop.sock_connect(probe, (host, port))
            await loop.sock_sendall(probe, request("/filter", b"{}"))  # the server has it accepted
            assert (await loop.sock_recv(probe, 1 << 16)).startswith(b"HTTP/1.1 200 OK\r\n")
            served.seen.clear()
            probe.setblocking(True)
            reader, writer = await asyncio.open_connection(host, port)
            names = [fleet.node_name(n) for n in range(NODES)]
            writer.write(request("/preempt", preempt_clients.preempt_body(1, names, worst=False)))
            answer = bodies.loads((await read_response(reader)).body)["NodeNameToMetaVictims"]
            writer.close()
            assert served.clocks.sent_after == SEND_AFTER
            # answered at the /preempt's next turn: it judged no further node before
            assert served.seen == {"judged": SEND_AFTER, "preempt_done": False}, served.seen
            probe.settimeout(10.0)
            assert probe.recv(1 << 16).startswith(b"HTTP/1.1 200 OK\r\n")
    # the turn changed nothing in the answer: every node, with its one victim
    assert sorted(answer) == names
    assert all(len(v["Pods"]) == 1 for v in answer.values()), answer
