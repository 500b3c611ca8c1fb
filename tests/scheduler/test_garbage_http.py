"""Garbage posted to ``/filter``, ``/bind``, ``/preempt`` and ``/webhook`` over real HTTP is never
answered with a 500.

Generated bodies: random JSON (big integers included), raw bytes, nesting thousands deep (Python's
``json`` raises RecursionError), integers past the 4,300-digit conversion limit, and valid
ExtenderArgs / ExtenderBindingArgs / ExtenderPreemptionArgs / AdmissionReview documents with one
value, at any depth, replaced by garbage of another type. Every answer must be 2xx or 4xx; a 4xx
carries a reason.
"""

from __future__ import annotations

import copy
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.scheduler.scenario import EXTENDER_VERBS, Cluster, gpu_container

_GPU = "nvidia.com/gpu"
_HUGE = "__huge_integer__"  # written as 5,000 digits: past Python's 4,300-digit limit when parsed
_HUGE_DIGITS = b"7" * 5000


def _pod(name: str = "p") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "default",
            "uid": f"uid-{name}",
            "annotations": {"nvidia.com/use-gputype": "T4", "hami.io/node-scheduler-policy": "binpack"},
            "labels": {"app": "x"},
        },
        "spec": {
            "schedulerName": "vgpu-scheduler",
            "initContainers": [{"name": "init", "resources": {"limits": {"nvidia.com/priority": "1"}}}],
            "containers": [
                {
                    "name": "c",
                    "env": [{"name": "A", "value": "b"}],
                    "resources": {
                        "limits": {_GPU: "1", "nvidia.com/gpumem": "1000", "nvidia.com/gpucores": "10"},
                        "requests": {_GPU: "1"},
                    },
                    "securityContext": {"privileged": False},
                }
            ],
        },
    }


def _node(name: str) -> dict[str, Any]:
    return {
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {"hami.io/node-nvidia-register": "[]", "hami.io/device-cordon": ""},
        },
    }


TEMPLATES: dict[str, list[Any]] = {
    "filter": [
        {"Pod": _pod(), "NodeNames": ["node-a", "node-b"], "Nodes": None},
        {"Pod": _pod(), "Nodes": {"kind": "NodeList", "items": [_node("node-a"), _node("x")]}},
    ],
    "bind": [{"PodName": "p", "PodNamespace": "default", "PodUID": "uid-p", "Node": "node-a"}],
    "preempt": [
        {  # not nodeCacheCapable: whole victim pods
            "Pod": _pod("q"),
            "NodeNameToVictims": {"node-a": {"Pods": [_pod("p")], "NumPDBViolations": 0}},
        },
        {
            "Pod": _pod("q"),
            "NodeNameToMetaVictims": {"node-a": {"Pods": [{"UID": "uid-p"}], "NumPDBViolations": 1}},
        },
    ],
    "webhook": [
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "r-1",
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "operation": "CREATE",
                "namespace": "default",
                "name": "p",
                "object": _pod(),
            },
        },
        {  # a pod UPDATE: the update guard's path
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "r-2",
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "operation": "UPDATE",
                "namespace": "default",
                "name": "p",
                "userInfo": {"username": "alice", "groups": ["system:authenticated"]},
                "object": _pod(),
                "oldObject": _pod(),
            },
        },
        {  # a node UPDATE
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "r-3",
                "kind": {"group": "", "version": "v1", "kind": "Node"},
                "operation": "UPDATE",
                "name": "node-a",
                "userInfo": {"username": "system:node:node-a", "groups": ["system:nodes"]},
                "object": _node("node-a"),
                "oldObject": _node("node-a"),
            },
        },
    ],
}

