"""The kube-scheduler emulation against a real HTTP test extender and the local store."""

from __future__ import annotations

import base64
import datetime
import ssl
from typing import Any

import pytest
from aiohttp import web
from vgpu.localcluster import certs, schedqueue

from tests.localcluster.extenders import bound, config, serve_extender, unschedulable

GPU = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": "1000"}


async def test_cache_capable_extender_gets_node_names_and_binds(env, ext, start_scheduler):
    for name in ("n1", "n2", "n3"):
        await env.add_node(name)
    ext.filter_reply = lambda args: {"NodeNames": ["n2"], "FailedNodes": {"n1": "busy", "n3": "busy"}}
    start_scheduler(config(ext.url, bindVerb="bind"))
    await env.add_pod("p1", limits=GPU)

    pod = await env.wait_for("pods", "p1", bound)
    assert pod["spec"]["nodeName"] == "n2"
    (args,) = ext.filter_calls
    assert set(args) == {"Pod", "Nodes", "NodeNames"}
    assert args["Nodes"] is None and args["NodeNames"] == ["n1", "n2", "n3"]
    assert args["Pod"]["metadata"]["name"] == "p1" and args["Pod"]["spec"]["containers"][0]["name"] == "c0"
    (bind,) = ext.bind_calls
    assert bind == {
        "PodName": "p1",
        "PodNamespace": "default",
        "PodUID": pod["metadata"]["uid"],
        "Node": "n2",
    }
    event = await env.wait_event("p1", reason="Scheduled")
    assert event["message"] == "Successfully assigned default/p1 to n2"


async def test_non_cache_capable_extender_gets_a_node_list_and_default_binding(env, ext, start_scheduler):
    for name in ("n1", "n2"):
        await env.add_node(name, labels={"gpu": name})

    def keep_n2(args: dict[str, Any]) -> Any:
        items = [n for n in args["Nodes"]["items"] if n["metadata"]["name"] == "n2"]
        return {"Nodes": {"items": items}, "NodeNames": None, "FailedNodes": {"n1": "no"}}

    ext.filter_reply = keep_n2
    start_scheduler(config(ext.url, nodeCacheCapable=False))
    await env.add_pod("p1", limits=GPU)

    pod = await env.wait_for("pods", "p1", bound)
    assert pod["spec"]["nodeName"] == "n2"
    (args,) = ext.filter_calls
    assert args["NodeNames"] is None
    assert [n["metadata"]["name"] for n in args["Nodes"]["items"]] == ["n1", "n2"]
    assert args["Nodes"]["items"][0]["metadata"]["labels"] == {"gpu": "n1"}
    assert ext.bind_calls == []  # no bindVerb: the scheduler's own binding


