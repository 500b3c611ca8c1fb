"""The extender listener's own HTTP/1.1 server (extender_http.py), through real sockets.

Stub verbs stand in for /filter (inline), /bind (a task) and a verb with a small body cap; the
limits are cut to fractions of a second so that the timeouts can be waited for (each test waits
for the server's answer or its end of the connection, never for a fixed time).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from vgpu_scheduler import extender_conn, extender_read, listener
from vgpu_scheduler.extender_http import ExtenderServer
from vgpu_scheduler.extender_wire import Reply, Verb

SHORT_S = 0.2  # the head and body timeouts here
CAP = 64  # /small's body cap


@dataclass
class Verbs:
    """The stub verbs and what they saw."""

    release: asyncio.Event = field(default_factory=asyncio.Event)
    started: asyncio.Event = field(default_factory=asyncio.Event)
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    seen: list[bytes] = field(default_factory=list)

    def inline(self, body: bytes) -> Reply:
        self.seen.append(body)
        return Reply(200, {"Error": "", "got": body.decode(), "n": len(self.seen)})

    async def slow(self, body: bytes) -> Reply:
        self.started.set()
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        return Reply(200, {"Error": "", "slow": body.decode()})

    def boom(self, body: bytes) -> Reply:
        raise RuntimeError("a bug")

    def unencodable(self, body: bytes) -> Reply:
        return Reply(200, {"set": {1, 2}})


@dataclass
class Served:
    server: ExtenderServer
    host: str
    port: int
    verbs: Verbs
    log: listener.LimitLog


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    """Timeouts no test reaches: connections stay open however slow the machine is."""
    async with serving(timeout_s=60.0) as got:
        yield got


@pytest.fixture
async def served_short() -> AsyncIterator[Served]:
    """Head and body timeouts of ``SHORT_S``, for the tests of those timeouts."""
    async with serving(timeout_s=SHORT_S) as got:
        yield got


@contextlib.asynccontextmanager
async def serving(*, timeout_s: float) -> AsyncIterator[Served]:
    verbs = Verbs()
    limit_log = listener.LimitLog("extender", clock=lambda: 0.0)
    limits = listener.Limits(
        max_connections=3, idle_timeout_s=timeout_s, body_timeout_s=timeout_s, max_body_bytes=1 << 20
    )
    server = ExtenderServer(
        {
            "/filter": Verb(verbs.inline, inline=True),
            "/bind": Verb(verbs.slow, inline=False),
            "/small": Verb(verbs.inline, inline=True, max_body_bytes=CAP),
            "/boom": Verb(verbs.boom, inline=True),
            "/unencodable": Verb(verbs.unencodable, inline=True),
        },
        limits=limits,
        limit_log=limit_log,
    )
    address = await server.start("127.0.0.1", 0)
    host, port = address.rsplit(":", 1)
    try:
        yield Served(server, host, int(port), verbs, limit_log)
    finally:
        verbs.release.set()
        await server.stop(timeout_s=1.0)


def request(path: str, body: bytes = b"{}", *, method: str = "POST", extra: str = "") -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n{extra}\r\n"
    return head.encode() + body


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: bytes


async def read_response(reader: asyncio.StreamReader) -> Response:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines if line)}
    body = await asyncio.wait_for(reader.readexactly(int(headers["content-length"])), 5)
    return Response(int(status_line.split()[1]), headers, body)


async def closed_by_server(reader: asyncio.StreamReader) -> bool:
    """True once the server has ended the connection (EOF, or a reset)."""
    try:
        return await asyncio.wait_for(reader.read(), 5) == b""
    except ConnectionResetError:
        return True


async def connect(s: Served) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection(s.host, s.port)


async def test_requests_on_one_kept_alive_connection_are_answered_in_turn(served: Served) -> None:
    reader, writer = await connect(served)
    for n in (1, 2, 3):
        writer.write(request("/filter", f'{{"n": {n}}}'.encode()))
        answer = await read_response(reader)
        assert answer.status == 200
        assert answer.headers["content-type"].startswith("application/json")
        assert json.loads(answer.body)["got"] == f'{{"n": {n}}}'
        assert "connection" not in answer.headers  # kept alive
    writer.close()


async def test_calls_are_counted_by_whether_they_came_on_a_new_connection(served: Served) -> None:
    """kube-scheduler dials for most /filter calls on a busy machine (it keeps two idle
    connections): the listener counts the connections and, per verb, the calls that were the
    first on theirs. Unknown paths are not counted (their names are whatever the caller sent)."""
    assert (served.server.accepted, dict(served.server.requests)) == (0, {})
    reader, writer = await connect(served)
    for path in ("/filter", "/filter", "/nowhere", "/small"):
        writer.write(request(path))
        await read_response(reader)
    other_reader, other_writer = await connect(served)
    other_writer.write(request("/nowhere") + request("/filter"))
    assert (await read_response(other_reader)).status == 404
    await read_response(other_reader)
    assert served.server.accepted == 2
    assert dict(served.server.requests) == {
        ("/filter", True): 1,  # the first connection's first call
        ("/filter", False): 2,  # the first's second call, and the second's after its 404
        ("/small", False): 1,
    }
    writer.close()
    other_writer.close()


class Transport(asyncio.Transport):
    """Records what the protocol writes; nothing goes anywhere."""

    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str, default: object = None) -> object:
        return ("127.0.0.1", 5555) if name == "peername" else default

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def is_closing(self) -> bool:
        return self.closed


async def test_a_filter_is_answered_within_the_call_that_delivers_its_bytes(served: Served) -> None:
    """kube-scheduler's serial cycle waits for /filter: no task, no further turn of the loop."""
    connection = extender_conn.Connection(served.server)
    transport = Transport()
    connection.connection_made(transport)
    data = request("/filter", b'{"Pod": 1}')
    connection.data_received(data[:10])
    assert transport.written == b""  # half a request: nothing to answer yet
    connection.data_received(data[10:])
    assert transport.written.startswith(b"HTTP/1.1 200 OK\r\n")  # before this test awaited anything
    assert transport.written.endswith(b'"got":"{\\"Pod\\": 1}","n":1}')
    connection.connection_lost(None)


