"""Which PodDisruptionBudgets select a pod, as kube-scheduler's preemption counts them; garbage."""

from __future__ import annotations

from typing import Any

import pytest
from vgpu.core import budgets, errors


def budget(selector: Any, allowed: int = 1, disrupted: dict[str, str] | None = None) -> budgets.Budget:
    status: dict[str, Any] = {"disruptionsAllowed": allowed}
    if disrupted is not None:
        status["disruptedPods"] = disrupted
    return budgets.decode(
        {"metadata": {"name": "b", "namespace": "ns"}, "spec": {"selector": selector}, "status": status}
    )


CASES = [
    ("match-labels", {"matchLabels": {"app": "web"}}, {"app": "web", "x": "y"}, True),
    ("match-labels-differ", {"matchLabels": {"app": "web"}}, {"app": "db"}, False),
    (
        "in",
        {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["a", "b"]}]},
        {"tier": "b"},
        True,
    ),
    ("in-missing", {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["a"]}]}, {}, False),
    (
        "notin",
        {"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["a"]}]},
        {"tier": "a"},
        False,
    ),
    (
        "notin-missing",
        {"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["a"]}]},
        {},
        True,
    ),
    ("exists", {"matchExpressions": [{"key": "tier", "operator": "Exists"}]}, {"tier": "x"}, True),
    (
        "does-not-exist",
        {"matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}]},
        {"tier": "x"},
        False,
    ),
    ("empty-selector-selects-nothing", {}, {"app": "web"}, False),
    ("no-selector-selects-nothing", None, {"app": "web"}, False),
]


@pytest.mark.parametrize(("selector", "labels", "want"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_selects(selector: Any, labels: dict[str, str], want: bool) -> None:
    assert budget(selector).selects("ns", "p", labels) is want


def test_other_namespace_and_already_disrupted_pods_are_not_selected() -> None:
    b = budget({"matchLabels": {"app": "web"}}, disrupted={"p": "2027-01-01T00:00:00Z"})
    assert not b.selects("other", "q", {"app": "web"})
    assert not b.selects("ns", "p", {"app": "web"})
    assert b.selects("ns", "q", {"app": "web"}) and b.key == "ns/b"


@pytest.mark.parametrize(
    "selector",
    [
        "app=web",
        {"matchLabels": {"app": 3}},
        {"matchExpressions": {"key": "a"}},
        {"matchExpressions": [{"key": "a", "operator": "Near"}]},
        {"matchExpressions": [{"key": "a", "operator": "In", "values": "a"}]},
    ],
    ids=["string", "label-not-string", "expressions-not-list", "bad-operator", "values-not-list"],
)
def test_garbage_selector_is_a_parse_error(selector: Any) -> None:
    with pytest.raises(errors.ParseError, match=r"spec\.selector"):
        budget(selector)


def test_garbage_status_counts_as_no_disruption_left() -> None:
    b = budgets.decode({"metadata": {"name": "b"}, "spec": {}, "status": {"disruptionsAllowed": "many"}})
    assert b.disruptions_allowed == 0 and b.namespace == "default"