_scalar = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.sampled_from([_HUGE, 2**64, -(2**70), -1])
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
    | st.sampled_from(["1e999999999", "-1e999999999", "1e-999999999", "9" * 5000, "1e308", "NaN", "Infinity"])
)
_wrong_types = st.sampled_from([[], {}, "", "x", 0, -1, True, None, 1.5, [1], {"a": 1}, ["x"], _HUGE])
_json = st.recursive(
    _scalar,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=16,
)


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a value inside ``doc`` (object keys and list indexes)."""
    out = [prefix]
    if isinstance(doc, dict):
        for key, value in doc.items():
            out += _paths(value, (*prefix, key))
    elif isinstance(doc, list):
        for i, value in enumerate(doc):
            out += _paths(value, (*prefix, i))
    return out


def _replaced(doc: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    out = copy.deepcopy(doc)
    node = out
    for token in path[:-1]:
        node = node[token]
    node[path[-1]] = value
    return out


@st.composite
def _mutated(draw: st.DrawFn, verb: str) -> bytes:
    """A valid body of ``verb`` with the value at one path replaced by garbage."""
    template = draw(st.sampled_from(TEMPLATES[verb]))
    path = draw(st.sampled_from(_paths(template)))
    garbage = draw(_wrong_types | _json | st.just(_deep(3000)))
    return _dumps(_replaced(template, path, garbage))


def _deep(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


def _dumps(doc: Any) -> bytes:
    # the standard encoder refuses nesting as deep as the ones we send: build deep arrays by hand
    try:
        text = json.dumps(doc).encode()
    except RecursionError:
        return b"[" * 3000 + b"0" + b"]" * 3000
    return text.replace(json.dumps(_HUGE).encode(), _HUGE_DIGITS)


_raw_bodies = (
    st.binary(max_size=64)
    | _json.map(_dumps)
    | st.integers(min_value=500, max_value=20_000).map(lambda n: b"[" * n + b"]" * n)
    | st.integers(min_value=500, max_value=20_000).map(lambda n: b'{"a":' * n + b"1" + b"}" * n)
    | st.integers(min_value=4301, max_value=20_000).map(lambda n: b'{"Pod": ' + b"7" * n + b"}")
)


def _bodies(verb: str) -> st.SearchStrategy[bytes]:
    return _raw_bodies | _mutated(verb)


@pytest.fixture
async def cluster() -> AsyncIterator[Cluster]:
    c = Cluster()
    c.add_node("node-a")
    c.add_node("node-b")
    c.add_pod("p", gpu_container())
    await c.start()
    yield c
    await c.stop()


async def _post(cluster: Cluster, verb: str, body: bytes) -> tuple[int, str]:
    assert cluster.session is not None
    headers = {"Content-Type": "application/json"}
    base = cluster.extender_url if verb in EXTENDER_VERBS else cluster.url
    async with cluster.session.post(f"{base}/{verb}", data=body, headers=headers) as resp:
        return resp.status, await resp.text()


@pytest.mark.parametrize("verb", ["filter", "bind", "preempt", "webhook"])
@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
async def test_garbage_never_gets_a_500(cluster: Cluster, verb: str, data: st.DataObject) -> None:
    body = data.draw(_bodies(verb))
    status, text = await _post(cluster, verb, body)
    assert status < 500, (status, text[:500], body[:300])
    if status >= 400:
        assert text.strip(), "a 4xx must say why"
    elif verb == "webhook":  # a denial names the field; "internal error" (code 500) is a bug
        response = json.loads(text)["response"]
        assert response.get("status", {}).get("code") != 500, (response, body[:300])


@pytest.mark.parametrize(
    ("verb", "body", "needle"),
    [
        ("filter", b"[" * 5000 + b"]" * 5000, "nest"),
        ("bind", b"[" * 5000 + b"]" * 5000, "nest"),
        ("preempt", b"[" * 5000 + b"]" * 5000, "nest"),
        ("webhook", b"[" * 5000 + b"]" * 5000, "not JSON"),
        ("filter", b'{"Pod": ' + b"7" * 5000 + b"}", "digits"),
        ("bind", b'{"Node": ' + b"7" * 5000 + b"}", "digits"),
        ("preempt", b'{"Pod": ' + b"7" * 5000 + b"}", "digits"),
        ("webhook", b'{"request": ' + b"7" * 5000 + b"}", "digits"),
    ],
    ids=[
        "filter-deep",
        "bind-deep",
        "preempt-deep",
        "webhook-deep",
        "filter-bigint",
        "bind-bigint",
        "preempt-bigint",
        "webhook-bigint",
    ],
)
async def test_deep_json_and_huge_integers_are_400_with_a_reason(
    cluster: Cluster, verb: str, body: bytes, needle: str
) -> None:
    status, text = await _post(cluster, verb, body)
    assert status == 400
    assert needle in text


def _filter_with(pod_patch: dict[str, Any]) -> bytes:
    pod = _pod()
    pod["metadata"]["annotations"].update(pod_patch.get("annotations", {}))
    pod["spec"]["containers"][0]["resources"]["limits"].update(pod_patch.get("limits", {}))
    return json.dumps({"Pod": pod, "NodeNames": ["node-a"]}).encode()


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (_filter_with({"limits": {"nvidia.com/gpumem": "1e999999999"}}), "nvidia.com/gpumem"),
        (_filter_with({"limits": {"nvidia.com/gpucores": 1e308}}), "nvidia.com/gpucores"),
        (_filter_with({"limits": {"nvidia.com/priority": "7"}}), "nvidia.com/priority"),
    ],
    ids=["overflowing-quantity", "float-quantity", "priority-out-of-range"],
)
async def test_bad_pod_requests_are_a_filter_error_naming_the_field(
    cluster: Cluster, body: bytes, needle: str
) -> None:
    status, text = await _post(cluster, "filter", body)
    assert status == 200
    error = json.loads(text)["Error"]
    assert needle in error


async def test_a_non_string_pod_annotation_is_a_400_naming_it(cluster: Cluster) -> None:
    status, text = await _post(
        cluster, "filter", _filter_with({"annotations": {"nvidia.com/use-gputype": 5}})
    )
    assert status == 400
    assert "ExtenderArgs.Pod.metadata.annotations['nvidia.com/use-gputype']: expected a string" in text


async def test_a_non_string_node_annotation_is_a_400_naming_it(cluster: Cluster) -> None:
    node = _node("node-x")
    node["metadata"]["annotations"]["hami.io/node-nvidia-register"] = 12
    body = json.dumps({"Pod": _pod(), "Nodes": {"kind": "NodeList", "items": [node]}}).encode()
    status, text = await _post(cluster, "filter", body)
    assert status == 400
    assert "ExtenderArgs.Nodes.items[0].metadata.annotations['hami.io/node-nvidia-register']" in text
    assert "expected a string, got int" in text


def _preempt_with_victim(victim: Any) -> bytes:
    return json.dumps({"Pod": _pod("q"), "NodeNameToVictims": {"node-a": {"Pods": [victim]}}}).encode()


@pytest.mark.parametrize(
    ("victim", "needle"),
    [
        ({"metadata": "x"}, "Pods[0].metadata: expected an object, got str"),
        ({"metadata": ["x"]}, "Pods[0].metadata: expected an object, got list"),
        ({"metadata": 7}, "Pods[0].metadata: expected an object, got int"),
        ({"metadata": {"uid": 7}}, "Pods[0]: expected a pod with a UID"),
        ("x", "Pods[0]: expected an object, got str"),
    ],
    ids=["metadata-string", "metadata-list", "metadata-number", "uid-number", "victim-string"],
)
async def test_a_malformed_preemption_victim_is_a_400_naming_it(
    cluster: Cluster, victim: Any, needle: str
) -> None:
    status, text = await _post(cluster, "preempt", _preempt_with_victim(victim))
    assert status == 400, text
    assert f"ExtenderPreemptionArgs.NodeNameToVictims['node-a'].{needle}" in json.loads(text)["Error"]


def _with_value(verb: str, value: bytes) -> bytes:
    """A valid body of ``verb`` holding ``value`` (raw JSON text): for /filter, inside a Node object
    of a Nodes-mode ExtenderArgs (the objects its answer echoes); elsewhere, as an extra member."""
    if verb == "filter":
        node = {"metadata": {"name": "node-a"}, "status": {"x": "__value__"}}
        doc = {"Pod": _pod(), "Nodes": {"kind": "NodeList", "items": [node]}}
    else:
        doc = {**TEMPLATES[verb][0], "extra": "__value__"}
    return json.dumps(doc).replace('"__value__"', value.decode()).encode()


@pytest.mark.parametrize("value", [b"NaN", b"Infinity", b"-Infinity", b"1e999", b"-1e400"])
@pytest.mark.parametrize("verb", ["filter", "bind", "preempt", "webhook"])
async def test_nan_and_infinity_are_not_json_and_get_a_400(cluster: Cluster, verb: str, value: bytes) -> None:
    """Python's json takes them (and makes 1e999 an infinite float), and /filter in Nodes mode
    echoes the caller's Node objects: they would come back in an answer Go cannot decode."""
    status, text = await _post(cluster, verb, _with_value(verb, value))
    assert status == 400, text
    assert "not JSON" in text
    assert "is not a JSON value" in text or "out of range" in text
