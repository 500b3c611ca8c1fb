"""Handoffs: which pods are between their Binding and Allocate, per node, and the in-memory claims."""

from __future__ import annotations

from typing import Any

import pytest
from vgpu.core import annotations
from vgpu_scheduler.handoffs import Handoffs

KEYS = annotations.KEYS
NOW = 1_700_000_000.0


def pod(
    uid: str,
    *,
    node: str | None = "n1",
    phase: str | None = "allocating",
    status: str = "Pending",
    bind_time: str | None = None,
    name: str | None = None,
    namespace: str = "default",
) -> dict[str, Any]:
    notes: dict[str, str] = {}
    if phase is not None:
        notes[KEYS.bind_phase] = phase
        notes[KEYS.bind_time] = bind_time if bind_time is not None else str(int(NOW))
    spec = {"nodeName": node} if node else {}
    meta = {"uid": uid, "name": name or uid, "namespace": namespace, "annotations": notes}
    return {"metadata": meta, "spec": spec, "status": {"phase": status}}


@pytest.mark.parametrize(
    ("obj", "busy"),
    [
        (pod("a"), {"n1"}),
        (pod("a", phase="success"), set()),
        (pod("a", phase="failed"), set()),
        (pod("a", status="Running"), set()),
        (pod("a", status="Succeeded"), set()),
        (pod("a", node=None), set()),
        (pod("a", phase=None), set()),
    ],
    ids=["allocating", "success", "failed", "running", "finished", "not-bound", "not-a-gpu-pod"],
)
def test_only_bound_allocating_pods_make_a_node_busy(obj: dict[str, Any], busy: set[str]) -> None:
    h = Handoffs(KEYS)
    assert set(h.pod(obj, deleted=False)) == busy
    assert h.nodes() == busy


def test_a_pod_leaves_the_node_when_allocated_deleted_or_moved() -> None:
    h = Handoffs(KEYS)
    h.pod(pod("a"), deleted=False)
    assert list(h.pod(pod("a", phase="success"), deleted=False)) == ["n1"]
    assert h.nodes() == set()
    h.pod(pod("b"), deleted=False)
    assert list(h.pod(pod("b"), deleted=True)) == ["n1"]
    h.pod(pod("c"), deleted=False)
    assert set(h.pod(pod("c", node="n2"), deleted=False)) == {"n1", "n2"}
    assert h.nodes() == {"n2"}


def test_others_lists_every_pod_still_allocating_however_old_oldest_first() -> None:
    """An old ``allocating`` pod may still get its Allocate (kubelet was down): it is never left
    out, so no other pod is handed over beside it."""
    h = Handoffs(KEYS)
    h.pod(pod("old", bind_time=str(int(NOW - 3600))), deleted=False)
    h.pod(pod("b", bind_time=str(int(NOW - 5))), deleted=False)
    h.pod(pod("a", bind_time=str(int(NOW - 10))), deleted=False)
    h.pod(pod("garbage", bind_time="not-a-time"), deleted=False)  # unreadable: taken as oldest
    assert h.others("n1", "me", now=NOW, claim_timeout_s=60) == ["garbage", "old", "a", "b"]
    assert h.others("n1", "a", now=NOW, claim_timeout_s=60) == ["garbage", "old", "b"]  # never itself
    assert h.others("n2", "me", now=NOW, claim_timeout_s=60) == []


def test_a_claim_holds_the_node_until_the_watch_shows_the_pod_bound() -> None:
    h = Handoffs(KEYS)
    h.claim("n1", "a", now=NOW)
    assert h.others("n1", "b", now=NOW + 1, claim_timeout_s=60) == ["a"]
    assert h.others("n1", "a", now=NOW + 1, claim_timeout_s=60) == []
    assert h.nodes() == {"n1"}
    h.pod(pod("a", node=None, phase=None), deleted=False)  # an event from before the Binding
    assert h.others("n1", "b", now=NOW + 1, claim_timeout_s=60) == ["a"]
    h.pod(pod("a"), deleted=False)  # the Binding came back: the allocating entry takes over
    assert h.others("n1", "b", now=NOW + 1, claim_timeout_s=60) == ["a"]
    h.pod(pod("a", phase="success"), deleted=False)
    assert h.others("n1", "b", now=NOW + 1, claim_timeout_s=60) == []
    assert h.nodes() == set()


def test_a_claim_is_released_by_a_failed_bind_and_a_leftover_one_is_ignored() -> None:
    h = Handoffs(KEYS)
    h.claim("n1", "a", now=NOW)
    h.release("n1", "other")  # not its claim: kept
    assert h.nodes() == {"n1"}
    assert h.others("n1", "b", now=NOW + 61, claim_timeout_s=60) == []  # past the timeout: a leftover
    h.release("n1", "a")
    assert h.nodes() == set()


@pytest.mark.parametrize(
    "obj",
    [
        {},
        {"metadata": None, "spec": None, "status": None},
        {"metadata": {"uid": "x", "annotations": {}}, "spec": {"nodeName": ""}},
    ],
    ids=["empty", "nulls", "no-node"],
)
def test_garbage_pods_change_nothing(obj: dict[str, Any]) -> None:
    h = Handoffs(KEYS)
    assert list(h.pod(obj, deleted=False)) == []
    assert h.nodes() == set()
