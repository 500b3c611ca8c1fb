"""The scheduler emulation's pure parts: extender config, filter-result rules, in-tree filters."""

from __future__ import annotations

import decimal
from typing import Any

import pytest
from vgpu.core import errors
from vgpu.localcluster import extender, intree, podresources

URL = "http://127.0.0.1:1/sched/filter"


@pytest.mark.parametrize(
    ("raw", "seconds"),
    [
        ("30s", 30.0),
        ("1m30s", 90.0),
        ("500ms", 0.5),
        ("1.5s", 1.5),
        ("1h", 3600.0),
        ("0", 0.0),
        ("2us", 2e-6),
    ],
)
def test_parse_duration_accepts_go_durations(raw: str, seconds: float) -> None:
    assert extender.parse_duration(raw, field="t") == pytest.approx(seconds)


@pytest.mark.parametrize("raw", ["", "30", "s", "5x", "1m 2s", "-5s", 30, None, "ms5"])
def test_parse_duration_rejects_garbage(raw: Any) -> None:
    with pytest.raises(errors.ConfigError) as info:
        extender.parse_duration(raw, field="extenders[0].httpTimeout")
    assert info.value.field == "extenders[0].httpTimeout"


HAMI_STYLE = {
    "apiVersion": "kubescheduler.config.k8s.io/v1",
    "kind": "KubeSchedulerConfiguration",
    "profiles": [{"schedulerName": "vgpu-scheduler"}],
    "extenders": [
        {
            "urlPrefix": "https://127.0.0.1:443/",
            "filterVerb": "filter",
            "bindVerb": "bind",
            "nodeCacheCapable": True,
            "httpTimeout": "30s",
            "enableHTTPS": True,
            "tlsConfig": {"insecure": True},
            "managedResources": [
                {"name": "nvidia.com/gpu", "ignoredByScheduler": True},
                {"name": "nvidia.com/gpumem", "ignoredByScheduler": True},
            ],
        }
    ],
}


def test_parse_config_reads_a_hami_style_configuration() -> None:
    (ext,) = extender.parse_config(HAMI_STYLE)
    assert ext.url("filter") == "https://127.0.0.1:443/filter"
    assert (ext.filter_verb, ext.bind_verb, ext.node_cache_capable) == ("filter", "bind", True)
    assert ext.http_timeout_s == 30.0
    assert ext.enable_https and ext.tls["insecure"] is True
    assert [m.name for m in ext.managed_resources] == ["nvidia.com/gpu", "nvidia.com/gpumem"]
    assert all(m.ignored_by_scheduler for m in ext.managed_resources)


def test_parse_config_defaults_the_timeout_to_5s_and_allows_no_extenders() -> None:
    (ext,) = extender.parse_config({"extenders": [{"urlPrefix": "http://x", "httpTimeout": "0s"}]})
    assert ext.http_timeout_s == 5.0
    assert extender.parse_config(None) == ()
    assert extender.parse_config({"profiles": []}) == ()


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"extenders": "nope"}, "extenders"),
        ({"extenders": [42]}, "extenders[0]"),
        ({"extenders": [{}]}, "extenders[0].urlPrefix"),
        ({"extenders": [{"urlPrefix": "ftp://x"}]}, "extenders[0].urlPrefix"),
        (
            {"extenders": [{"urlPrefix": "http://x", "nodeCacheCapable": "yes"}]},
            "extenders[0].nodeCacheCapable",
        ),
        ({"extenders": [{"urlPrefix": "http://x", "httpTimeout": 30}]}, "extenders[0].httpTimeout"),
        ({"extenders": [{"urlPrefix": "http://x", "managedResources": {}}]}, "extenders[0].managedResources"),
        (
            {"extenders": [{"urlPrefix": "http://x", "managedResources": [{"name": "cpu"}]}]},
            "extenders[0].managedResources[0].name",
        ),
        (
            {
                "extenders": [
                    {"urlPrefix": "http://a", "bindVerb": "b"},
                    {"urlPrefix": "http://b", "bindVerb": "b"},
                ]
            },
            "extenders",
        ),
        (
            {
                "extenders": [
                    {"urlPrefix": "http://a", "managedResources": [{"name": "x.io/a"}]},
                    {"urlPrefix": "http://b", "managedResources": [{"name": "x.io/a"}]},
                ]
            },
            "extenders[1].managedResources",
        ),
        ({"extenders": [{"urlPrefix": "http://x", "tlsConfig": "insecure"}]}, "extenders[0].tlsConfig"),
    ],
    ids=[
        "not-a-list",
        "entry-not-mapping",
        "no-url",
        "bad-scheme",
        "bool-as-string",
        "timeout-int",
        "managed-not-list",
        "managed-native",
        "two-binders",
        "duplicate-managed",
        "tls-not-mapping",
    ],
)
def test_parse_config_rejects_garbage_naming_the_field(raw: Any, field: str) -> None:
    with pytest.raises(errors.ConfigError) as info:
        extender.parse_config(raw)
    assert info.value.field == field


