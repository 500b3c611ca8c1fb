"""The live views behind the cluster's authentication and authorization (issue 49).

End to end: the scheduler with the default config (``viewsAuth: kubernetes``) against the local API
server over HTTP, which answers TokenReview and SubjectAccessReview from its bearer tokens and
grants; ``/metrics`` and the dashboard need a token RBAC allows, ``/healthz`` and ``/readyz`` do
not. Then the middleware alone with a fake reviewer: verdicts reused for their TTL, an API server
that cannot answer is a 503 that is not remembered, garbage answers are never an allow.
"""

from __future__ import annotations

import asyncio
import pathlib
from typing import Any

import pytest
from aiohttp import ClientSession, web
from vgpu.core import config, errors, viewauth
from vgpu.kube import client as kube_client
from vgpu.localcluster.cluster import LocalCluster
from vgpu_scheduler import viewaccess
from vgpu_scheduler.app import SchedulerService

SCHEDULER: dict[str, Any] = {
    "username": "system:serviceaccount:kube-vgpu:scheduler",
    "groups": ["system:serviceaccounts"],
}
VIEWER: dict[str, Any] = {
    "username": "system:serviceaccount:monitoring:prometheus",
    "groups": ["system:serviceaccounts"],
}
ALICE: dict[str, Any] = {"username": "alice", "groups": ["system:authenticated"]}
USERS = {"tok-scheduler": SCHEDULER, "tok-viewer": VIEWER, "tok-alice": ALICE}
VIEWS = ["/metrics", "/ui", "/ui/state", "/ui/events"]


async def _status(session: ClientSession, url: str, token: str | None) -> int:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with session.get(url, headers=headers) as resp:
        return resp.status


@pytest.mark.parametrize("path", VIEWS)
async def test_the_views_need_a_token_the_cluster_authorizes(tmp_path: pathlib.Path, path: str) -> None:
    cfg = config.load({})
    assert cfg.scheduler.views_auth is config.ViewsAuth.KUBERNETES  # the default
    async with LocalCluster({"nodes": [{"name": "n1", "gpus": []}]}, users=USERS) as cluster:
        cluster.server.reviews.grants["system:serviceaccount:monitoring:prometheus"] = ["/metrics", "/ui*"]
        kubeconfig = cluster.server.write_kubeconfig(tmp_path / "kubeconfig", token="tok-scheduler")
        api = kube_client.aio_from_kubeconfig(str(kubeconfig), user_agent="test")
        service = SchedulerService(cfg, api)
        try:
            address = await service.start(host="127.0.0.1", port=0)
            await service.wait_ready()
            base = f"http://{address}"
            async with ClientSession() as session:
                assert await _status(session, base + path, None) == 401
                assert await _status(session, base + path, "made-up") == 401
                assert await _status(session, base + path, "tok-alice") == 403
                headers = {"Authorization": "Bearer tok-viewer"}
                async with session.get(base + path, headers=headers) as resp:
                    assert resp.status == 200
                    if path == "/ui/events":
                        assert (await resp.content.readuntil(b"\n\n")).startswith(b"retry: ")
                for open_path in ("/healthz", "/readyz"):
                    assert await _status(session, base + open_path, None) == 200
            assert service.services.views is not None and service.services.views.reviews >= 4
        finally:
            await service.stop()
            await api.close()


async def test_the_401_and_403_say_what_is_missing(tmp_path: pathlib.Path) -> None:
    async with LocalCluster({"nodes": [{"name": "n1", "gpus": []}]}, users=USERS) as cluster:
        kubeconfig = cluster.server.write_kubeconfig(tmp_path / "kubeconfig", token="tok-scheduler")
        api = kube_client.aio_from_kubeconfig(str(kubeconfig), user_agent="test")
        service = SchedulerService(config.load({}), api)
        try:
            address = await service.start(host="127.0.0.1", port=0)
            async with ClientSession() as session:
                async with session.get(f"http://{address}/ui/state") as resp:
                    assert resp.headers["WWW-Authenticate"] == 'Bearer realm="kube-vgpu"'
                    assert "needs a bearer token" in await resp.text()
                headers = {"Authorization": "Bearer tok-alice"}
                async with session.get(f"http://{address}/ui/state", headers=headers) as resp:
                    assert resp.status == 403
                    assert (await resp.text()).startswith("alice may not get /ui/state: ")
        finally:
            await service.stop()
            await api.close()


# --- the middleware with a fake reviewer --------------------------------------------------------


class FakeReviewer:
    """Answers from ``users`` (token -> userInfo) and ``allowed`` (usernames); counts the calls."""

    def __init__(self, *, users: dict[str, Any], allowed: set[str]) -> None:
        self.users = users
        self.allowed = allowed
        self.token_answer: Any = None  # replaces the TokenReview answer when set
        self.fail: Exception | None = None
        self.hold: asyncio.Event | None = None  # when set, reviews wait for it
        self.calls = 0
        self.in_flight = 0
        self.most_in_flight = 0
        self.two_in_flight = asyncio.Event()

    async def review_token(self, body: dict[str, Any]) -> dict[str, Any]:
        self.calls += 1
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        if self.in_flight >= 2:
            self.two_in_flight.set()
        try:
            if self.hold is not None:
                await self.hold.wait()
            if self.fail is not None:
                raise self.fail
            if self.token_answer is not None:
                return dict(self.token_answer)
            user = self.users.get(body["spec"]["token"])
            return {"status": {"authenticated": True, "user": user} if user else {"authenticated": False}}
        finally:
            self.in_flight -= 1

    async def review_access(self, body: dict[str, Any]) -> dict[str, Any]:
        self.calls += 1
        return {"status": {"allowed": body["spec"]["user"] in self.allowed}}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def _app_client(aiohttp_client: Any, access: viewaccess.ViewAccess) -> Any:
    async def ok(_: web.Request) -> web.Response:
        return web.Response(text="view")

    app = web.Application(middlewares=[access.middleware])
    for path in ("/metrics", "/ui/state", "/healthz"):
        app.router.add_get(path, ok)
    return await aiohttp_client(app)


