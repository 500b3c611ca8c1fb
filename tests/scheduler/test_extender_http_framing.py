"""The extender listener's framing at the edges (extender_http.py), through real sockets.

What a refusal does to the requests before it and to a caller still sending, ``HEAD``,
``Expect: 100-continue``. The stub verbs, the request builder and the response reader are those of
``test_extender_http``; the limit log here also says when a limit was hit, so that a test can wait
for the server's decision instead of for a fixed time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from vgpu_scheduler import extender_conn, extender_wire, listener
from vgpu_scheduler.extender_http import ExtenderServer
from vgpu_scheduler.extender_wire import Verb

from tests.scheduler.test_extender_http import (
    CAP,
    SHORT_S,
    Verbs,
    closed_by_server,
    read_response,
    request,
)

MAX_CONNECTIONS = 3
GARBAGE = b"NOT HTTP AT ALL\r\n\r\n"


class WatchedLog(listener.LimitLog):
    """The listener's limit log, with an event set at each hit."""

    def __init__(self) -> None:
        super().__init__("extender", clock=lambda: 0.0)
        self.hit_once = asyncio.Event()

    def hit(self, limit: str, message: str) -> None:
        super().hit(limit, message)
        self.hit_once.set()


@dataclass
class Served:
    server: ExtenderServer
    host: str
    port: int
    verbs: Verbs
    log: WatchedLog

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection(self.host, self.port)


@contextlib.asynccontextmanager
async def serving(*, timeout_s: float, linger_s: float) -> AsyncIterator[Served]:
    verbs = Verbs()
    limit_log = WatchedLog()
    limits = listener.Limits(
        max_connections=MAX_CONNECTIONS,
        idle_timeout_s=timeout_s,
        body_timeout_s=timeout_s,
        max_body_bytes=1 << 20,
    )
    server = ExtenderServer(
        {
            "/filter": Verb(verbs.inline, inline=True),
            "/bind": Verb(verbs.slow, inline=False),
            "/small": Verb(verbs.inline, inline=True, max_body_bytes=CAP),
        },
        limits=limits,
        limit_log=limit_log,
        linger_s=linger_s,
    )
    address = await server.start("127.0.0.1", 0)
    host, port = address.rsplit(":", 1)
    try:
        yield Served(server, host, int(port), verbs, limit_log)
    finally:
        verbs.release.set()
        await server.stop(timeout_s=1.0)


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    """Timeouts and a linger no test reaches."""
    async with serving(timeout_s=60.0, linger_s=60.0) as got:
        yield got


@pytest.fixture
async def served_short() -> AsyncIterator[Served]:
    """Body timeouts and a linger of ``SHORT_S``, for the tests that wait for them."""
    async with serving(timeout_s=SHORT_S, linger_s=SHORT_S) as got:
        yield got


