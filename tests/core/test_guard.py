"""The UPDATE guard (core/guard.py), table-driven: each owned key, users' own keys, trusted
identities and groups, and garbage in every input."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from vgpu.core import config, guard
from vgpu.core.annotations import Keys

SCHEDULER = "system:serviceaccount:kube-vgpu:gpu-kube-vgpu-scheduler"
PLUGIN = "system:serviceaccount:kube-vgpu:gpu-kube-vgpu-device-plugin"
TRUSTED = guard.Trusted(users=frozenset({SCHEDULER, PLUGIN}), groups=frozenset({"gpu-admins"}))
KEYS = Keys()
ALICE = {"username": "alice", "groups": ["system:authenticated", "team-a"]}

POD_ANNOTATIONS = {
    "hami.io/vgpu-node": "n1",
    "hami.io/vgpu-time": "1700000000",
    "hami.io/vgpu-devices-to-allocate": "GPU-a,NVIDIA,3000,30:;",
    "hami.io/vgpu-devices-allocated": "GPU-a,NVIDIA,3000,30:;",
    "hami.io/bind-phase": "allocating",
    "hami.io/bind-time": "1700000000",
    "team.example/owner": "alice",
}
NODE_ANNOTATIONS = {
    "hami.io/node-nvidia-register": "[]",
    "hami.io/node-nvidia-plugin-error": "no driver",
    "hami.io/node-nvidia-outside-usage": '{"GPU-a": 512}',
    "hami.io/mutex.lock": "2026-01-01T00:00:00Z,team,p",
    "team.example/rack": "r1",
}


def obj(annotations: dict[str, Any] | None = None, labels: dict[str, Any] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "p", "namespace": "team"}
    if annotations is not None:
        meta["annotations"] = annotations
    if labels is not None:
        meta["labels"] = labels
    return {"apiVersion": "v1", "metadata": meta, "spec": {}}


def pod_pair() -> tuple[dict[str, Any], dict[str, Any]]:
    old = obj(dict(POD_ANNOTATIONS), {"hami.io/vgpu-node": "n1", "app": "train"})
    return old, copy.deepcopy(old)


def decide(resource: guard.Resource, new: Any, old: Any, user: Any = ALICE) -> Any:
    return guard.decide(resource, obj=new, old=old, user_info=user, keys=KEYS, trusted=TRUSTED)


OWNED_POD_ANNOTATIONS = [k for k in POD_ANNOTATIONS if k.startswith("hami.io/")]


@pytest.mark.parametrize("key", OWNED_POD_ANNOTATIONS)
@pytest.mark.parametrize("change", ["modify", "remove", "add"])
def test_a_user_may_not_change_an_owned_pod_annotation(key, change):
    old, new = pod_pair()
    if change == "modify":
        new["metadata"]["annotations"][key] = "forged"
    elif change == "remove":
        del new["metadata"]["annotations"][key]
    else:
        del old["metadata"]["annotations"][key]
    d = decide("pods", new, old)
    assert (d.allowed, d.code, d.reason) == (False, 403, "Forbidden")
    assert d.message.startswith(f"pod team/p: annotation {key} is written by the GPU scheduler")
    assert "alice may not change it" in d.message
    assert SCHEDULER in d.message and "gpu-admins" in d.message


def test_the_vgpu_node_label_is_owned_too_and_every_change_is_named():
    old, new = pod_pair()
    new["metadata"]["labels"]["hami.io/vgpu-node"] = "n2"
    new["metadata"]["annotations"]["hami.io/vgpu-devices-allocated"] = ""
    d = decide("pods", new, old)
    assert not d.allowed
    assert d.message.startswith(
        "pod team/p: annotation hami.io/vgpu-devices-allocated, label hami.io/vgpu-node are written"
    )
    assert "may not change them" in d.message


@pytest.mark.parametrize(
    "edit",
    [
        pytest.param(lambda m: m["annotations"].update({"team.example/owner": "bob"}), id="own-annotation"),
        pytest.param(lambda m: m["labels"].update({"app": "serve"}), id="own-label"),
        pytest.param(lambda m: m["labels"].pop("app"), id="remove-own-label"),
        pytest.param(lambda m: m.update(finalizers=["x"]), id="finalizers"),
        pytest.param(
            lambda m: m["annotations"].update({"hami.io/gpu-type": "A100"}), id="user-hami-annotation"
        ),
        pytest.param(lambda m: m["annotations"].update({"other.io/vgpu-node": "n9"}), id="other-prefix"),
        pytest.param(lambda m: None, id="no-change"),
    ],
)
def test_a_user_may_change_everything_else(edit):
    old, new = pod_pair()
    edit(new["metadata"])
    assert decide("pods", new, old).allowed


@pytest.mark.parametrize(
    "user",
    [
        pytest.param({"username": SCHEDULER, "groups": ["system:serviceaccounts"]}, id="scheduler"),
        pytest.param({"username": PLUGIN}, id="device-plugin-no-groups"),
        pytest.param(
            {"username": "carol", "groups": ["system:authenticated", "gpu-admins"]}, id="extra-group"
        ),
    ],
)
def test_trusted_identities_may_change_owned_keys(user):
    old, new = pod_pair()
    new["metadata"]["annotations"]["hami.io/vgpu-devices-to-allocate"] = "GPU-b,NVIDIA,1000,10:;"
    new["metadata"]["labels"]["hami.io/vgpu-node"] = "n2"
    assert decide("pods", new, old, user).allowed


def test_a_username_that_looks_like_a_group_or_a_service_account_elsewhere_is_not_trusted():
    old, new = pod_pair()
    new["metadata"]["annotations"]["hami.io/bind-phase"] = "success"
    for user in (
        {"username": "gpu-admins"},
        {"username": "system:serviceaccount:other:gpu-kube-vgpu-scheduler"},
        {"username": "alice", "groups": [SCHEDULER]},
    ):
        assert not decide("pods", new, old, user).allowed, user


@pytest.mark.parametrize("key", [k for k in NODE_ANNOTATIONS if k.startswith("hami.io/")])
def test_node_annotations_owned_by_the_services(key):
    old = obj(dict(NODE_ANNOTATIONS), {"kubernetes.io/hostname": "n1"})
    new = copy.deepcopy(old)
    new["metadata"]["annotations"][key] = "forged"
    d = decide("nodes", new, old, {"username": "system:node:n1", "groups": ["system:nodes"]})
    assert (d.allowed, d.code) == (False, 403)
    assert d.message.startswith(f"node p: annotation {key} is written by")
    assert decide("nodes", new, old, {"username": PLUGIN}).allowed


def test_node_labels_and_status_are_not_guarded():
    old = obj(dict(NODE_ANNOTATIONS), {"hami.io/vgpu-node": "x"})
    new = copy.deepcopy(old)
    new["metadata"]["labels"]["hami.io/vgpu-node"] = "y"
    new["metadata"]["annotations"]["team.example/rack"] = "r2"
    new["status"] = {"conditions": []}
    assert decide("nodes", new, old, {"username": "system:node:n1"}).allowed


def test_an_unchanged_update_is_allowed_without_reading_who_asks():
    """The cheap path: kubelets and controllers are never refused for a garbage userInfo."""
    old, new = pod_pair()
    new["spec"]["activeDeadlineSeconds"] = 5
    assert decide("pods", new, old, user=None).allowed


def test_no_trusted_identity_configured_says_so():
    old, new = pod_pair()
    new["metadata"]["annotations"]["hami.io/vgpu-time"] = "1"
    d = guard.decide("pods", obj=new, old=old, user_info=ALICE, keys=KEYS, trusted=guard.Trusted())
    assert not d.allowed and "nobody is configured (webhook.trustedUsers" in d.message


def test_the_prefix_follows_the_config():
    keys = Keys("gpu.example.com")
    old = obj({"gpu.example.com/vgpu-devices-to-allocate": "a", "hami.io/vgpu-devices-to-allocate": "a"})
    new = copy.deepcopy(old)
    new["metadata"]["annotations"]["hami.io/vgpu-devices-to-allocate"] = "b"
    assert guard.decide("pods", obj=new, old=old, user_info=ALICE, keys=keys, trusted=TRUSTED).allowed
    new["metadata"]["annotations"]["gpu.example.com/vgpu-devices-to-allocate"] = "b"
    assert not guard.decide("pods", obj=new, old=old, user_info=ALICE, keys=keys, trusted=TRUSTED).allowed


def test_trusted_comes_from_the_config():
    cfg = config.load({"webhook": {"trustedUsers": [SCHEDULER], "trustedGroups": ["g"]}})
    assert guard.Trusted.from_config(cfg.webhook) == guard.Trusted(frozenset({SCHEDULER}), frozenset({"g"}))
    assert config.load(None).webhook.trusted_users == ()


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        ({"trustedUsers": "alice"}, "webhook.trustedUsers"),
        ({"trustedGroups": [1]}, "webhook.trustedGroups[0]"),
    ],
)
def test_trusted_config_garbage_names_the_key(raw, key):
    with pytest.raises(Exception, match=key.replace("[", r"\[").replace("]", r"\]")):
        config.load({"webhook": raw})


FORGED = obj({"hami.io/vgpu-devices-allocated": "forged"})


@pytest.mark.parametrize(
    ("new", "old", "user", "message"),
    [
        pytest.param(FORGED, None, ALICE, "request.oldObject: required for UPDATE", id="missing-old-object"),
        pytest.param([], obj(), ALICE, "request.object: expected an object", id="object-not-a-map"),
        pytest.param(FORGED, "x", ALICE, "request.oldObject: expected an object", id="old-not-a-map"),
        pytest.param(
            {"metadata": []}, obj(), ALICE, "request.object.metadata: expected an object", id="metadata-list"
        ),
        pytest.param(
            obj({"hami.io/bind-phase": 5}),
            obj(),
            ALICE,
            "request.object.metadata.annotations: expected a map of strings",
            id="non-string-annotation",
        ),
        pytest.param(
            obj(),
            obj(labels={"hami.io/vgpu-node": None}),
            ALICE,
            "request.oldObject.metadata.labels: expected a map of strings",
            id="non-string-old-label",
        ),
        pytest.param(FORGED, obj(), None, "request.userInfo: expected an object", id="missing-user-info"),
        pytest.param(
            FORGED,
            obj(),
            {"groups": ["g"]},
            "request.userInfo.username: expected a non-empty",
            id="no-username",
        ),
        pytest.param(
            FORGED,
            obj(),
            {"username": 7},
            "request.userInfo.username: expected a non-empty",
            id="username-int",
        ),
        pytest.param(
            FORGED,
            obj(),
            {"username": "a", "groups": "gpu-admins"},
            "request.userInfo.groups: expected a list of strings",
            id="groups-string",
        ),
    ],
)
def test_garbage_is_refused_with_the_field_named(new, old, user, message):
    d = decide("pods", new, old, user)
    assert (d.allowed, d.code, d.reason) == (False, 400, "BadRequest")
    assert d.message.startswith(message)


def test_absent_metadata_counts_as_no_annotations():
    assert decide("pods", {"spec": {}}, {"metadata": None}).allowed
    d = decide("pods", {"metadata": {"annotations": None}}, obj({"hami.io/vgpu-time": "1"}))
    assert not d.allowed and "annotation hami.io/vgpu-time" in d.message
