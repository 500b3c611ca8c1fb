"""Dashboard event streams held by clients that never read: when does a new client get a place?

``--clients`` raw sockets (16: every place) each ask for ``/ui/events`` and then read nothing; the
frames are small (an empty cluster), so the server's writes land in the socket buffers and never
stall. A new client then asks for ``/ui/events`` once a second until it is answered 200; the time
from the first idle client to that answer is printed. The dashboard runs with its defaults
(``ui.MAX_STREAM_S``, the write timeout, the keep-alive) unless ``--max-stream-s`` is given.

    .venv/bin/python -m bench.idle_streams_bench [--clients 16] [--max-stream-s S] [--give-up-s 300]
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import time
from typing import Any

import aiohttp
from aiohttp import web
from vgpu.core.config import Config
from vgpu_scheduler import routes, ui
from vgpu_scheduler.pending import FilterReasons
from vgpu_scheduler.state import ClusterState


async def run(clients: int, max_stream_s: float | None, give_up_s: float) -> None:
    options: dict[str, Any] = {"max_clients": clients}
    if max_stream_s is not None:
        options["max_stream_s"] = max_stream_s
    board = ui.Dashboard(ClusterState(Config(), clock=time.time), FilterReasons(), **options)
    app = web.Application()
    app[ui.DASHBOARD] = board
    for method, path, handler in routes.SERVICE_ROUTES:
        if path.startswith("/ui"):
            app.router.add_route(method, path, handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    loop = asyncio.get_running_loop()
    idle: list[socket.socket] = []
    started = time.monotonic()
    try:
        for _ in range(clients):
            sock = socket.socket()
            sock.setblocking(False)
            idle.append(sock)
            await loop.sock_connect(sock, ("127.0.0.1", port))
            await loop.sock_sendall(sock, b"GET /ui/events HTTP/1.1\r\nHost: bench\r\n\r\n")
            await loop.sock_recv(sock, 12)  # the status line; nothing more is read
        refused = 0
        async with aiohttp.ClientSession() as session:
            while time.monotonic() - started < give_up_s:
                async with session.get(f"http://127.0.0.1:{port}/ui/events") as resp:
                    if resp.status == 200:
                        print(
                            f"{clients} idle clients: a new client got a place after "
                            f"{time.monotonic() - started:.1f} s ({refused} refusals, one try a second)"
                        )
                        return
                    refused += 1
                await asyncio.sleep(1.0)
        print(
            f"{clients} idle clients: a new client still refused after {give_up_s:g} s ({refused} refusals)"
        )
    finally:
        for sock in idle:
            sock.close()
        await board.aclose()
        await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=ui.MAX_CLIENTS)
    parser.add_argument("--max-stream-s", type=float, default=None)
    parser.add_argument("--give-up-s", type=float, default=300.0)
    args = parser.parse_args()
    asyncio.run(run(args.clients, args.max_stream_s, args.give_up_s))


if __name__ == "__main__":
    main()
