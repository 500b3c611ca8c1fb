"""The live views behind the cluster's authentication and authorization (``scheduler.viewsAuth``).

An aiohttp middleware on the Service port. A request for one of ``viewauth.PROTECTED_PATHS``
(``/metrics``, ``/ui``, ``/ui/state``, ``/ui/events``) must carry ``Authorization: Bearer <token>``:

* no token, or one the API server does not authenticate (TokenReview) → 401 with
  ``WWW-Authenticate: Bearer``;
* a user RBAC does not allow to ``get`` the path (SubjectAccessReview, ``nonResourceAttributes``)
  → 403 naming the user and the path;
* the API server cannot answer (an error, no answer within ``timeout_s``, a reply that is not a
  review) → 503 with ``Retry-After``; nothing is remembered, the next request asks again.

Verdicts are reused for ``viewauth.TTL_S`` (``viewauth.Verdicts``), so a Prometheus scrape or a
dashboard reload costs no API call; at most ``max_concurrent`` reviews are in flight at once (a
flood of made-up tokens waits for them instead of flooding the API server). The reviews are API
calls through the ``Reviewer`` port (``KubeReviewer``: the scheduler's ``KubeApi``, whose
adapters never block the event loop). Every other path (``/healthz``, ``/readyz``, ``/webhook``)
passes untouched.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

from aiohttp import web
from vgpu.core import errors, viewauth
from vgpu.kube.port import JsonObj, KubeApi

log = logging.getLogger(__name__)

TIMEOUT_S = 5.0  # one review's answer; beyond it the request gets 503
MAX_CONCURRENT = 8  # reviews in flight at once

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Reviewer(Protocol):
    """Creates the two reviews and returns the API server's answer (the created object)."""

    async def review_token(self, body: JsonObj) -> JsonObj: ...

    async def review_access(self, body: JsonObj) -> JsonObj: ...


class KubeReviewer:
    """``Reviewer`` over the scheduler's ``KubeApi`` (RBAC: create tokenreviews and
    subjectaccessreviews, as the ClusterRole ``system:auth-delegator`` grants)."""

    def __init__(self, api: KubeApi) -> None:
        self._api = api

    async def review_token(self, body: JsonObj) -> JsonObj:
        return await self._api.create("tokenreviews", body)

    async def review_access(self, body: JsonObj) -> JsonObj:
        return await self._api.create("subjectaccessreviews", body)


class Unavailable(Exception):
    """The API server could not say (the message says why)."""


class ViewAccess:
    """See the module docstring; ``middleware`` goes into the Service app."""

    def __init__(
        self,
        reviewer: Reviewer,
        *,
        clock: Callable[[], float] = time.monotonic,
        ttl_s: float = viewauth.TTL_S,
        timeout_s: float = TIMEOUT_S,
        max_concurrent: int = MAX_CONCURRENT,
    ) -> None:
        self._reviewer = reviewer
        self._clock = clock
        self._timeout_s = timeout_s
        self._slots = asyncio.Semaphore(max_concurrent)
        self.verdicts = viewauth.Verdicts(ttl_s=ttl_s)
        self.reviews = 0  # TokenReviews and SubjectAccessReviews made (tests, /metrics)

    async def check(self, authorization: str | None, path: str) -> tuple[viewauth.Verdict, str]:
        """(verdict, username) for a request with that ``Authorization`` header; ``Unavailable``."""
        token = viewauth.bearer_token(authorization)
        if token is None:
            return viewauth.Verdict.UNAUTHENTICATED, ""
        key = viewauth.token_key(token)
        known = self.verdicts.get(key, path, now=self._clock())
        if known is not None:
            return known
        verdict, username = await self._review(token, path)
        self.verdicts.put(key, path, verdict, username, now=self._clock())
        return verdict, username

    async def _review(self, token: str, path: str) -> tuple[viewauth.Verdict, str]:
        try:
            async with self._slots, asyncio.timeout(self._timeout_s):
                self.reviews += 1
                user = viewauth.user_of(await self._reviewer.review_token(viewauth.token_review(token)))
                if user is None:
                    return viewauth.Verdict.UNAUTHENTICATED, ""
                self.reviews += 1
                answer = await self._reviewer.review_access(viewauth.access_review(user, path))
                ok = viewauth.allowed(answer)
                return (viewauth.Verdict.ALLOWED if ok else viewauth.Verdict.FORBIDDEN), user.username
        except TimeoutError:
            raise Unavailable(f"no answer from the API server within {self._timeout_s:g} s") from None
        except errors.KubeError as exc:
            raise Unavailable(f"the API server refused the review: {exc}") from None
        except viewauth.BadReview as exc:
            raise Unavailable(f"the API server's answer is not a review: {exc}") from None

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        path = request.path
        if path not in viewauth.PROTECTED_PATHS:
            return await handler(request)
        try:
            verdict, username = await self.check(request.headers.get("Authorization"), path)
        except Unavailable as exc:
            log.warning("cannot check the bearer token of a request for %s: %s", path, exc)
            return web.Response(
                status=503, text=f"cannot check the token: {exc}; try again", headers={"Retry-After": "5"}
            )
        if verdict is viewauth.Verdict.UNAUTHENTICATED:
            return web.Response(
                status=401,
                text=f"{path} needs a bearer token the Kubernetes API server authenticates "
                "(Authorization: Bearer <token>; docs/install.md, the live views)",
                headers={"WWW-Authenticate": 'Bearer realm="kube-vgpu"'},
            )
        if verdict is viewauth.Verdict.FORBIDDEN:
            return web.Response(
                status=403,
                text=f"{username} may not get {path}: grant it the nonResourceURLs rule of the chart's "
                "views ClusterRole (docs/install.md, the live views)",
            )
        return await handler(request)
