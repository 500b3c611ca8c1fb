"""The kube-scheduler emulation's extender client keeps connections as Go's transport does for
kube-scheduler: a connection per call in flight, at most two kept idle once given back. A real
kube-scheduler therefore dials for many /filter calls while binds are in flight; so must this."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web
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
