"""A closed connection is freed by reference counting alone: no reference cycle waits for the
collector, which the scheduler keeps from scanning what survived a young collection (gcfreeze.py).

Before, each TLS handshake that failed or timed out left asyncio's ``SSLProtocol`` (with its
256 KiB read buffer) in a cycle through the exception's traceback: 256 silent connections every
handshake timeout held 64 MiB each time until an idle compaction (issue 49, item 1). The tests run
with the collector off, so anything not freed by its last reference stays, and look for the
server's objects by weak reference.
"""

from __future__ import annotations

import asyncio
import datetime
import gc
import ssl
import weakref
from asyncio import sslproto
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
from aiohttp import web
from vgpu.localcluster import certs
from vgpu_scheduler import extender_http, extender_wire, listener

HANDSHAKE_TIMEOUT_S = 0.2
CONNECTIONS = 16


@pytest.fixture
def collector_off() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


async def _until(condition: Callable[[], bool], *, timeout_s: float = 10.0) -> None:
    """Poll ``condition`` (the loop runs the connections meanwhile) for at most ``timeout_s``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():
        if loop.time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.01)


def _server_objects(port: int) -> list[weakref.ref[object]]:
    """Weak references to the server side's socket transports on ``port`` and their protocols
    when TLS runs over them (asyncio's ``SSLProtocol``)."""
    found: list[weakref.ref[object]] = []
    for obj in gc.get_objects():
        if isinstance(obj, asyncio.Transport) and not isinstance(obj, sslproto._SSLProtocolTransport):
            sockname = obj.get_extra_info("sockname")
            if isinstance(sockname, tuple) and sockname[1] == port:
                found.append(weakref.ref(obj))
                if isinstance(protocol := obj.get_protocol(), sslproto.SSLProtocol):
                    found.append(weakref.ref(protocol))
    return found


def _handshaking(port: int) -> int:
    return sum(isinstance(ref(), sslproto.SSLProtocol) for ref in _server_objects(port))


def _alive(refs: list[weakref.ref[object]]) -> list[str]:
    return [type(obj).__name__ for ref in refs if (obj := ref()) is not None]


@pytest.fixture
async def tls_site(tmp_path: Path) -> AsyncIterator[listener.BoundedSite]:
    tls = certs.make_serving_certs(tmp_path, now=datetime.datetime.now(datetime.UTC))
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(tls.cert_file, tls.key_file)

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    runner = web.AppRunner(app, keepalive_timeout=5.0)
    await runner.setup()
    site = listener.BoundedSite(
        runner,
        "127.0.0.1",
        0,
        limits=listener.Limits(handshake_timeout_s=HANDSHAKE_TIMEOUT_S),
        limit_log=listener.LimitLog("service", clock=lambda: 0.0),
        ssl_context=context,
    )
    await site.start()
    try:
        yield site
    finally:
        await site.stop()
        await runner.cleanup()


@pytest.mark.parametrize(
    "first",
    [pytest.param(b"", id="silent-until-the-timeout"), pytest.param(b"GET / HTTP/1.1\r\n\r\n", id="not-tls")],
)
async def test_failed_handshakes_leave_nothing_for_the_collector(
    tls_site: listener.BoundedSite, collector_off: None, first: bytes
) -> None:
    host, port = tls_site.address
    writers = []
    for _ in range(CONNECTIONS):
        _, writer = await asyncio.open_connection(host, port)
        writers.append(writer)
    await _until(lambda: tls_site.active == CONNECTIONS)
    await _until(lambda: _handshaking(port) == CONNECTIONS)
    refs = _server_objects(port)
    assert len(refs) == 2 * CONNECTIONS  # a transport and its TLS protocol each
    for writer in writers:
        writer.write(first)
    await _until(lambda: tls_site.limit_log.hits.get("handshake", 0) == CONNECTIONS)
    await _until(lambda: tls_site.active == 0)
    await _until(lambda: not _alive(refs), timeout_s=2.0)
    for writer in writers:
        writer.close()


async def test_a_served_tls_connection_leaves_nothing_for_the_collector(
    tls_site: listener.BoundedSite, collector_off: None
) -> None:
    host, port = tls_site.address
    client = ssl.create_default_context()
    client.check_hostname = False
    client.verify_mode = ssl.CERT_NONE
    reader, writer = await asyncio.open_connection(host, port, ssl=client)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    await _until(lambda: tls_site.active == 1)
    refs = _server_objects(port)
    assert len(refs) == 2
    assert (await reader.read()).endswith(b"ok")
    writer.close()
    await _until(lambda: tls_site.active == 0)
    await _until(lambda: not _alive(refs), timeout_s=2.0)


async def test_an_extender_connection_leaves_nothing_for_the_collector(collector_off: None) -> None:
    def filter_verb(_: bytes) -> extender_wire.Reply:
        return extender_wire.Reply(200, {"Error": ""})

    server = extender_http.ExtenderServer(
        {"/filter": extender_wire.Verb(filter_verb, inline=True)},
        limits=listener.Limits(),
        limit_log=listener.LimitLog("extender", clock=lambda: 0.0),
    )
    host, port = (await server.start("127.0.0.1", 0)).rsplit(":", 1)
    try:
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
        await reader.readuntil(b'{"Error":""}')
        [connection] = server.connections
        refs = [weakref.ref[object](connection), *_server_objects(int(port))]
        assert len(refs) == 2
        del connection
        writer.close()
        await _until(lambda: server.active == 0)
        await _until(lambda: not _alive(refs), timeout_s=2.0)
    finally:
        await server.stop(timeout_s=1.0)