async def test_pipelined_requests_are_answered_in_the_order_they_came(served: Served) -> None:
    reader, writer = await connect(served)
    writer.write(request("/bind", b"first") + request("/filter", b"second"))
    await served.verbs.started.wait()
    assert served.verbs.seen == []  # the inline verb waits its turn behind the bind
    served.verbs.release.set()
    first, second = await read_response(reader), await read_response(reader)
    assert json.loads(first.body) == {"Error": "", "slow": "first"}
    assert json.loads(second.body)["got"] == "second"
    writer.close()


async def test_a_caller_that_hangs_up_cancels_its_bind(served: Served) -> None:
    _, writer = await connect(served)
    writer.write(request("/bind"))
    await served.verbs.started.wait()
    writer.close()
    await asyncio.wait_for(served.verbs.cancelled.wait(), 5)
    assert served.server.active == 0  # its slot was given back when the connection went


@pytest.mark.parametrize(
    ("data", "status", "reason"),
    [
        (b"NOT HTTP AT ALL\r\n\r\n", 400, "malformed HTTP request"),
        (b"POST /filter HTTP/1.1\r\nContent-Length: x\r\n\r\n", 400, "malformed HTTP request"),
        (b"\x00\xff\xfe garbage", 400, "malformed HTTP request"),
        (
            b"GET /filter HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
            400,
            "upgrades are not served",
        ),
    ],
)
async def test_garbage_is_a_400_with_the_reason_and_the_connection_closed(
    served: Served, data: bytes, status: int, reason: str
) -> None:
    reader, writer = await connect(served)
    writer.write(data)
    answer = await read_response(reader)
    assert answer.status == status
    assert reason in json.loads(answer.body)["Error"]
    assert answer.headers["connection"] == "close"
    assert await closed_by_server(reader)
    assert served.verbs.seen == []
    writer.close()


async def test_unknown_paths_are_404_and_other_methods_405(served: Served) -> None:
    reader, writer = await connect(served)
    writer.write(request("/nope"))
    assert (await read_response(reader)).status == 404
    writer.write(request("/filter", b"", method="GET"))
    answer = await read_response(reader)
    assert answer.status == 405
    assert "GET not allowed on /filter" in json.loads(answer.body)["Error"]
    writer.write(request("/filter?with=query", b"ok"))  # the path without its query
    assert (await read_response(reader)).status == 200
    writer.close()


async def test_a_body_over_the_paths_cap_is_413_declared_or_chunked(served: Served) -> None:
    big = b"x" * (CAP + 1)
    chunked = (
        b"POST /small HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        + b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (big[:40], big[40:]))
        + b"0\r\n\r\n"
    )
    for data in (request("/small", big), chunked):
        reader, writer = await connect(served)
        writer.write(data)
        answer = await read_response(reader)
        assert answer.status == 413
        assert f"over the {CAP} byte limit" in json.loads(answer.body)["Error"]
        assert await closed_by_server(reader)
        writer.close()
    assert served.log.hits["body"] == 2
    assert served.verbs.seen == []
    reader, writer = await connect(served)
    writer.write(request("/small", b"x" * CAP))  # at the cap is fine
    assert (await read_response(reader)).status == 200
    writer.close()


async def test_a_body_that_does_not_arrive_in_time_is_408(served_short: Served) -> None:
    served = served_short
    reader, writer = await connect(served)
    writer.write(request("/filter", b"{}")[:-1])  # one byte short
    answer = await read_response(reader)
    assert answer.status == 408
    assert "body not received within" in json.loads(answer.body)["Error"]
    assert await closed_by_server(reader)
    assert served.log.hits == {"body": 1}
    writer.close()


