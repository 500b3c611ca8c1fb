"""What the emulated API server counts and how slow its writes are: a request counter and etcd's latency.

``RequestStats`` is an aiohttp middleware. It counts every resource request by client (the
User-Agent up to its first ``/``, as kube-apiserver's audit log names it), verb and resource
(``pods``, ``pods/binding``, ``nodes/status``...), like ``apiserver_request_total``, and serves the
counts as JSON at ``GET /debug/requests`` (``DELETE`` resets them). With ``write_latency_s`` every
write (POST, PUT, PATCH, DELETE) waits that long before it is applied, without blocking any other
request: the time a real kube-apiserver spends committing to etcd, which a benchmark must see.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable

from aiohttp import web

WRITE_VERBS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
DEBUG_PATH = "/debug/requests"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def resource_of(path: str) -> str | None:
    """``pods``, ``pods/binding``, ``leases``... for a resource path; None for anything else."""
    parts = [p for p in path.split("/") if p]
    if parts[:2] == ["api", "v1"]:
        rest = parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        rest = parts[3:]
    else:
        return None
    if len(rest) >= 2 and rest[0] == "namespaces" and len(rest) > 2:
        rest = rest[2:]
    if not rest:
        return None
    return rest[0] if len(rest) < 3 else f"{rest[0]}/{rest[2]}"


def client_of(request: web.Request) -> str:
    agent = request.headers.get("User-Agent", "")
    return agent.split("/", 1)[0].strip() or "unknown"


class RequestStats:
    """The middleware and the debug endpoint; see the module docstring."""

    def __init__(self, *, write_latency_s: float = 0.0) -> None:
        if write_latency_s < 0:
            raise ValueError(f"write latency must be >= 0, got {write_latency_s}")
        self.write_latency_s = write_latency_s
        self.counts: collections.Counter[tuple[str, str, str]] = collections.Counter()

    def writes(self, *, client: str | None = None) -> int:
        return sum(
            n for (c, verb, _), n in self.counts.items() if verb in WRITE_VERBS and client in (None, c)
        )

    def snapshot(self) -> list[dict[str, object]]:
        return [
            {"client": c, "verb": verb, "resource": res, "count": n}
            for (c, verb, res), n in sorted(self.counts.items())
        ]

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path == DEBUG_PATH:
            if request.method == "DELETE":
                self.counts.clear()
            return web.json_response({"requests": self.snapshot()})
        resource = resource_of(request.path)
        if resource is not None:
            verb = request.method
            if verb == "GET" and request.query.get("watch", "").lower() in ("true", "1"):
                verb = "WATCH"
            self.counts[(client_of(request), verb, resource)] += 1
            if verb in WRITE_VERBS and self.write_latency_s > 0:
                await asyncio.sleep(self.write_latency_s)
        return await handler(request)
