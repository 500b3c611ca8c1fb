"""The update guard in the chart: webhook mode (a ValidatingWebhookConfiguration on pod and node
UPDATE, with CEL matchConditions on 1.28+) and policy mode (ValidatingAdmissionPolicy + binding,
1.30+). Both renderings validate against the Kubernetes schema, trust exactly the identities the
services run as, and their CEL, evaluated with cel-python, agrees with ``vgpu.core.guard`` on a
table of updates."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from vgpu.core import config, guard
from vgpu.core.annotations import Keys

from tests.deploy import rendering

celpy = pytest.importorskip("celpy", reason="cel-python (dev dependency) is not installed")
kv = pytest.importorskip(
    "kubernetes_validate", reason="kubernetes-validate (dev dependency) is not installed"
)

NS = rendering.NAMESPACE
SCHEDULER_SA = f"system:serviceaccount:{NS}:{rendering.FULLNAME}-scheduler"
PLUGIN_SA = f"system:serviceaccount:{NS}:{rendering.FULLNAME}-device-plugin"
POLICY = {"guard": {"mode": "policy"}}
KEYS = Keys()


def _trusted(rendered: rendering.Rendered) -> config.Config:
    return config.load(rendering.embedded_yaml(rendered.one("ConfigMap", f"{rendering.FULLNAME}-config")))


def test_the_services_own_service_accounts_are_trusted_and_extra_ones_added():
    rendered = rendering.render({"guard": {"extraUsers": ["ops-bot"], "extraGroups": ["gpu-admins"]}})
    accounts = {
        f"system:serviceaccount:{NS}:{sa['metadata']['name']}" for sa in rendered.of_kind("ServiceAccount")
    }
    assert {SCHEDULER_SA, PLUGIN_SA} <= accounts
    webhook = _trusted(rendered).webhook
    assert webhook.trusted_users == (SCHEDULER_SA, "ops-bot")
    assert webhook.node_bound_users == (PLUGIN_SA,)  # trusted on its own node only where named
    assert webhook.trusted_groups == ("gpu-admins",)
    assert _trusted(rendering.render()).webhook.trusted_groups == ("system:masters",)


def test_webhook_mode_sends_pod_and_node_updates_to_the_scheduler():
    rendered = rendering.render()
    vwc = rendered.one("ValidatingWebhookConfiguration")
    mutating = rendered.one("MutatingWebhookConfiguration")
    assert vwc["metadata"]["name"] == mutating["metadata"]["name"]  # certgen patches both
    pods, nodes = vwc["webhooks"]
    for hook, resource, scope in ((pods, "pods", "Namespaced"), (nodes, "nodes", "Cluster")):
        assert hook["clientConfig"] == mutating["webhooks"][0]["clientConfig"]
        assert hook["rules"] == [
            {
                "operations": ["UPDATE"],
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "resources": [resource],
                "scope": scope,
            }
        ]
        assert hook["sideEffects"] == "None"
    assert pods["failurePolicy"] == "Fail" and nodes["failurePolicy"] == "Ignore"
    assert "namespaceSelector" not in nodes
    assert (
        rendering.render({"guard": {"podFailurePolicy": "Ignore"}}).one("ValidatingWebhookConfiguration")[
            "webhooks"
        ][0]["failurePolicy"]
        == "Ignore"
    )
    assert not rendered.of_kind("ValidatingAdmissionPolicy")


def test_match_conditions_only_where_the_api_server_has_them():
    old = rendering.render(kube_version="v1.27.9").one("ValidatingWebhookConfiguration")
    assert all("matchConditions" not in h for h in old["webhooks"])
    new = rendering.render(kube_version="v1.28.0").one("ValidatingWebhookConfiguration")
    assert all(len(h["matchConditions"]) == 2 for h in new["webhooks"])


def test_certgen_patches_the_ca_into_the_guard_too():
    def patch_args(values: dict[str, Any] | None) -> list[str]:
        job = rendering.render(values).one("Job", f"{rendering.FULLNAME}-certgen-patch")
        args: list[str] = job["spec"]["template"]["spec"]["containers"][0]["args"]
        return args

    assert "--patch-validating=true" in patch_args(None)
    assert "--patch-validating=false" in patch_args({"guard": {"mode": "none"}})
    rules = rendering.render().one("ClusterRole", f"{rendering.FULLNAME}-certgen")["rules"]
    assert {"validatingwebhookconfigurations", "mutatingwebhookconfigurations"} == {
        r["resources"][0] for r in rules
    }


def test_policy_mode_renders_a_policy_and_a_binding_per_kind_and_no_webhook():
    rendered = rendering.render(POLICY, kube_version="v1.30.0")
    assert not rendered.of_kind("ValidatingWebhookConfiguration")
    policies = {p["metadata"]["name"]: p for p in rendered.of_kind("ValidatingAdmissionPolicy")}
    bindings = rendered.of_kind("ValidatingAdmissionPolicyBinding")
    assert {b["spec"]["policyName"] for b in bindings} == set(policies)
    assert all(b["spec"]["validationActions"] == ["Deny"] for b in bindings)
    pods = policies[f"{rendering.FULLNAME}-guard-pods"]["spec"]
    nodes = policies[f"{rendering.FULLNAME}-guard-nodes"]["spec"]
    assert (pods["failurePolicy"], nodes["failurePolicy"]) == ("Fail", "Ignore")
    assert len(pods["validations"]) == 7 and len(nodes["validations"]) == 4
    assert pods["validations"][-1]["message"].startswith(
        "label hami.io/vgpu-node is written by the GPU scheduler and device plugin only (allowed: users "
        f"{SCHEDULER_SA}; on their own node {PLUGIN_SA}; groups system:masters)"
    )


@pytest.mark.parametrize(
    ("values", "kube_version", "message"),
    [
        (POLICY, "v1.29.3", "guard.mode policy needs ValidatingAdmissionPolicy v1 (Kubernetes 1.30+)"),
        ({"webhook": {"enabled": False}}, "v1.29.3", "guard.mode webhook is served by the webhook"),
    ],
)
def test_impossible_guard_settings_fail_the_render(values, kube_version, message):
    assert message in rendering.render_error(values, kube_version=kube_version)


def test_guard_none_renders_nothing():
    rendered = rendering.render({"guard": {"mode": "none"}, "webhook": {"enabled": False}})
    kinds = {o["kind"] for o in rendered}
    assert not kinds & {"ValidatingWebhookConfiguration", "ValidatingAdmissionPolicy"}


@pytest.mark.parametrize("schema_version", ["1.30.0", kv.latest_version()])
@pytest.mark.parametrize("values", [None, POLICY, rendering.HA_CERT_MANAGER], ids=["webhook", "policy", "ha"])
def test_both_renderings_validate_against_the_schema(values, schema_version):
    rendered = rendering.render(values, kube_version=f"v{schema_version}")
    guards = [
        o for o in rendered if o["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "guard"
    ]
    assert guards
    for obj in guards:
        kv.validate(obj, schema_version, strict=True)


# --- the CEL against the Python rule ---------------------------------------------------------------

ALICE = {"username": "alice", "groups": ["system:authenticated"]}
ADMIN = {"username": "root", "groups": ["system:masters"]}


Case = tuple[str, guard.Resource, dict[str, Any], dict[str, Any], dict[str, Any]]
RESOURCES: tuple[guard.Resource, ...] = ("pods", "nodes")


def _cases() -> list[Case]:
    """(id, resource, new, old, userInfo) over every owned key, users' own keys and identities."""
    out: list[Case] = []
    for resource in RESOURCES:
        owned = [("annotations", k) for k in guard.owned_annotations(resource, KEYS)]
        owned += [("labels", k) for k in guard.owned_labels(resource, KEYS)]
        base: dict[str, Any] = {
            "metadata": {"name": "x", "annotations": {k: "v" for f, k in owned if f == "annotations"}}
        }
        base["metadata"]["labels"] = {k: "v" for f, k in owned if f == "labels"} | {"app": "a"}
        for field, key in owned:
            for change in ("modify", "remove", "add"):
                old, new = copy.deepcopy(base), copy.deepcopy(base)
                if change == "modify":
                    new["metadata"][field][key] = "forged"
                elif change == "remove":
                    del new["metadata"][field][key]
                else:
                    del old["metadata"][field][key]
                for who, user in (("alice", ALICE), ("sa", {"username": SCHEDULER_SA}), ("admin", ADMIN)):
                    out.append((f"{resource}-{key}-{change}-{who}", resource, new, old, user))
        own = copy.deepcopy(base)
        own["metadata"]["labels"]["app"] = "b"
        own["metadata"]["annotations"]["team.example/x"] = "y"
        out.append((f"{resource}-own-keys", resource, own, base, ALICE))
        bare: dict[str, Any] = {"metadata": {"name": "x"}}
        out.append((f"{resource}-no-maps", resource, bare, copy.deepcopy(bare), ALICE))
        added: dict[str, Any] = {"metadata": {"name": "x", "annotations": {owned[0][1]: "v"}}}
        out.append((f"{resource}-map-appears", resource, added, bare, {"username": "bob"}))
        out += _node_bound_cases(resource, base, owned[0])
    return out


