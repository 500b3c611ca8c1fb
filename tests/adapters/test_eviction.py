"""``port.evict``: the newest Eviction version the API server knows (policy/v1 from 1.22, policy/v1beta1
before it, as kube-apiserver v1.20.2 answered in the realk8s tests), and no retry of other errors."""

from __future__ import annotations

import pytest
from vgpu.core import errors
from vgpu.kube import port
from vgpu.kube.port import JsonObj

V1_REFUSED = (
    'POST /api/v1/namespaces/default/pods/p/eviction: Eviction in version "v1" cannot be handled as a '
    'Eviction: no kind "Eviction" is registered for version "policy/v1" in scheme '
    '"k8s.io/kubernetes/pkg/api/legacyscheme/scheme.go:30"'
)


class Server:
    """Answers each POST with the next of ``answers`` (an error to raise, or None for 201)."""

    def __init__(self, *answers: errors.KubeError | None) -> None:
        self.answers = list(answers)
        self.posts: list[tuple[str, JsonObj]] = []

    async def post(self, path: str, body: JsonObj) -> None:
        self.posts.append((path, body))
        answer = self.answers.pop(0)
        if answer is not None:
            raise answer


async def evict(server: Server) -> None:
    await port.evict(server.post, "default", "p", uid="u1", grace_period_s=None)


async def test_a_policy_v1_eviction_is_sent_once_where_it_is_known() -> None:
    server = Server(None)
    await evict(server)
    ((path, body),) = server.posts
    assert path == "/api/v1/namespaces/default/pods/p/eviction"
    assert body["apiVersion"] == "policy/v1"
    assert body["deleteOptions"]["preconditions"] == {"uid": "u1"}


async def test_an_api_server_without_policy_v1_gets_the_v1beta1_eviction() -> None:
    server = Server(errors.KubeError(V1_REFUSED, status=400), None)
    await evict(server)
    assert [b["apiVersion"] for _, b in server.posts] == ["policy/v1", "policy/v1beta1"]
    assert server.posts[1][1]["metadata"] == {"name": "p", "namespace": "default"}


@pytest.mark.parametrize(
    "error",
    [
        errors.TooManyRequests(
            "Cannot evict pod as it would violate the pod's disruption budget.", status=429
        ),
        errors.KubeError("the body is garbage", status=400),
        errors.NotFound("pods p not found", status=404),
    ],
    ids=["budget", "other-400", "gone"],
)
async def test_other_refusals_are_the_caller_s_and_not_retried(error: errors.KubeError) -> None:
    server = Server(error)
    with pytest.raises(type(error)):
        await evict(server)
    assert len(server.posts) == 1


async def test_a_server_that_knows_neither_version_is_an_error_after_both() -> None:
    server = Server(
        errors.KubeError(V1_REFUSED, status=400), errors.KubeError("no v1beta1 either", status=400)
    )
    with pytest.raises(errors.KubeError, match="no v1beta1 either"):
        await evict(server)
    assert len(server.posts) == 2
