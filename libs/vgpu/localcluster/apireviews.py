"""TokenReview and SubjectAccessReview on the local API server, enough for the scheduler's views.

``POST /apis/authentication.k8s.io/v1/tokenreviews``: ``status.authenticated`` and ``status.user``
(the userInfo that ``server.auth`` maps the token to; the server's own ``token`` is
``admission.DEFAULT_USER``), as kube-apiserver answers it. ``POST
/apis/authorization.k8s.io/v1/subjectaccessreviews``: ``status.allowed`` for non-resource
attributes, from ``grants``, a stand-in for RBAC: subject (a username, or ``group:<name>``) to
the nonResourceURLs it may ``get`` (RBAC's matching: exact, or a prefix ending in ``*``).
Members of ``system:masters`` may do anything, as upstream. Resource attributes are answered
``allowed: false`` (no RBAC here). A body that is not such a review is a 400 Status. Any
authenticated caller may create reviews (upstream: the ``system:auth-delegator`` ClusterRole).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from aiohttp import web

from vgpu.kube.port import JsonObj
from vgpu.localcluster.apiauth import BearerAuth
from vgpu.localcluster.apipaths import status_body

TOKEN_REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
MASTERS = "system:masters"


def url_matches(pattern: str, path: str) -> bool:
    """RBAC's nonResourceURLs match: ``*`` everything, ``/x/*`` a prefix, else the exact path."""
    if pattern == "*":
        return True
    if pattern.endswith("*"):
        return path.startswith(pattern[:-1])
    return path == pattern


class Reviews:
    """The two review endpoints; ``grants`` may be changed while serving."""

    def __init__(self, auth: BearerAuth, *, grants: Mapping[str, Sequence[str]] | None = None) -> None:
        self._auth = auth
        self.grants: dict[str, list[str]] = {k: list(v) for k, v in (grants or {}).items()}

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post(TOKEN_REVIEWS, self.token_review)
        app.router.add_post(ACCESS_REVIEWS, self.access_review)

    def may_get(self, user: str, groups: Sequence[str], path: str) -> bool:
        if MASTERS in groups:
            return True
        subjects = [user, *(f"group:{g}" for g in groups)]
        return any(url_matches(p, path) for s in subjects for p in self.grants.get(s, ()))

    async def token_review(self, request: web.Request) -> web.Response:
        body = await _review_body(request, "TokenReview")
        if isinstance(body, web.Response):
            return body
        token = body["spec"].get("token")
        if not isinstance(token, str) or not token:
            return _bad("TokenReview spec.token: expected a non-empty string")
        user = self._auth.user_of_token(token)
        status: JsonObj = {"authenticated": user is not None}
        if user is not None:
            status["user"] = dict(user)
            status["audiences"] = ["https://kubernetes.default.svc"]
        return web.json_response({**body, "status": status}, status=201)

    async def access_review(self, request: web.Request) -> web.Response:
        body = await _review_body(request, "SubjectAccessReview")
        if isinstance(body, web.Response):
            return body
        spec = body["spec"]
        user, groups = spec.get("user", ""), spec.get("groups") or []
        if (
            not isinstance(user, str)
            or not isinstance(groups, list)
            or not all(isinstance(g, str) for g in groups)
        ):
            return _bad(
                "SubjectAccessReview spec.user and spec.groups: expected a string and a list of strings"
            )
        attributes = spec.get("nonResourceAttributes")
        allowed = MASTERS in groups
        if not allowed and isinstance(attributes, Mapping):
            path, verb = attributes.get("path"), attributes.get("verb")
            allowed = verb == "get" and isinstance(path, str) and self.may_get(user, groups, path)
        status: JsonObj = {"allowed": allowed}
        if not allowed:
            status["reason"] = "no grant in the local cluster's reviews"
        return web.json_response({**body, "status": status}, status=201)


async def _review_body(request: web.Request, kind: str) -> dict[str, Any] | web.Response:
    try:
        body = await request.json()
    except ValueError:
        return _bad(f"{kind}: the body is not JSON")
    if not isinstance(body, dict) or body.get("kind") != kind or not isinstance(body.get("spec"), dict):
        return _bad(f"expected a {kind} with a spec")
    return body


def _bad(message: str) -> web.Response:
    return web.json_response(status_body(400, message, reason="BadRequest"), status=400)
