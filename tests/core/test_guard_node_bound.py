"""The update guard scopes the device plugin to its own node where the API server names it
(issue 49): a pod-bound service-account token carries ``authentication.kubernetes.io/node-name``
in ``userInfo.extra`` (Kubernetes 1.30+); without it (older clusters) the plugin is trusted
cluster-wide, as before."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from vgpu.core import config, guard
from vgpu.core.annotations import Keys

SCHEDULER = "system:serviceaccount:kube-vgpu:gpu-kube-vgpu-scheduler"
PLUGIN = "system:serviceaccount:kube-vgpu:gpu-kube-vgpu-device-plugin"
TRUSTED = guard.Trusted(
    users=frozenset({SCHEDULER}), groups=frozenset({"gpu-admins"}), node_bound=frozenset({PLUGIN})
)
KEYS = Keys()
EXTRA = "authentication.kubernetes.io/node-name"


def plugin(*nodes: Any, extra: Any = None) -> dict[str, Any]:
    user: dict[str, Any] = {"username": PLUGIN, "groups": ["system:serviceaccounts"]}
    if nodes:
        user["extra"] = {EXTRA: list(nodes), "authentication.kubernetes.io/pod-name": ["dp-x"]}
    if extra is not None:
        user["extra"] = extra
    return user


def pod_on(node: str | None) -> tuple[dict[str, Any], dict[str, Any]]:
    spec = {"nodeName": node} if node is not None else {}
    old: dict[str, Any] = {
        "metadata": {"name": "p", "namespace": "team", "annotations": {"hami.io/bind-phase": "allocating"}}
    }
    old["spec"] = spec
    new = copy.deepcopy(old)
    new["metadata"]["annotations"]["hami.io/bind-phase"] = "success"
    return new, old


def node(name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    old: dict[str, Any] = {"metadata": {"name": name, "annotations": {"hami.io/node-nvidia-register": "[]"}}}
    new = copy.deepcopy(old)
    new["metadata"]["annotations"]["hami.io/node-nvidia-register"] = '[{"id": "GPU-a"}]'
    return new, old


def decide(resource: guard.Resource, pair: tuple[Any, Any], user: Any) -> Any:
    new, old = pair
    return guard.decide(resource, obj=new, old=old, user_info=user, keys=KEYS, trusted=TRUSTED)


CASES = [
    # (id, resource, (new, old), userInfo, allowed)
    ("pod-on-own-node", "pods", pod_on("n1"), plugin("n1"), True),
    ("pod-on-another-node", "pods", pod_on("n2"), plugin("n1"), False),
    ("pod-not-bound", "pods", pod_on(None), plugin("n1"), False),
    ("pod-empty-node-name", "pods", pod_on(""), plugin("n1"), False),
    ("own-node-object", "nodes", node("n1"), plugin("n1"), True),
    ("another-node-object", "nodes", node("n2"), plugin("n1"), False),
    ("empty-list-names-no-node", "nodes", node("n1"), plugin(extra={EXTRA: []}), False),
    ("older-cluster-no-extra", "pods", pod_on("n2"), plugin(), True),
    ("older-cluster-node", "nodes", node("n2"), plugin(), True),
    ("other-extras-only", "nodes", node("n2"), plugin(extra={"scopes": ["x"]}), True),
    ("scheduler-anywhere", "pods", pod_on("n2"), {"username": SCHEDULER, "extra": {EXTRA: ["n1"]}}, True),
    (
        "bound-user-not-saved-by-a-group",
        "pods",
        pod_on("n2"),
        {**plugin("n1"), "groups": ["gpu-admins"]},
        False,
    ),
]


@pytest.mark.parametrize(
    ("resource", "pair", "user", "allowed"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_the_plugin_changes_only_its_own_nodes_pods_and_node(resource, pair, user, allowed):
    decision = decide(resource, pair, user)
    assert decision.allowed is allowed, decision.message
    if not allowed:
        assert (decision.code, decision.reason) == (403, "Forbidden")
        assert f"{PLUGIN} may not change it" in decision.message
        assert f"on their own node {PLUGIN}" in decision.message


def test_a_users_change_that_touches_no_owned_key_is_not_scoped():
    new, old = pod_on("n2")
    new["metadata"]["annotations"] = dict(old["metadata"]["annotations"])
    new["metadata"]["labels"] = {"app": "x"}
    assert decide("pods", (new, old), plugin("n1")).allowed


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("n1", "request.userInfo.extra: expected a map of string lists"),
        ({EXTRA: "n1"}, f"request.userInfo.extra[{EXTRA}]: expected a list of strings"),
        ({EXTRA: [1]}, f"request.userInfo.extra[{EXTRA}]: expected a list of strings"),
    ],
    ids=["extra-not-a-map", "node-name-not-a-list", "node-name-not-strings"],
)
def test_garbage_extra_of_a_node_bound_user_is_a_400(extra, message):
    decision = decide("pods", pod_on("n1"), plugin(extra=extra))
    assert (decision.allowed, decision.code, decision.message) == (False, 400, message)


def test_garbage_extra_of_anyone_else_is_not_read():
    user = {"username": SCHEDULER, "extra": "garbage"}
    assert decide("pods", pod_on("n1"), user).allowed


def test_from_config_reads_node_bound_users():
    cfg = config.load({"webhook": {"trustedUsers": [SCHEDULER], "nodeBoundUsers": [PLUGIN]}})
    assert guard.Trusted.from_config(cfg.webhook) == guard.Trusted(
        users=frozenset({SCHEDULER}), node_bound=frozenset({PLUGIN})
    )