async def test_a_connection_without_a_request_head_in_time_is_closed_and_logged(
    served_short: Served, caplog: pytest.LogCaptureFixture
) -> None:
    served = served_short
    with caplog.at_level(logging.WARNING, logger=listener.__name__):
        silent_reader, silent = await connect(served)
        half_reader, half = await connect(served)
        half.write(b"POST /filter HTTP/1.1\r\nHost")
        assert await closed_by_server(silent_reader)
        assert await closed_by_server(half_reader)
    assert served.log.hits == {"request-head": 2}
    assert "no complete request within 0.2 s" in caplog.text
    # a connection idle after an answer is closed too, as a keep-alive timeout (not logged)
    reader, writer = await connect(served)
    writer.write(request("/filter"))
    await read_response(reader)
    assert await closed_by_server(reader)
    assert served.log.hits == {"request-head": 2}
    for w in (silent, half, writer):
        w.close()


@pytest.mark.parametrize("line", [b"X-Long: ", b"/filter"], ids=["one-header", "request-line"])
async def test_a_request_head_over_its_cap_is_431_and_closed_without_buffering_it(
    served: Served, line: bytes
) -> None:
    reader, writer = await connect(served)
    head = b"POST /filter HTTP/1.1\r\nHost: x\r\n" + line if line.startswith(b"X") else b"POST " + line
    writer.write(head + b"a" * extender_read.MAX_HEAD_BYTES)  # and no end of line, ever
    answer = await read_response(reader)
    assert answer.status == 431
    assert f"over {extender_read.MAX_HEAD_BYTES} bytes" in json.loads(answer.body)["Error"]
    assert await closed_by_server(reader)
    assert served.log.hits == {"request-head": 1}
    writer.close()


async def test_connections_over_the_cap_are_refused_at_once(served: Served) -> None:
    held = [await connect(served) for _ in range(3)]
    for reader, writer in held:  # each served, so each is counted by now
        writer.write(request("/filter"))
        await read_response(reader)
    reader, refused = await connect(served)
    assert await closed_by_server(reader)
    refused.close()
    assert served.log.hits["connections"] == 1
    # the server ends one (its slot is given back before its end of the connection closes)
    held[0][1].write(request("/filter", extra="Connection: close\r\n"))
    await read_response(held[0][0])
    assert await closed_by_server(held[0][0])
    assert served.server.active == 2
    reader, writer = await connect(served)
    writer.write(request("/filter"))
    assert (await read_response(reader)).status == 200
    for _, w in held:
        w.close()
    writer.close()


@pytest.mark.parametrize(
    "data",
    [
        b"POST /filter HTTP/1.0\r\nContent-Length: 2\r\n\r\n{}",
        request("/filter", extra="Connection: close\r\n"),
    ],
    ids=["http-1.0", "connection-close"],
)
async def test_a_caller_that_does_not_keep_alive_gets_its_answer_then_the_connection_closes(
    served: Served, data: bytes
) -> None:
    reader, writer = await connect(served)
    writer.write(data)
    answer = await read_response(reader)
    assert answer.status == 200
    assert answer.headers["connection"] == "close"
    assert await closed_by_server(reader)
    writer.close()


async def test_a_failing_verb_is_a_500_naming_the_error_and_logged(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    reader, writer = await connect(served)
    for path in ("/boom", "/unencodable"):
        writer.write(request(path))
        answer = await read_response(reader)
        assert answer.status == 500
        assert json.loads(answer.body)["Error"].startswith("internal error: ")
    assert "a bug" in caplog.text
    writer.write(request("/filter"))  # the connection still serves
    assert (await read_response(reader)).status == 200
    writer.close()


async def test_a_bug_while_reading_a_request_is_a_500_and_logged_not_blamed_on_the_caller(
    served: Served, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(self: object) -> None:
        raise KeyError("a bug")

    monkeypatch.setattr(extender_read.RequestReader, "on_headers_complete", broken)
    reader, writer = await connect(served)
    writer.write(request("/filter"))
    answer = await read_response(reader)
    assert answer.status == 500
    assert json.loads(answer.body)["Error"] == "internal error reading the request"
    assert "reading a request from 127.0.0.1" in caplog.text
    assert await closed_by_server(reader)
    writer.close()


async def test_stop_lets_an_answer_under_way_finish_and_closes_after_it(served: Served) -> None:
    reader, writer = await connect(served)
    writer.write(request("/bind", b"late"))
    await served.verbs.started.wait()
    stopping = asyncio.ensure_future(served.server.stop(timeout_s=5.0))
    served.verbs.release.set()
    answer = await read_response(reader)
    assert json.loads(answer.body)["slow"] == "late"
    assert answer.headers["connection"] == "close"
    await asyncio.wait_for(stopping, 5)
    assert await closed_by_server(reader)
    writer.close()


async def test_stop_cancels_an_answer_that_does_not_finish_in_time(served: Served) -> None:
    reader, writer = await connect(served)
    writer.write(request("/bind"))
    await served.verbs.started.wait()
    await asyncio.wait_for(served.server.stop(timeout_s=SHORT_S), 5)
    assert served.verbs.cancelled.is_set()
    assert await closed_by_server(reader)
    with pytest.raises(OSError):
        await asyncio.open_connection(served.host, served.port)  # no longer listening
    writer.close()