async def test_verdicts_are_reused_for_their_ttl_then_asked_again(aiohttp_client: Any) -> None:
    reviewer = FakeReviewer(users={"t": VIEWER, "a": ALICE}, allowed={VIEWER["username"]})
    clock = Clock()
    access = viewaccess.ViewAccess(reviewer, clock=clock, ttl_s=10)
    client = await _app_client(aiohttp_client, access)
    for _ in range(3):
        assert (await client.get("/metrics", headers={"Authorization": "Bearer t"})).status == 200
        assert (await client.get("/metrics", headers={"Authorization": "Bearer a"})).status == 403
    assert reviewer.calls == 4  # one TokenReview and one SubjectAccessReview per token
    assert (await client.get("/ui/state", headers={"Authorization": "Bearer t"})).status == 200
    assert reviewer.calls == 6  # another path is another question
    clock.now += 10
    assert (await client.get("/metrics", headers={"Authorization": "Bearer t"})).status == 200
    assert reviewer.calls == 8
    assert (await client.get("/healthz")).status == 200 and reviewer.calls == 8


@pytest.mark.parametrize(
    "failure",
    [errors.KubeError("forbidden", status=403, reason="Forbidden"), errors.KubeError("down", status=503)],
    ids=["no-rbac-for-reviews", "api-server-down"],
)
async def test_an_api_server_that_cannot_answer_is_a_503_not_remembered(
    aiohttp_client: Any, failure: Exception
) -> None:
    reviewer = FakeReviewer(users={"t": VIEWER}, allowed={VIEWER["username"]})
    reviewer.fail = failure
    client = await _app_client(aiohttp_client, viewaccess.ViewAccess(reviewer, clock=Clock()))
    resp = await client.get("/metrics", headers={"Authorization": "Bearer t"})
    assert resp.status == 503 and resp.headers["Retry-After"] == "5"
    assert "cannot check the token" in await resp.text()
    reviewer.fail = None
    assert (await client.get("/metrics", headers={"Authorization": "Bearer t"})).status == 200


async def test_a_review_that_does_not_answer_in_time_is_a_503(aiohttp_client: Any) -> None:
    reviewer = FakeReviewer(users={"t": VIEWER}, allowed={VIEWER["username"]})
    reviewer.hold = asyncio.Event()  # never set
    client = await _app_client(aiohttp_client, viewaccess.ViewAccess(reviewer, clock=Clock(), timeout_s=0.1))
    resp = await client.get("/metrics", headers={"Authorization": "Bearer t"})
    assert resp.status == 503 and "within 0.1 s" in await resp.text()


async def test_reviews_in_flight_are_bounded(aiohttp_client: Any) -> None:
    reviewer = FakeReviewer(users={}, allowed=set())
    reviewer.hold = asyncio.Event()
    client = await _app_client(
        aiohttp_client, viewaccess.ViewAccess(reviewer, clock=Clock(), max_concurrent=2)
    )
    requests = [
        asyncio.ensure_future(client.get("/metrics", headers={"Authorization": f"Bearer made-up-{i}"}))
        for i in range(6)
    ]
    async with asyncio.timeout(5):
        await reviewer.two_in_flight.wait()
    reviewer.hold.set()
    statuses = [r.status for r in await asyncio.gather(*requests)]
    assert statuses == [401] * 6
    assert reviewer.most_in_flight == 2


GARBAGE_ANSWERS = [
    "not an object",
    {"status": "yes"},
    {"status": {"authenticated": True}},
    {"status": {"authenticated": True, "user": {"username": ""}}},
    {"status": {"authenticated": True, "user": {"username": "x", "groups": "admins"}}},
    {"status": {"authenticated": True, "user": {"username": "x", "extra": {"k": "v"}}}},
]


@pytest.mark.parametrize("answer", GARBAGE_ANSWERS, ids=[f"garbage-{i}" for i in range(len(GARBAGE_ANSWERS))])
async def test_a_garbage_answer_is_never_an_allow(aiohttp_client: Any, answer: Any) -> None:
    reviewer = FakeReviewer(users={"t": VIEWER}, allowed={VIEWER["username"], "x"})
    reviewer.token_answer = answer if isinstance(answer, dict) else None
    if not isinstance(answer, dict):
        reviewer.fail = viewauth.BadReview("TokenReview: expected an object")
    client = await _app_client(aiohttp_client, viewaccess.ViewAccess(reviewer, clock=Clock()))
    assert (await client.get("/metrics", headers={"Authorization": "Bearer t"})).status == 503


@pytest.mark.parametrize(
    "header", ["", "Bearer", "Bearer ", "Basic dXNlcjpwYXNz", "Bearer a b", "bearer\tt"], ids=repr
)
async def test_malformed_authorization_headers_are_401_without_a_review(
    aiohttp_client: Any, header: str
) -> None:
    reviewer = FakeReviewer(users={"t": VIEWER}, allowed={VIEWER["username"]})
    client = await _app_client(aiohttp_client, viewaccess.ViewAccess(reviewer, clock=Clock()))
    assert (await client.get("/metrics", headers={"Authorization": header})).status == 401
    assert reviewer.calls == 0
