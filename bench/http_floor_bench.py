"""What one HTTP exchange costs in CPU with the stack every process here runs (issue 12).

    .venv/bin/python -m bench.http_floor_bench [--requests 3000] [--servers app lowlevel raw app-tls]
        [--clients aiohttp offloaded]

A GPU pod's path through kube-scheduler has about three HTTP exchanges more than a plain pod's
(``/filter``, ``/bind``, the device plugin's bind-phase PATCH); this measures what each costs. For
each kind of server, in a process of its own:

- ``app``: an aiohttp ``web.Application`` with one route (what the vgpu-scheduler, the device
  plugin's endpoints and the emulated API server run);
- ``lowlevel``: aiohttp's low-level ``web.Server`` (no router, no middleware);
- ``raw``: a bare ``asyncio.Protocol`` that answers fixed bytes once a request's body is in (the
  event loop and the kernel, no HTTP library): the floor under any Python HTTP server;
- ``app-tls``: ``app`` over TLS, as the API server and the Service port speak it.

This process sends ``--requests`` PATCHes of a 250-byte JSON body over one keep-alive connection
with aiohttp's ``ClientSession`` (what ``AioKubeApi`` and the kube-scheduler emulation use) and
prints the CPU time (user + system) each side used per request, and the round trip's p50/p99.

``--clients offloaded`` sends the same PATCHes through ``vgpu.kube.offload.OffloadedKubeApi``
(``scheduler.apiWriter: process``): this process hands each to its helper process, which makes the
request; the line then also gives the helper's CPU per request. What the vgpu-scheduler's one core
pays per write is the client's figure.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import functools
import json
import pathlib
import ssl
import sys
import tempfile
import time

import aiohttp
from aiohttp import web
from vgpu.kube import aioapi, offload
from vgpu.localcluster import certs

from bench import percentile
from bench.procstat import cpu_seconds

SERVERS = ("app", "lowlevel", "raw", "app-tls")
CLIENTS = ("aiohttp", "offloaded")
WARMUP = 200
ANSWER = b'{"kind":"Pod","apiVersion":"v1","metadata":{"name":"p","namespace":"default"}}'
BODY = json.dumps({"metadata": {"annotations": {"hami.io/vgpu-devices-allocated": "x" * 200}}}).encode()


class _RawHttp(asyncio.Protocol):
    """Answers every complete request (headers, then Content-Length bytes) with ``ANSWER``."""

    def __init__(self) -> None:
        self._buffer = b""
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        while (end := self._buffer.find(b"\r\n\r\n")) >= 0:
            length = 0
            for line in self._buffer[:end].split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            if len(self._buffer) < end + 4 + length:
                return
            self._buffer = self._buffer[end + 4 + length :]
            assert self._transport is not None
            self._transport.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                % (len(ANSWER), ANSWER)
            )


async def _answer(request: web.BaseRequest) -> web.Response:
    await request.read()
    return web.Response(body=ANSWER, content_type="application/json")


async def serve(kind: str, cert_dir: pathlib.Path | None) -> None:
    """Listen on a free loopback port, print it on stdout, serve until killed."""
    tls = None
    if cert_dir is not None:
        tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        tls.load_cert_chain(cert_dir / "tls.crt", cert_dir / "tls.key")
    if kind == "raw":
        server = await asyncio.get_running_loop().create_server(_RawHttp, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
    else:
        handler: web.Application | web.Server
        if kind == "lowlevel":
            handler = web.Server(_answer, access_log=None)
            runner: web.BaseRunner = web.ServerRunner(handler)
        else:
            handler = web.Application()
            handler.router.add_route("*", "/{tail:.*}", _answer)
            runner = web.AppRunner(handler, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls)
        await site.start()
        port = runner.addresses[0][1]
    print(port, flush=True)
    await asyncio.Event().wait()


async def measure(
    kind: str, *, requests: int, cert_dir: pathlib.Path, client: str = "aiohttp"
) -> dict[str, float]:
    """One server process of ``kind``; the client's (and its helper's) and the server's CPU per
    request, the round trip."""
    tls = kind.endswith("-tls")
    args = ["--serve", kind, *(["--certs", str(cert_dir)] if tls else [])]
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.http_floor_bench", *args, stdout=asyncio.subprocess.PIPE
    )
    try:
        assert child.stdout is not None
        port = int(await child.stdout.readline())
        base = f"{'https' if tls else 'http'}://127.0.0.1:{port}"
        ca_file = str(cert_dir / "ca.pem") if tls else None
        async with contextlib.AsyncExitStack() as stack:
            helper: offload.OffloadedKubeApi | None = None
            if client == "offloaded":
                make = functools.partial(aioapi.AioKubeApi, base, ca_file=ca_file)
                helper = await stack.enter_async_context(offload.OffloadedKubeApi(make(), make))
                await helper.start()
                patch = json.loads(BODY)

                async def one() -> None:
                    assert helper is not None
                    await helper.merge_patch("pods", "p", patch, namespace="default")

            else:
                trust = ssl.create_default_context(cafile=ca_file) if ca_file else False
                session = await stack.enter_async_context(
                    aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, ssl=trust))
                )
                url = f"{base}/api/v1/namespaces/default/pods/p"
                headers = {"Content-Type": "application/merge-patch+json"}

                async def one() -> None:
                    async with session.patch(url, data=BODY, headers=headers) as resp:
                        if resp.status != 200:
                            raise RuntimeError(f"{kind}: HTTP {resp.status}")
                        await resp.read()

            for _ in range(WARMUP):
                await one()
            helper_pid = helper.writer_pid if helper is not None else None
            client_before, server_before = cpu_seconds(None), cpu_seconds(child.pid)
            helper_before = cpu_seconds(helper_pid) if helper_pid else 0.0
            rounds = []
            for _ in range(requests):
                started = time.perf_counter()
                await one()
                rounds.append(time.perf_counter() - started)
            client_cpu = cpu_seconds(None) - client_before
            server_cpu = cpu_seconds(child.pid) - server_before
            helper_cpu = cpu_seconds(helper_pid) - helper_before if helper_pid else 0.0
    finally:
        child.kill()
        await child.wait()
    return {
        "client_us": client_cpu / requests * 1e6,
        "helper_us": helper_cpu / requests * 1e6,
        "server_us": server_cpu / requests * 1e6,
        "p50_ms": percentile.pct(rounds, 0.50) * 1000,
        "p99_ms": percentile.pct(rounds, 0.99) * 1000,
    }


async def main_async(opts: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="vgpu-http-floor-") as tmp:
        cert_dir = pathlib.Path(tmp)
        certs.make_serving_certs(cert_dir, now=datetime.datetime.now(datetime.UTC))
        print(
            f"http floor: {opts.requests} PATCHes of {len(BODY)} bytes per server, one keep-alive connection"
        )
        for client in opts.clients:
            for kind in opts.servers:
                got = await measure(kind, requests=opts.requests, cert_dir=cert_dir, client=client)
                helper = f"  its helper's {got['helper_us']:6.1f}" if client == "offloaded" else ""
                print(
                    f"{kind:<9} {client:<9} client CPU {got['client_us']:6.1f} us/request{helper}  server CPU "
                    f"{got['server_us']:6.1f} us/request  round trip p50 {got['p50_ms']:.3f} ms  "
                    f"p99 {got['p99_ms']:.3f} ms",
                    flush=True,
                )
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000, help="measured requests per server")
    parser.add_argument("--servers", nargs="+", choices=SERVERS, default=list(SERVERS))
    parser.add_argument("--clients", nargs="+", choices=CLIENTS, default=["aiohttp"])
    parser.add_argument("--serve", choices=SERVERS, help=argparse.SUPPRESS)  # the server process
    parser.add_argument("--certs", type=pathlib.Path, help=argparse.SUPPRESS)
    opts = parser.parse_args(argv)
    if opts.requests < 1:
        parser.error("--requests must be at least 1")
    return opts


def main() -> int:
    opts = parse_args()
    if opts.serve:
        asyncio.run(serve(opts.serve, opts.certs))
        return 0
    return asyncio.run(main_async(opts))


if __name__ == "__main__":
    sys.exit(main())