NODE_EXTRA = "authentication.kubernetes.io/node-name"


def _node_bound_cases(resource: guard.Resource, base: dict[str, Any], key: tuple[str, str]) -> list[Case]:
    """The device plugin's change of an owned key on its own node, another node, an unbound pod,
    with and without the node name in its token (issue 49)."""
    out: list[Case] = []
    field, name = key
    for where in ("x", "y", None):
        old = copy.deepcopy(base)
        if resource == "pods":
            old["spec"] = {} if where is None else {"nodeName": where}
        elif where is None:
            continue
        else:
            old["metadata"]["name"] = where
        new = copy.deepcopy(old)
        new["metadata"][field][name] = "changed"
        for token, extra in (
            ("named-x", {NODE_EXTRA: ["x"], "authentication.kubernetes.io/pod-name": ["dp"]}),
            ("unnamed", None),
            ("other-extra", {"authentication.kubernetes.io/pod-name": ["dp"]}),
        ):
            user: dict[str, Any] = {"username": PLUGIN_SA, "groups": ["system:serviceaccounts"]}
            if extra is not None:
                user["extra"] = extra
            out.append((f"{resource}-plugin-{token}-on-{where}", resource, new, old, user))
    return out


CASES = _cases()


def _evaluate(expression: str, activation: dict[str, Any]) -> bool:
    env = celpy.Environment()
    program = env.program(env.compile(expression))
    return bool(program.evaluate({k: celpy.json_to_cel(v) for k, v in activation.items()}))


