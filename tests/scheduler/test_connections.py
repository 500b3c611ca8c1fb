"""Idle and slow connections against the real binary (issue 16, item 4).

A vgpu-scheduler subprocess serves HTTPS on 127.0.0.1; the test opens TCP connections that never
start TLS, many idle TLS connections, half-sent request heads and half-sent bodies, then checks that the process's RSS (read from /proc)
grew by a bounded amount, that the extender listener kept serving meanwhile, that the server closed
every stalled connection within its timeouts (one log line per limit hit, no traceback), and that
the Service port serves real requests again afterwards. Before the limits, 2,000 idle connections
took the scheduler to 611 MB.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import os
import ssl
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from vgpu.kube.kubeconfig import write_kubeconfig
from vgpu.localcluster import certs
from vgpu.localcluster.apiserver import ApiServer
from vgpu.localcluster.store import Store

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

MAX_CONNECTIONS = 64
IDLE = 400  # TLS connections that complete the handshake and send nothing
SILENT = 10  # TCP connections that never start the TLS handshake
HALF_HEADS = 20  # a request head cut off in the middle
HALF_BODIES = 20  # a complete head announcing a body that never fully arrives
TIMEOUT_S = 5.0  # the listener's handshake, head and body timeouts (listener.Limits defaults)
RSS_GROWTH_LIMIT_MB = 60.0  # 64 TLS connections at about 0.27 MB each, plus slack


@dataclass
class Scheduler:
    proc: asyncio.subprocess.Process
    service: str  # host:port, HTTPS
    extender: str  # host:port, HTTP
    client_ssl: ssl.SSLContext
    log: Path

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise AssertionError("no VmRSS")


@pytest.fixture
async def scheduler(tmp_path: Path) -> AsyncIterator[Scheduler]:
    store = Store()
    server = ApiServer(store)
    await server.start()
    tls = certs.make_serving_certs(tmp_path / "certs", now=datetime.datetime.now(datetime.UTC))
    client_ssl = ssl.create_default_context(cafile=str(tls.ca_file))
    ready, log = tmp_path / "ready", tmp_path / "scheduler.log"
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "vgpu_scheduler.main",
            "--kubeconfig", str(write_kubeconfig(tmp_path / "kubeconfig", server=server.url)),
            "--host", "127.0.0.1", "--port", "0", "--extender-port", "0",
            "--tls-cert-file", str(tls.cert_file), "--tls-key-file", str(tls.key_file),
            "--max-connections", str(MAX_CONNECTIONS),
            "--ready-file", str(ready),
            stdout=out, stderr=asyncio.subprocess.STDOUT, stdin=asyncio.subprocess.DEVNULL,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
    try:
        async with asyncio.timeout(30):
            while not ready.exists() or len(ready.read_text().split()) < 2:
                assert proc.returncode is None, log.read_text()
                await asyncio.sleep(0.05)
        service, extender = ready.read_text().split()
        yield Scheduler(proc, service, extender, client_ssl, log)
    finally:
        if proc.returncode is None:
            proc.terminate()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), 15)
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await server.stop()


async def _open(address: str, context: ssl.SSLContext, first: bytes = b"") -> asyncio.StreamReader | None:
    """A TLS connection that sent ``first``; None when the server refused it."""
    host, port = address.rsplit(":", 1)
    try:
        reader, writer = await asyncio.open_connection(host, int(port), ssl=context, server_hostname=host)
        if first:
            writer.write(first)
            await writer.drain()
    except (OSError, ssl.SSLError):
        return None
    _writers.append(writer)
    return reader


_writers: list[asyncio.StreamWriter] = []


async def _open_tcp(address: str) -> asyncio.StreamReader:
    """A plain TCP connection to a TLS port that never starts the handshake."""
    host, port = address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    _writers.append(writer)
    return reader


async def _closed_by_server(reader: asyncio.StreamReader) -> bytes:
    """What the server sent before it closed the connection (bounded by the test's timeouts)."""
    data = b""
    try:
        async with asyncio.timeout(3 * TIMEOUT_S):
            while chunk := await reader.read(65536):
                data += chunk
    except (ConnectionError, ssl.SSLError):
        pass
    except TimeoutError:
        return b"still open: " + data
    return data


async def test_idle_and_half_sent_connections_are_bounded_and_real_requests_still_served(
    scheduler: Scheduler,
) -> None:
    baseline_mb = scheduler.rss_mb()
    ctx = scheduler.client_ssl
    head = b"POST /webhook HTTP/1.1\r\nHost: x\r\nContent-Type: appl"
    body = b"POST /webhook HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"
    try:
        silent = [await _open_tcp(scheduler.service) for _ in range(SILENT)]  # no TLS ClientHello
        stalled = [await _open(scheduler.service, ctx, head) for _ in range(HALF_HEADS)]
        stalled += [await _open(scheduler.service, ctx, body) for _ in range(HALF_BODIES)]
        idle = await asyncio.gather(*(_open(scheduler.service, ctx) for _ in range(IDLE)))
        held = [r for r in [*stalled, *idle] if r is not None]
        peak_mb = scheduler.rss_mb()
        assert MAX_CONNECTIONS // 2 <= len(held) <= MAX_CONNECTIONS + 8, len(held)  # the rest refused

        # the loopback extender listener is not starved by a flood on the Service port
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"http://{scheduler.extender}/filter", json={"Pod": 1}) as resp,
        ):
            assert resp.status == 400 and "ExtenderArgs.Pod" in (await resp.json())["Error"]

        replies = await asyncio.gather(*(_closed_by_server(r) for r in [*held, *silent]))
        peak_mb = max(peak_mb, scheduler.rss_mb())
        assert peak_mb - baseline_mb < RSS_GROWTH_LIMIT_MB, (baseline_mb, peak_mb)
        # every stalled connection was closed by the server; a half-sent body is answered 408
        # first (a client may see the close before the answer: its reset discards what it had)
        assert not [r for r in replies if r.startswith(b"still open")], replies
        assert any(r.startswith(b"HTTP/1.1 408 ") for r in replies)
        assert all(r == b"" or r.startswith(b"HTTP/1.1 408 ") for r in replies)
    finally:
        for writer in _writers:
            writer.transport.abort()
        _writers.clear()

    async with (  # slots are free again: real requests are served
        aiohttp.ClientSession() as session,
        session.get(f"https://{scheduler.service}/healthz", ssl=ctx) as resp,
    ):
        assert resp.status == 200
    text = scheduler.log.read_text()
    assert "service listener: refused a connection from 127.0.0.1" in text
    assert f"no complete request within {TIMEOUT_S:g} s" in text
    assert f"body not received within {TIMEOUT_S:g} s" in text
    assert "TLS handshake with 127.0.0.1:" in text and f"longer than {TIMEOUT_S}" in text
    assert "Traceback" not in text