async def read_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    """A response's status and headers, without reading a body (a HEAD's answer has none)."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines if line)}
    return int(status_line.split()[1]), headers


def error(body: bytes) -> str:
    return str(json.loads(body)["Error"])


# --- HEAD and other methods ------------------------------------------------------------------


async def test_head_is_answered_without_a_body_and_the_next_answer_stays_in_step(served: Served) -> None:
    reader, writer = await served.connect()
    writer.write(
        request("/filter", b"", method="HEAD")
        + request("/nope", b"", method="HEAD")
        + request("/filter", b"after")
    )
    status, headers = await read_head(reader)
    assert (status, headers["allow"]) == (405, "POST")
    assert int(headers["content-length"]) > 0  # the size a GET would have had; not sent
    status, headers = await read_head(reader)
    assert status == 404
    answer = await read_response(reader)  # read from where the HEAD answers ended
    assert (answer.status, json.loads(answer.body)["got"]) == (200, "after")
    writer.close()


async def test_a_405_says_which_method_is_allowed(served: Served) -> None:
    reader, writer = await served.connect()
    writer.write(request("/filter", b"", method="GET"))
    answer = await read_response(reader)
    assert (answer.status, answer.headers["allow"]) == (405, "POST")
    assert error(answer.body) == "GET not allowed on /filter"
    writer.close()


# --- Expect ----------------------------------------------------------------------------------


def expecting(path: str, length: int, expect: str = "100-continue") -> bytes:
    return f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\nExpect: {expect}\r\n\r\n".encode()


async def test_expect_100_continue_gets_100_continue_before_the_body_is_sent(served: Served) -> None:
    reader, writer = await served.connect()
    for n in (1, 2):  # and again on the kept-alive connection
        body = f'{{"n": {n}}}'.encode()
        writer.write(expecting("/filter", len(body)))
        interim = await asyncio.wait_for(reader.readexactly(len(extender_wire.CONTINUE)), 5)
        assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
        writer.write(body)
        answer = await read_response(reader)
        assert (answer.status, json.loads(answer.body)["got"]) == (200, body.decode())
    writer.close()


@pytest.mark.parametrize(
    ("head", "status", "reason"),
    [
        (expecting("/filter", 2, "something-else"), 417, "Expect: 'something-else' is not supported"),
        (expecting("/small", CAP + 1), 413, f"over the {CAP} byte limit"),  # no 100 for a body refused
    ],
    ids=["other-expectation", "body-over-the-cap"],
)
async def test_an_expectation_not_met_is_refused_at_once_without_100_continue(
    served: Served, head: bytes, status: int, reason: str
) -> None:
    reader, writer = await served.connect()
    writer.write(head)
    answer = await read_response(reader)  # a 100 first would not parse as this
    assert (answer.status, answer.headers["connection"]) == (status, "close")
    assert reason in error(answer.body)
    assert await closed_by_server(reader)
    assert served.verbs.seen == []
    writer.close()


class Transport(asyncio.Transport):
    """Records what the protocol writes; nothing goes anywhere."""

    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.closed = False
        self.reading = True

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += data

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str, default: object = None) -> object:
        return ("127.0.0.1", 5555) if name == "peername" else default

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def is_closing(self) -> bool:
        return self.closed


async def test_a_pipelined_100_continue_waits_for_the_answer_before_it(served: Served) -> None:
    """A 100 Continue is read as part of the answer the caller is waiting for: written while a
    /bind is under way, it would be taken for the bind's."""
    connection = extender_conn.Connection(served.server)
    transport = Transport()
    connection.connection_made(transport)
    connection.data_received(request("/bind", b"first") + expecting("/filter", 6))
    await served.verbs.started.wait()
    assert transport.written == b""
    served.verbs.release.set()
    await asyncio.wait(served.server.tasks)  # (its done callback, which answers, has run)
    bind_answer = extender_wire.encode(extender_wire.Reply(200, {"Error": "", "slow": "first"}), close=False)
    assert transport.written == bind_answer + extender_wire.CONTINUE
    connection.data_received(b"second")
    assert transport.written.endswith(b'"got":"second","n":1}')
    connection.connection_lost(None)


# --- a refusal after pipelined requests ------------------------------------------------------


async def test_a_refusal_waits_for_the_bind_before_it_and_does_not_cancel_it(served_short: Served) -> None:
    served = served_short
    reader, writer = await served.connect()
    writer.write(request("/bind", b"first"))
    await served.verbs.started.wait()
    writer.write(request("/filter", b"{}")[:-1])  # pipelined, one byte short: a 408 in SHORT_S
    await asyncio.wait_for(served.log.hit_once.wait(), 5)
    assert served.log.hits == {"body": 1}
    served.verbs.release.set()
    first = await read_response(reader)
    assert json.loads(first.body) == {"Error": "", "slow": "first"}
    assert not served.verbs.cancelled.is_set()
    second = await read_response(reader)
    assert (second.status, second.headers["connection"]) == (408, "close")
    assert await closed_by_server(reader)
    writer.close()