async def test_failed_and_unresolvable_reasons_make_the_failed_scheduling_event(env, ext, start_scheduler):
    for name in ("n1", "n2", "n3"):
        await env.add_node(name)
    ext.filter_reply = lambda args: {
        "NodeNames": [],
        "FailedNodes": {"n1": "card too busy", "n2": "card too busy", "n3": "ignored: unresolvable wins"},
        "FailedAndUnresolvableNodes": {"n3": "no GPU of type A100"},
    }
    start_scheduler(config(ext.url))
    await env.add_pod("p1", limits=GPU)

    message = "0/3 nodes are available: 1 no GPU of type A100, 2 card too busy."
    event = await env.wait_event("p1", reason="FailedScheduling")
    assert (event["type"], event["message"]) == ("Warning", message)
    assert event["source"]["component"] == "vgpu-scheduler"
    pod = await env.wait_for("pods", "p1", unschedulable)
    (cond,) = [c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled"]
    assert (cond["reason"], cond["message"]) == ("Unschedulable", message)


async def test_null_node_names_filter_out_every_node(env, ext, start_scheduler):
    await env.add_node("n1")
    await env.add_node("n2")
    ext.filter_reply = lambda args: {"NodeNames": None, "Nodes": None}
    start_scheduler(config(ext.url))
    await env.add_pod("p1", limits=GPU)
    event = await env.wait_event("p1", reason="FailedScheduling")
    assert event["message"] == "0/2 nodes are available: ."
    assert (await env.get_pod("p1"))["spec"].get("nodeName") is None


@pytest.mark.parametrize(
    ("reply", "message"),
    [
        ({"NodeNames": ["n1"], "Error": "extender exploded"}, "extender exploded"),
        (web.Response(status=500, text="oops"), "failed filter with extender at URL {url}/filter, code 500"),
        (
            web.Response(status=200, text="not json"),
            "decoding filter result from extender at URL {url}/filter",
        ),
        ({"NodeNames": ["n1", "ghost"]}, 'extender "{url}" claims a filtered node "ghost"'),
    ],
    ids=["error-field", "http-500", "garbage-body", "unknown-node"],
)
async def test_extender_errors_fail_scheduling_with_the_error(env, ext, start_scheduler, reply, message):
    await env.add_node("n1")
    ext.filter_reply = lambda args: reply
    start_scheduler(config(ext.url))
    await env.add_pod("p1", limits=GPU)
    event = await env.wait_event("p1", reason="FailedScheduling")
    assert event["message"].startswith(message.format(url=ext.url))


@pytest.mark.parametrize("ignorable", [False, True])
async def test_timeout_fails_scheduling_unless_ignorable(env, ext, start_scheduler, ignorable):
    await env.add_node("n1")

    async def hang(args: dict[str, Any]) -> Any:
        await ext.hang.wait()

    ext.filter_reply = hang
    start_scheduler(config(ext.url, httpTimeout="100ms", ignorable=ignorable))
    await env.add_pod("p1", limits=GPU)
    if ignorable:
        pod = await env.wait_for("pods", "p1", bound)
        assert pod["spec"]["nodeName"] == "n1" and len(ext.filter_calls) == 1
    else:
        event = await env.wait_event("p1", reason="FailedScheduling")
        assert (
            event["message"]
            == f'Post "{ext.url}/filter": context deadline exceeded (Client.Timeout exceeded while awaiting headers)'
        )
        cond = (await env.wait_for("pods", "p1", unschedulable))["status"]["conditions"][0]
        assert cond["reason"] == "SchedulerError"


async def test_extender_only_sees_pods_asking_for_its_resources(env, ext, start_scheduler):
    await env.add_node("n1")
    start_scheduler(config(ext.url, bindVerb="bind"))
    await env.add_pod("plain", limits={"cpu": "1"})
    pod = await env.wait_for("pods", "plain", bound)
    assert pod["spec"]["nodeName"] == "n1"
    assert ext.filter_calls == [] and ext.bind_calls == []
    await env.add_pod("gpu", requests={"nvidia.com/gpumem": "100"})
    await env.wait_for("pods", "gpu", bound)
    assert [c["Pod"]["metadata"]["name"] for c in ext.filter_calls] == ["gpu"]
    assert [c["PodName"] for c in ext.bind_calls] == ["gpu"]


async def test_resources_not_ignored_are_checked_against_node_allocatable(env, ext, start_scheduler):
    await env.add_node("n1")
    cfg = config(ext.url)
    cfg["extenders"][0]["managedResources"][0]["ignoredByScheduler"] = False  # nvidia.com/gpu checked
    start_scheduler(cfg)  # an unschedulable pod waits for a cluster event: the node change brings the retry
    await env.add_pod("p1", limits=GPU)
    event = await env.wait_event("p1", reason="FailedScheduling")
    assert event["message"] == "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."
    assert ext.filter_calls == []  # in-tree filters left nobody for the extender

    # capacity appears (as a kubelet would publish it): the node change retries the pod at once
    await env.status_writer.merge_patch_status(
        "nodes", "n1", {"status": {"allocatable": {"nvidia.com/gpu": "1"}}}
    )
    pod = await env.wait_for("pods", "p1", bound)
    assert pod["spec"]["nodeName"] == "n1"


async def test_an_extender_error_is_retried_with_back_off_without_any_cluster_event(
    env, ext, start_scheduler
):
    await env.add_node("n1")
    verdicts = iter([{"Error": "not now"}] * 3)
    ext.filter_reply = lambda args: next(verdicts, {"NodeNames": ["n1"]})
    start_scheduler(config(ext.url))
    await env.add_pod("p1", limits=GPU)
    pod = await env.wait_for("pods", "p1", bound)
    assert pod["spec"]["nodeName"] == "n1"
    assert len(ext.filter_calls) == 4  # three errors, then success; no call after binding


async def test_an_unschedulable_pod_waits_for_a_node_change(env, ext, start_scheduler):
    await env.add_node("n1")
    verdicts = iter([{"NodeNames": [], "FailedNodes": {"n1": "full"}}])
    ext.filter_reply = lambda args: next(verdicts, {"NodeNames": ["n1"]})
    sched = start_scheduler(config(ext.url))
    await env.add_pod("p1", limits=GPU)
    event = await env.wait_event("p1", reason="FailedScheduling")
    assert event["message"] == "0/1 nodes are available: 1 full."
    assert sched.queue.where(("default", "p1")) is schedqueue.Where.UNSCHEDULABLE
    await env.api.merge_patch("nodes", "n1", {"metadata": {"annotations": {"x": "y"}}})  # not a move event
    await env.api.merge_patch("nodes", "n1", {"metadata": {"labels": {"zone": "a"}}})  # a move event
    pod = await env.wait_for("pods", "p1", bound)
    assert pod["spec"]["nodeName"] == "n1" and len(ext.filter_calls) == 2


async def test_bind_error_re_queues_the_pod(env, ext, start_scheduler):
    await env.add_node("n1")
    answers = iter([{"Error": "node lock held"}])

    async def bind(args: dict[str, Any]) -> Any:
        answer = next(answers, None)
        return answer if answer is not None else await ext.bind_for_real(args)

    ext.bind_reply = bind
    start_scheduler(config(ext.url, bindVerb="bind"))
    await env.add_pod("p1", limits=GPU)
    event = await env.wait_event("p1", reason="FailedScheduling")
    assert event["message"] == "binding rejected: node lock held"
    pod = await env.wait_for("pods", "p1", bound)
    assert pod["spec"]["nodeName"] == "n1" and len(ext.bind_calls) == 2


async def test_other_scheduler_names_and_in_tree_failures(env, start_scheduler):
    await env.add_node("n1", ready=False)
    await env.add_node("n2", unschedulable=True)
    await env.add_node("n3", labels={"zone": "b"})
    start_scheduler(None)
    await env.add_pod("mine", node_selector={"zone": "a"})
    await env.add_pod("theirs", scheduler="default-scheduler")
    event = await env.wait_event("mine", reason="FailedScheduling")
    assert event["message"] == (
        "0/3 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, "
        "1 node(s) had taint {node.kubernetes.io/not-ready: }, that the pod didn't tolerate, "
        "1 node(s) were unschedulable."
    )
    events = await env.api.list("events", namespace="default")
    assert all(e["involvedObject"]["name"] != "theirs" for e in events.items)
    assert (await env.get_pod("theirs"))["spec"].get("nodeName") is None


@pytest.mark.parametrize("trust", ["insecure", "caData", "no-ca", "wrong-ca"])
async def test_https_extender(env, aiohttp_server, start_scheduler, tmp_path, trust):
    now = datetime.datetime.now(datetime.UTC)
    pem = certs.make_serving_certs(tmp_path / "right", now=now)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(pem.cert_file, pem.key_file)
    https = await serve_extender(env.api, aiohttp_server, ssl=context)
    assert https.url.startswith("https://")
    ca = pem if trust != "wrong-ca" else certs.make_serving_certs(tmp_path / "wrong", now=now)
    ca_data = {"caData": base64.b64encode(ca.ca_pem()).decode()}
    tls = {"insecure": {"insecure": True}, "caData": ca_data, "no-ca": {}, "wrong-ca": ca_data}[trust]
    await env.add_node("n1")
    start_scheduler(config(https.url, enableHTTPS=True, tlsConfig=tls))
    await env.add_pod("p1", limits=GPU)
    if trust == "wrong-ca":  # the CA is really checked
        event = await env.wait_event("p1", reason="FailedScheduling")
        assert "CERTIFICATE_VERIFY_FAILED" in event["message"] and https.filter_calls == []
        return
    pod = await env.wait_for("pods", "p1", bound)
    assert pod["spec"]["nodeName"] == "n1" and len(https.filter_calls) == 1


async def test_an_assigned_pod_going_away_retries_waiting_pods_at_once(env, start_scheduler):
    await env.add_node("n1", allocatable={"example.com/gpu": "1"})
    start_scheduler(None)
    await env.add_pod("first", limits={"example.com/gpu": 1})
    await env.wait_for("pods", "first", bound)
    await env.add_pod("second", limits={"example.com/gpu": 1})
    event = await env.wait_event("second", reason="FailedScheduling")
    assert event["message"] == "0/1 nodes are available: 1 Insufficient example.com/gpu."
    await env.api.delete("pods", "first", namespace="default")
    pod = await env.wait_for("pods", "second", bound)
    assert pod["spec"]["nodeName"] == "n1"


async def test_a_just_bound_pod_counts_before_the_watch_shows_it(env, start_scheduler):
    await env.add_node("n1", allocatable={"example.com/gpu": "1"})
    await env.add_pod("a", limits={"example.com/gpu": 1})
    await env.add_pod("b", limits={"example.com/gpu": 1})
    start_scheduler(None)  # both are queued from the first list, back to back
    await env.wait_event("b", reason="FailedScheduling")
    assert (await env.get_pod("a"))["spec"]["nodeName"] == "n1"
    assert (await env.get_pod("b"))["spec"].get("nodeName") is None
