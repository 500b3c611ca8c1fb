"""Who is calling the local API server: bearer-token authentication, as an aiohttp middleware.

``BearerAuth(token=..., users=...)``: with neither, every caller is ``admission.DEFAULT_USER``.
A request carrying ``Authorization: Bearer <token>`` is ``DEFAULT_USER`` for ``token`` and the
``userInfo`` (username, groups) ``users`` maps it to otherwise; any other token, or none, is a 401
``Unauthorized`` Status. The caller's userInfo is kept on the request under ``USER``, for the
admission webhooks to be told. Both attributes may be changed while serving (a rotated token).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiohttp import web

from vgpu.kube.port import JsonObj
from vgpu.localcluster import admission
from vgpu.localcluster.apipaths import status_body

USER = web.RequestKey("user", dict)


class BearerAuth:
    """The bearer tokens the server accepts, and the middleware that checks them."""

    def __init__(self, *, token: str | None = None, users: Mapping[str, JsonObj] | None = None) -> None:
        self.token = token
        self.users: dict[str, JsonObj] = dict(users or {})

    def authenticate(self, request: web.Request) -> JsonObj | None:
        """The caller's userInfo, or None when its bearer token is unknown (a 401)."""
        if self.token is None and not self.users:
            return admission.DEFAULT_USER
        header = request.headers.get("Authorization", "")
        if not header.startswith("Bearer "):
            return None
        return self.user_of_token(header.removeprefix("Bearer "))

    def user_of_token(self, token: str) -> JsonObj | None:
        """The userInfo ``token`` stands for, None when unknown (also what a TokenReview says)."""
        if self.token is not None and token == self.token:
            return admission.DEFAULT_USER
        return self.users.get(token)

    @web.middleware
    async def middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        user = self.authenticate(request)
        if user is None:
            return web.json_response(status_body(401, "Unauthorized"), status=401)
        request[USER] = user
        result: web.StreamResponse = await handler(request)
        return result