@pytest.mark.parametrize(
    "then",
    [GARBAGE, b"GET /filter HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"],
    ids=["garbage", "upgrade"],
)
async def test_requests_before_garbage_in_the_same_read_are_answered_first(
    served: Served, then: bytes
) -> None:
    reader, writer = await served.connect()
    writer.write(request("/filter", b"one") + request("/bind", b"two") + then)
    await asyncio.wait_for(served.verbs.started.wait(), 5)
    served.verbs.release.set()
    answers = [await read_response(reader) for _ in range(3)]
    assert [a.status for a in answers] == [200, 200, 400]
    assert json.loads(answers[0].body)["got"] == "one"
    assert json.loads(answers[1].body)["slow"] == "two"
    assert await closed_by_server(reader)
    assert served.verbs.seen == [b"one"]  # (the upgrade request itself is not served)
    writer.close()


# --- the caller still sending after a refusal ------------------------------------------------


def _post_after_its_refusal(port: int, body_bytes: int) -> tuple[bytes, str]:
    """A blocking client that sends a head over /small's cap, reads the 413, and only then sends
    its body (so the refusal has certainly been made before any of it arrives): the answer, and
    how sending the body ended."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        # a small send buffer: a peer that does not read the body makes sendall fail or block
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16 << 10)
        sock.sendall(b"POST /small HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % body_bytes)
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.endswith(b"}"):
            chunk = sock.recv(4096)
            if not chunk:
                break
            answer += chunk
        try:
            sock.sendall(b"x" * body_bytes)
            sock.shutdown(socket.SHUT_WR)
            end = "eof" if sock.recv(4096) == b"" else "data"
        except OSError as exc:
            end = type(exc).__name__
    return answer, end


async def test_a_caller_still_sending_after_a_refusal_gets_the_answer_not_a_reset(served: Served) -> None:
    """Closing with request bytes unread makes the kernel reset the connection; a caller still
    writing its body (Go's client, as kube-scheduler's) then fails its write and never reads the
    413. The server ends its side and reads on, dropping the bytes, until the caller's own end."""
    body_bytes = extender_conn.LINGER_BYTES * 3 // 4
    answer, end = await asyncio.to_thread(_post_after_its_refusal, served.port, body_bytes)
    assert answer.startswith(b"HTTP/1.1 413 ")
    assert b"Connection: close\r\n" in answer
    assert end == "eof"
    assert served.verbs.seen == []


async def test_a_refused_caller_that_keeps_sending_is_cut_off_after_the_linger(served_short: Served) -> None:
    body_bytes = 64 << 20  # far more than the linger reads, and than the socket buffers hold
    answer, end = await asyncio.to_thread(_post_after_its_refusal, served_short.port, body_bytes)
    assert answer.startswith(b"HTTP/1.1 413 ")
    assert end in ("ConnectionResetError", "BrokenPipeError")  # (not TimeoutError: the linger ended)
    assert not served_short.server.lingering


async def test_lingering_connections_hold_no_slot_and_the_oldest_goes_first(served: Served) -> None:
    held = []
    for _ in range(MAX_CONNECTIONS + 1):
        reader, writer = await served.connect()
        writer.write(expecting("/small", CAP + 1))
        assert (await read_response(reader)).status == 413
        held.append((reader, writer))
    assert served.server.active == 0
    lingering = {c._peer for c in served.server.lingering}
    peers = [f"127.0.0.1:{w.get_extra_info('sockname')[1]}" for _, w in held]
    assert lingering == set(peers[1:])  # the oldest was cut off for the newest
    reader, writer = await served.connect()  # a slot is free for a new caller
    writer.write(request("/filter"))
    assert (await read_response(reader)).status == 200
    for _, w in [*held, (reader, writer)]:
        w.close()


async def test_a_lingering_connection_reads_at_most_linger_bytes(served: Served) -> None:
    connection = extender_conn.Connection(served.server)
    transport = Transport()
    connection.connection_made(transport)
    connection.data_received(expecting("/small", CAP + 1))
    assert transport.written.startswith(b"HTTP/1.1 413 ")
    chunk = b"x" * (64 << 10)
    for _ in range(extender_conn.LINGER_BYTES // len(chunk) - 1):
        connection.data_received(chunk)
        assert transport.reading
    connection.data_received(chunk)
    assert not transport.reading  # the rest is left in the kernel until the linger ends
    assert not transport.closed
    connection.end_linger()
    assert transport.closed
    connection.connection_lost(None)
    assert not served.server.lingering