def _pod(**resources: Any) -> dict[str, Any]:
    return {"spec": {"containers": [{"name": "c", "resources": resources}]}}


@pytest.mark.parametrize(
    ("pod", "interested"),
    [
        (_pod(limits={"nvidia.com/gpu": 1}), True),
        (_pod(requests={"nvidia.com/gpumem": "1000"}), True),
        (
            {
                "spec": {
                    "initContainers": [{"name": "i", "resources": {"limits": {"nvidia.com/gpu": 1}}}],
                    "containers": [],
                }
            },
            True,
        ),
        (_pod(limits={"cpu": "1"}), False),
        ({"spec": {}}, False),
    ],
    ids=["limits", "requests", "init-container", "other-resource", "no-containers"],
)
def test_is_interested_looks_at_requests_and_limits_of_all_containers(pod: Any, interested: bool) -> None:
    ext = extender.ExtenderConfig(
        url_prefix="http://x",
        managed_resources=(
            extender.ManagedResource("nvidia.com/gpu"),
            extender.ManagedResource("nvidia.com/gpumem"),
        ),
    )
    assert ext.is_interested(pod) is interested
    assert extender.ExtenderConfig(url_prefix="http://x").is_interested(pod)  # empty list: every pod


def _parse(raw: Any, *, cache: bool = True) -> extender.FilterResult:
    return extender.parse_filter_result(
        raw, url=URL, input_nodes=["n1", "n2", "n3"], node_cache_capable=cache
    )


def test_filter_result_node_names_pass_when_cache_capable() -> None:
    result = _parse(
        {"NodeNames": ["n2"], "FailedNodes": {"n1": "busy"}, "FailedAndUnresolvableNodes": {"n3": "no gpu"}}
    )
    assert result == extender.FilterResult(
        passed=["n2"], failed={"n1": "busy"}, unresolvable={"n3": "no gpu"}
    )


@pytest.mark.parametrize(
    "raw",
    [{"NodeNames": None}, {}, {"FailedNodes": {"n1": "x"}}, {"Nodes": None, "NodeNames": None}],
    ids=["null-names", "empty-object", "only-failed", "both-null"],
)
def test_filter_result_with_no_list_filters_out_every_node(raw: Any) -> None:
    assert _parse(raw).passed == []
    assert _parse(raw, cache=False).passed == []


def test_filter_result_nodes_are_used_when_not_cache_capable_or_names_missing() -> None:
    raw = {"Nodes": {"items": [{"metadata": {"name": "n3"}}]}, "NodeNames": ["n1"]}
    assert _parse(raw, cache=False).passed == ["n3"]  # NodeNames ignored without the cache
    assert _parse({"Nodes": {"items": [{"metadata": {"name": "n3"}}]}}).passed == ["n3"]


def test_filter_result_keys_match_case_insensitively_like_go() -> None:
    assert _parse({"nodenames": ["n1"], "failednodes": {"n2": "x"}}).passed == ["n1"]


def test_filter_result_claiming_an_unknown_node_is_an_error() -> None:
    with pytest.raises(errors.SchedulingError, match='claims a filtered node "n9" which is not found'):
        _parse({"NodeNames": ["n1", "n9"]})


def test_filter_result_error_fails_the_call() -> None:
    with pytest.raises(errors.SchedulingError, match=r"^boom$"):
        _parse({"NodeNames": ["n1"], "Error": "boom"})


@pytest.mark.parametrize(
    "raw",
    [
        [],
        "x",
        {"NodeNames": "n1"},
        {"NodeNames": [1]},
        {"FailedNodes": ["n1"]},
        {"FailedAndUnresolvableNodes": {"n1": 3}},
        {"Nodes": {"items": "x"}},
        {"Nodes": {"items": [{"metadata": {}}]}},
    ],
    ids=[
        "list",
        "string",
        "names-string",
        "names-ints",
        "failed-list",
        "reason-int",
        "items-string",
        "nameless",
    ],
)
def test_filter_result_garbage_is_a_clear_error(raw: Any) -> None:
    with pytest.raises(errors.SchedulingError, match=r"decoding filter result from extender at URL"):
        _parse(raw)