def _evaluate_string(expression: str, activation: dict[str, Any]) -> str:
    env = celpy.Environment()
    program = env.program(env.compile(expression))
    return str(program.evaluate({k: celpy.json_to_cel(v) for k, v in activation.items()}))


@pytest.fixture(scope="module")
def renderings() -> tuple[dict[str, Any], dict[str, Any]]:
    hooks = {
        h["name"].split(".")[0]: h
        for h in rendering.render().one("ValidatingWebhookConfiguration")["webhooks"]
    }
    policies = {
        p["spec"]["matchConstraints"]["resourceRules"][0]["resources"][0]: p["spec"]
        for p in rendering.render(POLICY, kube_version="v1.30.0").of_kind("ValidatingAdmissionPolicy")
    }
    return hooks, policies


@pytest.mark.parametrize(
    ("resource", "new", "old", "user"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_the_cel_agrees_with_the_python_rule(renderings, resource, new, old, user):
    hooks, policies = renderings
    trusted = guard.Trusted(
        frozenset({SCHEDULER_SA}), frozenset({"system:masters"}), node_bound=frozenset({PLUGIN_SA})
    )
    allowed = guard.decide(resource, obj=new, old=old, user_info=user, keys=KEYS, trusted=trusted).allowed
    activation = {"object": new, "oldObject": old, "request": {"userInfo": user}}
    sent = all(_evaluate(c["expression"], activation) for c in hooks[resource]["matchConditions"])
    assert sent == (not allowed), "webhook matchConditions"  # sent only what the webhook refuses
    policy = policies[resource]
    applies = all(_evaluate(c["expression"], activation) for c in policy["matchConditions"])
    passes = all(_evaluate(v["expression"], activation) for v in policy["validations"])
    assert (not applies or passes) == allowed, "ValidatingAdmissionPolicy"
    if applies and not passes:  # the message names the key and the requester, as the webhook's does
        failed = next(v for v in policy["validations"] if not _evaluate(v["expression"], activation))
        message = _evaluate_string(failed["messageExpression"], activation)
        assert message == failed["message"].replace(
            " only (", f" only; {user['username']} may not change it ("
        )
        assert guard.decide(
            resource, obj=new, old=old, user_info=user, keys=KEYS, trusted=trusted
        ).message.endswith(message.partition("only; ")[2])


def test_the_benchs_guard_is_the_charts_before_1_28():
    """``vgpu.demo.webhookconfig.guard_configuration`` (the throughput bench's ``--webhooks chart``) is what the
    chart renders before 1.28, but for where it sends the calls."""
    from vgpu.demo import webhookconfig

    rendered = rendering.render(kube_version="v1.27.9").one("ValidatingWebhookConfiguration")
    ours = webhookconfig.guard_configuration("https://127.0.0.1:1/webhook", b"ca", release_namespace=NS)
    for hooks in (rendered["webhooks"], ours["webhooks"]):
        for hook in hooks:
            hook.pop("clientConfig")
            hook.pop("timeoutSeconds")  # the chart's webhook.timeoutSeconds; ours 10 s, the Go default
    assert ours["webhooks"] == rendered["webhooks"]
