"""The app's transports: HTTPS with a cert/key, the webhook route mounted, garbage never crashes."""

from __future__ import annotations

import contextlib
import io
import json
import ssl
from typing import Any

import aiohttp
import pytest
import trustme
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from vgpu.core import annotations, errors
from vgpu.core.config import Config
from vgpu_scheduler import limits
from vgpu_scheduler.binder import parse_binding_args
from vgpu_scheduler.events import EventRecorder
from vgpu_scheduler.extender import Extender, parse_args
from vgpu_scheduler.state import ClusterState

from tests.scheduler.scenario import Cluster, FakeClock, gpu_container

KEYS = annotations.KEYS


async def test_serves_https_and_mounts_the_webhook() -> None:
    ca = trustme.CA()
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_ctx)
    client_ctx = ssl.create_default_context()
    ca.configure_trust(client_ctx)
    c = Cluster()
    from vgpu_scheduler.app import SchedulerService

    service = SchedulerService(c.config, c.api, clock=c.clock)
    address = await service.start(host="127.0.0.1", port=0, ssl_context=server_ctx)
    try:
        await service.wait_ready()
        review = {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "u-1",
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "operation": "CREATE",
                "namespace": "default",
                "object": {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c"}]}},
            },
        }
        async with aiohttp.ClientSession() as session:
            async with session.get(f"https://{address}/healthz", ssl=client_ctx) as resp:
                assert resp.status == 200
            async with session.post(f"https://{address}/webhook", json=review, ssl=client_ctx) as resp:
                body = await resp.json()
        assert body["response"]["uid"] == "u-1" and body["response"]["allowed"] is True
    finally:
        await service.stop()


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=20,
)
_args = st.fixed_dictionaries(
    {},
    optional={
        "Pod": _json
        | st.fixed_dictionaries(
            {"metadata": st.fixed_dictionaries({"name": st.just("p"), "uid": st.just("u")}), "spec": _json}
        ),
        "NodeNames": _json,
        "Nodes": _json,
    },
)


class _NoApi:
    async def merge_patch(self, *a: Any, **k: Any) -> dict[str, Any]:
        return {}

    async def create_event(self, **_: Any) -> None:
        return None


@settings(max_examples=200, suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(_args)
async def test_filter_garbage_is_a_parse_error_or_an_answer(raw: dict[str, Any]) -> None:
    config = Config()
    state = ClusterState(config, clock=FakeClock())
    events = EventRecorder(_NoApi(), component="t")  # type: ignore[arg-type]
    extender = Extender(config=config, state=state, events=events, clock=FakeClock())
    try:
        reply = extender.filter(raw)
    except errors.ParseError:
        return
    finally:
        await events.aclose()
    json.dumps(reply.body)
    assert reply.outcome in ("passthrough", "placed", "unschedulable", "error")


@given(_json)
def test_parse_args_and_binding_args_only_raise_parse_errors(raw: Any) -> None:
    for parse in (parse_args, parse_binding_args):
        with contextlib.suppress(errors.ParseError):
            parse(raw)


@pytest.mark.parametrize(
    "raw",
    [
        {"PodName": "a", "PodNamespace": "b", "PodUID": "", "Node": "n"},
        {"podname": "a", "podnamespace": "b", "poduid": "u", "node": "n"},
    ],
)
def test_binding_args_accepts_go_case_insensitive_keys(raw: dict[str, str]) -> None:
    assert parse_binding_args(raw)[0] == "b"


async def test_extender_verbs_only_on_loopback_and_404_on_the_service_port(cluster: Cluster) -> None:
    """Issue 16: the Service port (reachable by any pod) serves no verb that writes with our rights."""
    assert cluster.session is not None and cluster.service is not None
    assert cluster.service.extender_address.startswith("127.0.0.1:")
    cluster.add_pod("p", gpu_container(mem=1000))
    await cluster.synced()
    pod = cluster.pod("p")
    bind = {"PodName": "p", "PodNamespace": "default", "PodUID": pod["metadata"]["uid"], "Node": "node-a"}
    for verb, body in (("filter", {"Pod": pod, "NodeNames": ["node-a"]}), ("bind", bind), ("preempt", {})):
        async with cluster.session.post(f"{cluster.url}/{verb}", json=body) as resp:
            assert resp.status == 404, verb
    assert KEYS.devices_allocated not in cluster.pod("p")["metadata"]["annotations"]
    for path in ("/webhook", "/metrics", "/healthz", "/readyz"):  # and the reverse
        async with cluster.session.get(f"{cluster.extender_url}{path}") as resp:
            assert resp.status in (404, 405), path
        method = "POST" if path == "/webhook" else "GET"
        async with cluster.session.request(method, f"{cluster.url}{path}") as resp:
            assert resp.status != 404, path


async def test_bodies_over_the_per_path_cap_are_413_with_the_reason(cluster: Cluster) -> None:
    assert cluster.session is not None and cluster.service is not None
    big = b"x" * (limits.BIND_MAX_BODY_BYTES + 1)

    async def chunked() -> Any:
        for start in range(0, len(big), 8192):
            yield big[start : start + 8192]

    for data in (big, chunked()):  # declared Content-Length, then chunked (no length up front)
        async with cluster.session.post(f"{cluster.extender_url}/bind", data=data) as resp:
            assert resp.status == 413
            assert f"over the {limits.BIND_MAX_BODY_BYTES} byte limit" in (await resp.json())["Error"]
    webhook_big = b" " * (limits.WEBHOOK_MAX_BODY_BYTES + 1)
    async with cluster.session.post(f"{cluster.url}/webhook", data=io.BytesIO(webhook_big)) as resp:
        assert resp.status == 413
    assert cluster.service.extender_log.hits["body"] == 2
    assert cluster.service.service_log.hits["body"] == 1