def test_fit_error_message_counts_and_sorts_reasons_like_kube_scheduler() -> None:
    statuses = {
        "a": ["too busy"],
        "b": ["no gpu"],
        "c": ["too busy"],
        "d": ["Insufficient cpu", "Insufficient memory"],
    }
    assert intree.fit_error_message(4, statuses) == (
        "0/4 nodes are available: 1 Insufficient cpu, 1 Insufficient memory, 1 no gpu, 2 too busy."
    )
    assert intree.fit_error_message(0, {}) == "no nodes available to schedule pods"


def _node(**status: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "metadata": {"name": "n", "labels": {"zone": "a"}},
        "spec": {},
        "status": {
            "allocatable": {"cpu": "2", "memory": "1Gi", "pods": "2"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }
    base["status"].update(status)
    return base


D = decimal.Decimal


@pytest.mark.parametrize(
    ("pod", "node", "others", "ignored", "reasons"),
    [
        ({}, _node(), [], (), []),
        ({}, {**_node(), "spec": {"unschedulable": True}}, [], (), [intree.UNSCHEDULABLE]),
        (
            {},
            _node(conditions=[{"type": "Ready", "status": "False"}]),
            [],
            (),
            ["node(s) had taint {node.kubernetes.io/not-ready: }, that the pod didn't tolerate"],
        ),
        ({"spec": {"tolerations": [{"operator": "Exists"}]}}, _node(conditions=[]), [], (), []),
        ({"spec": {"nodeSelector": {"zone": "b"}}}, _node(), [], (), [intree.SELECTOR_MISMATCH]),
        (
            _pod(requests={"cpu": "3", "memory": "2Gi"}),
            _node(),
            [],
            (),
            ["Insufficient cpu", "Insufficient memory"],
        ),
        (_pod(requests={"cpu": "1"}), _node(), [_pod(requests={"cpu": "1500m"})], (), ["Insufficient cpu"]),
        (_pod(limits={"nvidia.com/gpu": 1}), _node(), [], (), ["Insufficient nvidia.com/gpu"]),
        (_pod(limits={"nvidia.com/gpu": 1}), _node(), [], ("nvidia.com/gpu",), []),
        ({}, _node(), [{}, {}], (), [intree.TOO_MANY_PODS]),
    ],
    ids=[
        "fits",
        "unschedulable",
        "not-ready",
        "tolerated",
        "selector",
        "cpu-mem",
        "used-cpu",
        "extended",
        "ignored",
        "pods",
    ],
)
def test_node_reasons(pod: Any, node: Any, others: Any, ignored: Any, reasons: list[str]) -> None:
    request = podresources.pod_requests(pod)
    used: dict[str, decimal.Decimal] = {}
    for other in others:
        for name, amount in podresources.pod_requests(other).items():
            used[name] = used.get(name, D(0)) + amount
    got = intree.node_reasons(pod, request, node, used=used, pods_on_node=len(others), ignored=ignored)
    assert got == reasons


def test_pod_requests_take_max_of_init_and_sum_of_containers() -> None:
    pod = {
        "spec": {
            "initContainers": [{"name": "i", "resources": {"limits": {"cpu": "3"}}}],
            "containers": [
                {"name": "a", "resources": {"requests": {"cpu": "1"}}},
                {"name": "b", "resources": {"limits": {"cpu": "1", "nvidia.com/gpu": "2"}}},
            ],
            "overhead": {"cpu": "100m"},
        }
    }
    assert podresources.pod_requests(pod) == {"cpu": D("3.1"), "nvidia.com/gpu": D(2)}


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        ("nvidia.com/gpu", True),
        ("example.org/a_b-c.d", True),
        ("gpu", False),
        ("kubernetes.io/gpu", False),
        ("foo.kubernetes.io/gpu", False),
        ("requests.nvidia.com/gpu", False),
        ("nvidia.com/", False),
        ("Nvidia.com/gpu", False),
        ("a/b/c", False),
        ("nvidia.com/" + "g" * 64, False),
    ],
)
def test_is_extended_resource_name(name: str, ok: bool) -> None:
    assert podresources.is_extended_resource_name(name) is ok
