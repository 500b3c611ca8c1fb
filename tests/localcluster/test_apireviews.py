"""TokenReview and SubjectAccessReview on the local API server (apireviews.py), over HTTP."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest
from vgpu.localcluster import apireviews
from vgpu.localcluster.apiserver import ApiServer
from vgpu.localcluster.store import Store

ALICE = {"username": "alice", "groups": ["team-a", "system:authenticated"]}


async def _post(server: ApiServer, path: str, body: Any, token: str = "admin") -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session:
        headers = {"Authorization": f"Bearer {token}"}
        async with session.post(server.url + path, json=body, headers=headers) as resp:
            return resp.status, await resp.json()


def _access(user: str, groups: list[str], path: str, verb: str = "get") -> dict[str, Any]:
    spec = {"user": user, "groups": groups, "nonResourceAttributes": {"path": path, "verb": verb}}
    return {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec}


async def test_token_reviews_name_the_tokens_user() -> None:
    async with ApiServer(Store(), token="admin", users={"tok-alice": ALICE}) as server:
        review: dict[str, Any] = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": "tok-alice"},
        }
        status, body = await _post(server, apireviews.TOKEN_REVIEWS, review)
        assert status == 201 and body["status"]["authenticated"] is True
        assert body["status"]["user"] == ALICE
        review["spec"]["token"] = "nope"
        status, body = await _post(server, apireviews.TOKEN_REVIEWS, review)
        assert body["status"] == {"authenticated": False}


@pytest.mark.parametrize(
    ("user", "groups", "path", "verb", "allowed"),
    [
        ("alice", ["team-a"], "/metrics", "get", True),
        ("alice", ["team-a"], "/ui/events", "get", True),
        ("alice", ["team-a"], "/ui", "get", False),  # "/ui/*" does not match "/ui"
        ("alice", ["team-a"], "/metrics", "post", False),
        ("bob", ["viewers"], "/ui", "get", True),
        ("bob", [], "/ui", "get", False),
        ("root", ["system:masters"], "/anything", "delete", True),
    ],
    ids=["exact", "prefix", "prefix-not-bare", "verb", "group", "no-grant", "masters"],
)
async def test_access_reviews_follow_the_grants(user, groups, path, verb, allowed) -> None:
    async with ApiServer(Store(), token="admin") as server:
        server.reviews.grants.update({"alice": ["/metrics", "/ui/*"], "group:viewers": ["/ui"]})
        status, body = await _post(server, apireviews.ACCESS_REVIEWS, _access(user, groups, path, verb))
        assert status == 201 and body["status"]["allowed"] is allowed


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (apireviews.TOKEN_REVIEWS, [1]),
        (apireviews.TOKEN_REVIEWS, {"kind": "TokenReview", "spec": {"token": 5}}),
        (apireviews.TOKEN_REVIEWS, {"kind": "SubjectAccessReview", "spec": {}}),
        (apireviews.ACCESS_REVIEWS, {"kind": "SubjectAccessReview", "spec": {"user": "u", "groups": "g"}}),
        (apireviews.ACCESS_REVIEWS, {"kind": "SubjectAccessReview"}),
    ],
    ids=["not-an-object", "token-not-a-string", "wrong-kind", "groups-not-a-list", "no-spec"],
)
async def test_garbage_reviews_are_400(path: str, body: Any) -> None:
    async with ApiServer(Store(), token="admin") as server:
        status, answer = await _post(server, path, body)
        assert status == 400 and answer["kind"] == "Status" and answer["code"] == 400


async def test_reviews_need_an_authenticated_caller() -> None:
    async with ApiServer(Store(), token="admin") as server:
        status, _ = await _post(server, apireviews.ACCESS_REVIEWS, _access("u", [], "/metrics"), token="x")
        assert status == 401
