"""The scheduler pods' NetworkPolicy (issue 49, item 1): on the Service's port, only the API server
and the metrics scrapers the user names; nothing else. Rendered by default, valid Kubernetes."""

from __future__ import annotations

from typing import Any

import pytest

from tests.deploy import rendering

kv = pytest.importorskip(
    "kubernetes_validate", reason="kubernetes-validate (dev dependency) is not installed"
)

MONITORING = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
CONTROL_PLANE = {"ipBlock": {"cidr": "10.0.0.0/24"}}


def _policy(values: dict[str, Any] | None = None) -> dict[str, Any]:
    rendered = rendering.render(values)
    policy = rendered.one("NetworkPolicy")
    kv.validate(policy, "1.29.0", strict=True)
    return policy


def test_by_default_only_the_service_port_is_open_and_only_from_outside_the_pods() -> None:
    rendered = rendering.render()
    policy = rendered.one("NetworkPolicy")
    pod = rendered.one("Deployment")["spec"]["template"]
    selected = policy["spec"]["podSelector"]["matchLabels"]
    assert selected.items() <= pod["metadata"]["labels"].items()  # the scheduler pods
    assert policy["spec"]["policyTypes"] == ["Ingress"]  # its calls to the API server stay open
    [rule] = policy["spec"]["ingress"]
    ports = {p["name"] for c in pod["spec"]["containers"] for p in c.get("ports", [])}
    assert rule["ports"] == [{"port": "https", "protocol": "TCP"}] and "https" in ports
    assert rule["from"] == [{"ipBlock": {"cidr": "0.0.0.0/0"}}, {"ipBlock": {"cidr": "::/0"}}]
    service = rendered.one("Service")
    assert service["spec"]["ports"][0]["targetPort"] == "https"  # the port the policy opens


def test_pod_cidrs_are_left_out_of_the_api_server_rule_by_family() -> None:
    policy = _policy({"scheduler": {"networkPolicy": {"podCIDRs": ["10.244.0.0/16", "fd00:10:244::/56"]}}})
    [rule] = policy["spec"]["ingress"]
    assert rule["from"] == [
        {"ipBlock": {"cidr": "0.0.0.0/0", "except": ["10.244.0.0/16"]}},
        {"ipBlock": {"cidr": "::/0", "except": ["fd00:10:244::/56"]}},
    ]


def test_named_api_server_and_scrapers_are_the_only_peers() -> None:
    policy = _policy(
        {"scheduler": {"networkPolicy": {"apiServer": [CONTROL_PLANE], "metricsScrapers": [MONITORING]}}}
    )
    webhook, scrapers = policy["spec"]["ingress"]
    assert webhook == {"ports": [{"port": "https", "protocol": "TCP"}], "from": [CONTROL_PLANE]}
    assert scrapers == {"ports": [{"port": "https", "protocol": "TCP"}], "from": [MONITORING]}


def test_plain_http_opens_the_http_port() -> None:
    values = {"webhook": {"enabled": False}, "guard": {"mode": "none"}, "tls": {"mode": "none"}}
    [rule] = _policy(values)["spec"]["ingress"]
    assert rule["ports"] == [{"port": "http", "protocol": "TCP"}]


def test_it_can_be_turned_off() -> None:
    rendered = rendering.render({"scheduler": {"networkPolicy": {"enabled": False}}})
    assert rendered.of_kind("NetworkPolicy") == []


@pytest.mark.parametrize(
    "values",
    [
        pytest.param({"podCIDRs": ["not a cidr"]}, id="garbage-cidr"),
        pytest.param({"apiServer": [{"ipblock": {"cidr": "10.0.0.0/8"}}]}, id="misspelt-peer"),
        pytest.param({"apiServer": [{}]}, id="empty-peer"),
        pytest.param({"metricsScrapers": "monitoring"}, id="not-a-list"),
    ],
)
def test_garbage_values_are_refused(values: dict[str, Any]) -> None:
    assert rendering.render_error({"scheduler": {"networkPolicy": values}})
