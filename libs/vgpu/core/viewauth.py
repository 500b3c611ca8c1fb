"""Who may read the live views: bearer tokens checked by the cluster, as pure functions (issue 49).

The scheduler's ``/metrics`` and dashboard (``/ui``, ``/ui/state``, ``/ui/events``) list every GPU
pod of every namespace. With ``scheduler.viewsAuth: kubernetes`` a request for them must carry
``Authorization: Bearer <token>``; the scheduler asks the API server who the token is (a
TokenReview, ``authentication.k8s.io/v1``) and whether that user may ``get`` the path (a
SubjectAccessReview, ``authorization.k8s.io/v1``, with ``nonResourceAttributes``), as
kube-rbac-proxy and metrics-server do. RBAC grants it with a ClusterRole rule
``nonResourceURLs: ["/metrics", "/ui", "/ui/*"], verbs: ["get"]`` (the chart ships one).

This module builds the review bodies, reads the answers (garbage is refused, never allowed) and
keeps recent verdicts (``Verdicts``: a token's verdict for a path for ``ttl_s``, at most
``max_entries``; keyed by the token's SHA-256, so tokens are not kept). The adapter
(``vgpu_scheduler/viewaccess.py``) makes the calls.
"""

from __future__ import annotations

import enum
import hashlib
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

PROTECTED_PATHS = frozenset({"/metrics", "/ui", "/ui/state", "/ui/events"})
VERB = "get"
TTL_S = 10.0  # how long a verdict is reused (metrics-server's delegated authn/authz caches: 10 s)
MAX_ENTRIES = 4096


class Verdict(enum.StrEnum):
    ALLOWED = "allowed"
    UNAUTHENTICATED = "unauthenticated"  # no token, or the API server does not know it: 401
    FORBIDDEN = "forbidden"  # a known user without the RBAC grant: 403


@dataclass(frozen=True)
class User:
    """What a TokenReview says about a token (``status.user``)."""

    username: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


class BadReview(Exception):
    """An answer that is not a review of the expected shape; the message says where."""


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header (scheme case-insensitive); None
    for none, another scheme, or an empty or space-holding token."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or len(token.split()) != 1:  # (split: C speed on a 1 KB JWT)
        return None
    return token


def token_review(token: str) -> dict[str, Any]:
    """The TokenReview to create for ``token`` (no audiences: the API server's own)."""
    return {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}}


def _status(review: Any, kind: str) -> Mapping[str, Any]:
    if not isinstance(review, Mapping):
        raise BadReview(f"{kind}: expected an object")
    status = review.get("status")
    if status is None:
        return {}
    if not isinstance(status, Mapping):
        raise BadReview(f"{kind}.status: expected an object")
    return status


def user_of(review: Any) -> User | None:
    """The user a created TokenReview names, None when ``status.authenticated`` is not true;
    BadReview for an answer of another shape."""
    status = _status(review, "TokenReview")
    if status.get("authenticated") is not True:
        return None
    user = status.get("user")
    if not isinstance(user, Mapping):
        raise BadReview("TokenReview.status.user: expected an object")
    username, uid = user.get("username"), user.get("uid", "")
    groups, extra = user.get("groups") or [], user.get("extra") or {}
    if not isinstance(username, str) or not username:
        raise BadReview("TokenReview.status.user.username: expected a non-empty string")
    if not isinstance(uid, str):
        raise BadReview("TokenReview.status.user.uid: expected a string")
    if not isinstance(groups, list) or not all(isinstance(g, str) for g in groups):
        raise BadReview("TokenReview.status.user.groups: expected a list of strings")
    if not isinstance(extra, Mapping) or not all(
        isinstance(k, str) and isinstance(v, list) and all(isinstance(s, str) for s in v)
        for k, v in extra.items()
    ):
        raise BadReview("TokenReview.status.user.extra: expected a map of string lists")
    return User(username, uid, tuple(groups), {k: tuple(v) for k, v in extra.items()})


def access_review(user: User, path: str) -> dict[str, Any]:
    """The SubjectAccessReview asking whether ``user`` may ``get`` the non-resource URL ``path``."""
    spec: dict[str, Any] = {
        "user": user.username,
        "groups": list(user.groups),
        "nonResourceAttributes": {"path": path, "verb": VERB},
    }
    if user.uid:
        spec["uid"] = user.uid
    if user.extra:
        spec["extra"] = {k: list(v) for k, v in user.extra.items()}
    return {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec}


def allowed(review: Any) -> bool:
    """Whether a created SubjectAccessReview allows (``status.allowed`` true and not ``denied``)."""
    status = _status(review, "SubjectAccessReview")
    return status.get("allowed") is True and status.get("denied") is not True


def token_key(token: str) -> str:
    """What ``Verdicts`` keys a token by: its SHA-256 (the token itself is not kept)."""
    return hashlib.sha256(token.encode()).hexdigest()


class Verdicts:
    """Recent verdicts per (token key, path), each good for ``ttl_s``; the oldest go beyond
    ``max_entries``. Time is a parameter (``now``, seconds on any monotonic scale)."""

    def __init__(self, *, ttl_s: float = TTL_S, max_entries: int = MAX_ENTRIES) -> None:
        if ttl_s < 0 or max_entries < 1:
            raise ValueError("ttl_s must be >= 0 and max_entries >= 1")
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._entries: OrderedDict[tuple[str, str], tuple[Verdict, str, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str, path: str, *, now: float) -> tuple[Verdict, str] | None:
        """(verdict, username) while fresh; None when unknown or expired."""
        entry = self._entries.get((key, path))
        if entry is None:
            return None
        verdict, username, expires = entry
        if now >= expires:
            del self._entries[(key, path)]
            return None
        return verdict, username

    def put(self, key: str, path: str, verdict: Verdict, username: str, *, now: float) -> None:
        self._entries[(key, path)] = (verdict, username, now + self.ttl_s)
        self._entries.move_to_end((key, path))
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
