"""The nominated-pod index and its readers, fed garbage and edge cases directly (no HTTP)."""

from __future__ import annotations

from typing import Any

import pytest
from vgpu_scheduler import nominated

BASE: dict[str, Any] = {
    "metadata": {"name": "p", "uid": "u"},
    "spec": {"priority": 7},
    "status": {"nominatedNodeName": "n1", "phase": "Pending"},
}


def with_(**changes: Any) -> dict[str, Any]:
    pod: dict[str, Any] = {k: dict(v) for k, v in BASE.items()}
    for path, value in changes.items():
        part, key = path.split("__")
        pod[part][key] = value
    return pod


@pytest.mark.parametrize(
    ("pod", "want"),
    [
        (BASE, "n1"),
        (with_(spec__nodeName="n2"), None),
        (with_(metadata__deletionTimestamp="2027-01-01T00:00:00Z"), None),
        (with_(status__phase="Succeeded"), None),
        (with_(status__nominatedNodeName=""), None),
        (with_(status__nominatedNodeName=5), None),
        ({"metadata": "x", "spec": {}, "status": {}}, None),
        ({}, None),
    ],
    ids=["nominated", "bound", "deleting", "finished", "empty", "not-a-string", "garbage-meta", "empty-pod"],
)
def test_nominated_node(pod: dict[str, Any], want: str | None) -> None:
    assert nominated.nominated_node(pod) == want


@pytest.mark.parametrize(
    ("spec", "want"),
    [({"priority": 7}, 7), ({}, 0), ({"priority": "7"}, 0), ({"priority": True}, 0), (None, 0)],
    ids=["int", "unset", "string", "bool", "no-spec"],
)
def test_priority(spec: Any, want: int) -> None:
    assert nominated.priority({"spec": spec}) == want


def test_index_follows_nomination_binding_and_deletion() -> None:
    seen: list[tuple[str, str]] = []
    index = nominated.Nominations()
    index.on_nominated = lambda pod, node: seen.append((pod["metadata"]["uid"], node))
    index.pod("u", BASE, deleted=False)
    index.pod("u", BASE, deleted=False)  # unchanged: no second callback
    assert index.by_node == {"n1": {"u"}} and seen == [("u", "n1")]
    index.pod("u", with_(status__nominatedNodeName="n2"), deleted=False)
    assert index.by_node == {"n2": {"u"}} and seen[-1] == ("u", "n2")
    index.pod("u", with_(spec__nodeName="n2"), deleted=False)  # bound: no longer waiting
    assert index.by_node == {} and index.by_uid == {}
    index.pod("u", BASE, deleted=False)
    index.pod("u", BASE, deleted=True)
    assert index.by_node == {} and index.by_uid == {}
