"""An emulated API server that holds chosen requests until a gate opens: a slow or hung API server.

``GatedApiServer(store, hold=predicate)`` answers every request whose (method, path, query) the
predicate accepts only after ``gate`` is set; ``held`` counts the requests waiting there and
``arrived`` is set when the first one arrives (tests wait on it, never on time).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from aiohttp import web
from vgpu.localcluster.apiserver import ApiServer
from vgpu.localcluster.store import Store

Hold = Callable[[str, str, str], bool]


def events_posts(method: str, path: str, query: str) -> bool:
    return method == "POST" and path.endswith("/events")


class GatedApiServer(ApiServer):
    def __init__(self, store: Store, *, hold: Hold) -> None:
        super().__init__(store, host="127.0.0.1", port=0)
        self._hold = hold
        self.gate = asyncio.Event()
        self.arrived = asyncio.Event()  # the first held request arrived
        self.another = asyncio.Event()  # set at every held arrival (clear it, then wait)
        self.held = 0
        self.passed_gate = 0

    async def _resource(self, request: web.Request) -> web.StreamResponse:
        if not self.gate.is_set() and self._hold(request.method, request.path, request.query_string):
            self.held += 1
            self.arrived.set()
            self.another.set()
            try:
                await self.gate.wait()
            finally:
                self.held -= 1
            self.passed_gate += 1
        return await super()._resource(request)
