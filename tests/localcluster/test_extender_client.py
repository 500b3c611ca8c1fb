"""The kube-scheduler emulation's extender client keeps connections as Go's transport does for
kube-scheduler: a connection per call in flight, at most two kept idle once given back. A real
kube-scheduler therefore dials for many /filter calls while binds are in flight; so must this."""

from __future__ import annotations

import asyncio
import gzip
import json
from typing import Any

import pytest
from aiohttp import web
from vgpu.core import errors
from vgpu.localcluster import extender


class Recorder:
    """An extender whose binds wait for ``release``; records each call's client port."""

    def __init__(self) -> None:
        self.ports: list[tuple[str, int]] = []
        self.release = asyncio.Event()
        self.waiting = 0
        self.changed = asyncio.Condition()

    async def call(self, request: web.Request) -> web.Response:
        peer = request.transport.get_extra_info("peername") if request.transport else None
        self.ports.append((request.path, peer[1] if peer else -1))
        if request.path.endswith("/bind"):
            async with self.changed:
                self.waiting += 1
                self.changed.notify_all()
            await self.release.wait()
            self.waiting -= 1
        return web.json_response({"Error": "", "NodeNames": ["n1"], "FailedNodes": {}})


async def test_concurrent_calls_dial_and_only_two_connections_stay_idle(aiohttp_server: Any) -> None:
    recorder = Recorder()
    app = web.Application()
    app.router.add_post("/sched/filter", recorder.call)
    app.router.add_post("/sched/bind", recorder.call)
    server = await aiohttp_server(app)
    ext = extender.ExtenderConfig(
        url_prefix=str(server.make_url("/sched")),
        filter_verb="filter",
        bind_verb="bind",
        node_cache_capable=True,
    )
    client = extender.ExtenderClient([ext])
    connections = client.connections[id(ext)]
    pod = {"metadata": {"name": "p", "namespace": "default", "uid": "u"}}

    async def bind(i: int) -> None:
        await client.bind(ext, {"metadata": {"name": f"p{i}", "namespace": "default", "uid": f"u{i}"}}, "n1")

    async def until_waiting(n: int) -> None:
        async with recorder.changed:
            await recorder.changed.wait_for(lambda: recorder.waiting >= n)

    try:
        binds = [asyncio.create_task(bind(i)) for i in range(5)]
        await asyncio.wait_for(until_waiting(5), 10)
        assert connections.dials == 5  # one connection per call in flight
        assert len({port for _, port in recorder.ports}) == 5
        recorder.release.set()
        await asyncio.gather(*binds)
        assert len(connections.idle) == 2  # the other three were closed
        kept = {port for _, port in recorder.ports[-5:]}

        await client.filter(ext, pod, ["n1"])  # on an idle connection: no dial
        assert connections.dials == 5
        assert recorder.ports[-1][1] in kept

        recorder.release.clear()
        binds = [asyncio.create_task(bind(i)) for i in range(3)]
        await asyncio.wait_for(until_waiting(3), 10)
        assert connections.dials == 6  # two idle ones taken, one new
        recorder.release.set()
        await asyncio.gather(*binds)
        assert len(connections.idle) == 2
    finally:
        recorder.release.set()
        await client.close()
    assert connections.idle == []


class RawServer:
    """A TCP server that answers each request with ``answer(request_bytes)`` (bytes to write, then
    ``close`` to hang up), recording the requests; for the client's handling of what a real
    server may send."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.requests: list[bytes] = []
        self.connections = 0
        self.writers: list[asyncio.StreamWriter] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.writers.append(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":", 1)[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                self.requests.append(head + await reader.readexactly(length))
                data, close = self.answer(self.requests[-1])
                writer.write(data)
                await writer.drain()
                if close:
                    writer.close()
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    async def __aenter__(self) -> extender.ExtenderConfig:
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return extender.ExtenderConfig(
            url_prefix=f"http://127.0.0.1:{port}/sched", filter_verb="filter", node_cache_capable=True
        )

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()
        await self.server.wait_closed()


def _answer(body: bytes, *headers: str, status: str = "200 OK") -> bytes:
    head = "".join(f"{h}\r\n" for h in (f"Content-Length: {len(body)}", *headers))
    return f"HTTP/1.1 {status}\r\n{head}\r\n".encode() + body


POD = {"metadata": {"name": "p", "namespace": "default", "uid": "u"}}
OK = b'{"NodeNames": ["n1"], "FailedNodes": {}, "Error": ""}'


async def test_the_request_is_what_go_sends_and_a_gzipped_answer_is_read() -> None:
    server = RawServer(lambda req: (_answer(gzip.compress(OK), "Content-Encoding: gzip"), False))
    async with server as ext:
        client = extender.ExtenderClient([ext])
        try:
            result = await client.filter(ext, POD, ["n1", "n2"])
        finally:
            await client.close()
    assert result.passed == ["n1"]
    head, _, body = server.requests[0].partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"POST /sched/filter HTTP/1.1"
    assert {b"Accept-Encoding: gzip", b"Content-Type: application/json"} <= set(lines)
    assert json.loads(body)["NodeNames"] == ["n1", "n2"]


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        (b'HTTP/1.1 200 OK\r\nContent-Length: 90\r\n\r\n{"NodeNames"', ": EOF"),  # hung up mid-body
        (b"SMTP ready\r\n\r\n", ": malformed HTTP response"),
        (_answer(b"nope", status="502 Bad Gateway"), "failed filter with extender at URL {url}, code 502"),
        (_answer(b"\x1f\x8b garbage", "Content-Encoding: gzip"), "{url}"),  # not gzip after all
    ],
    ids=["eof", "not-http", "502", "bad-gzip"],
)
async def test_garbage_from_the_extender_is_a_scheduling_error_and_its_connection_is_not_kept(
    answer: bytes, message: str
) -> None:
    server = RawServer(lambda req: (answer, True))
    async with server as ext:
        client = extender.ExtenderClient([ext])
        try:
            with pytest.raises(errors.SchedulingError) as caught:
                await client.filter(ext, POD, ["n1"])
            assert message.format(url=ext.url("filter")) in str(caught.value)
            assert client.connections[id(ext)].idle == []
        finally:
            await client.close()


async def test_a_refused_dial_reads_as_gos() -> None:
    server = RawServer(lambda req: (_answer(OK), False))
    async with server as ext:
        pass  # closed: nothing listens on its port now
    client = extender.ExtenderClient([ext])
    try:
        with pytest.raises(errors.SchedulingError) as caught:
            await client.filter(ext, POD, ["n1"])
    finally:
        await client.close()
    port = ext.url_prefix.split(":")[2].split("/")[0]
    assert str(caught.value) == (
        f'Post "{ext.url("filter")}": dial tcp 127.0.0.1:{port}: connect: connection refused'
    )


async def test_an_idle_connection_the_server_closed_is_not_used_again() -> None:
    server = RawServer(lambda req: (_answer(OK), False))
    async with server as ext:
        client = extender.ExtenderClient([ext])
        connections = client.connections[id(ext)]
        try:
            await client.filter(ext, POD, ["n1"])
            await client.filter(ext, POD, ["n1"])
            assert (connections.dials, server.connections) == (1, 1)  # kept alive
            (idle,) = connections.idle
            server.writers[0].close()  # the server's idle timeout
            await asyncio.wait_for(idle.lost.wait(), 10)  # its EOF reaches the client
            assert (await client.filter(ext, POD, ["n1"])).passed == ["n1"]
            assert (connections.dials, server.connections) == (2, 2)
        finally:
            await client.close()
