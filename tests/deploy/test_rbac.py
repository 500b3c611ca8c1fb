"""RBAC is exactly what the code calls: the rules the chart grants each service equal the API calls
found in that service's source (``apicalls``), no more and no less; kube-scheduler gets the
built-in scheduler roles plus its own leader-election lease; nothing is cluster-admin."""

from __future__ import annotations

from typing import Any

import pytest

from tests.deploy import apicalls, rendering

SERVICES = {
    "vgpu-scheduler": ("vgpu_scheduler", f"{rendering.FULLNAME}-scheduler"),
    "vgpu-device-plugin": ("vgpu_device_plugin", f"{rendering.FULLNAME}-device-plugin"),
}
NAMESPACED_KINDS_WATCHED_IN_ONE_NAMESPACE = {"leases"}


def _expand(rules: list[dict[str, Any]]) -> set[apicalls.Permission]:
    return {
        apicalls.Permission(group, resource, verb)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def _bound_to(rendered: rendering.Rendered, role: dict[str, Any], service_account: str) -> bool:
    binding_kind = "ClusterRoleBinding" if role["kind"] == "ClusterRole" else "RoleBinding"
    for binding in rendered.of_kind(binding_kind):
        ref = binding["roleRef"]
        same_ns = binding["metadata"].get("namespace") == role["metadata"].get("namespace")
        if ref["kind"] == role["kind"] and ref["name"] == role["metadata"]["name"] and same_ns:
            subjects = {(s["kind"], s["name"], s["namespace"]) for s in binding["subjects"]}
            if subjects == {("ServiceAccount", service_account, rendering.NAMESPACE)}:
                return True
    return False


def _roles_for(rendered: rendering.Rendered, program: str) -> list[dict[str, Any]]:
    return [
        r
        for r in rendered.of_kind("ClusterRole") + rendered.of_kind("Role")
        if r["metadata"].get("annotations", {}).get("kube-vgpu.io/rbac-for") == program
    ]


@pytest.mark.parametrize("program", list(SERVICES))
def test_granted_rules_equal_the_calls_in_the_code(program):
    package, service_account = SERVICES[program]
    needed, sites, unresolved = apicalls.permissions(package)
    assert sites, f"found no API calls in {package}: the scanner is broken"
    # calls with a computed kind are only allowed in the generic machinery, whose callers name it
    stray = [
        f"{s.module}:{s.line} {s.call}"
        for s in unresolved
        if not s.module.startswith(apicalls.GENERIC_PACKAGE)
    ]
    assert not stray, "API calls whose kind the RBAC check cannot read (use a literal):\n" + "\n".join(stray)

    rendered = rendering.render({"dra": {"enabled": True}})  # every mode's rules: the code has them all
    roles = _roles_for(rendered, program)
    assert roles
    granted = set().union(*(_expand(r["rules"]) for r in roles))
    where = {p: [f"{s.module}:{s.line}" for s in sites if p in s.permissions] for p in needed}
    missing = sorted(needed - granted)
    extra = sorted(granted - needed)
    assert not missing, "calls the chart does not allow:\n" + "\n".join(f"{p} at {where[p]}" for p in missing)
    assert not extra, f"rules no code uses (least privilege): {extra}"
    for role in roles:
        assert _bound_to(rendered, role, service_account), (
            f"{role['kind']} {role['metadata']['name']} is not bound"
        )


@pytest.mark.parametrize("program", list(SERVICES))
def test_namespaced_grants_stay_in_their_namespace(program):
    rendered = rendering.render({"config": {"scheduler": {"leaseNamespace": "gpu-leases"}}})
    for role in _roles_for(rendered, program):
        kinds = {res for rule in role["rules"] for res in rule["resources"]}
        if role["kind"] == "Role":
            assert kinds <= NAMESPACED_KINDS_WATCHED_IN_ONE_NAMESPACE
            assert role["metadata"]["namespace"] == "gpu-leases"
        else:
            assert not kinds & NAMESPACED_KINDS_WATCHED_IN_ONE_NAMESPACE


def test_kube_scheduler_gets_the_builtin_scheduler_roles_and_its_own_lease():
    rendered = rendering.render()
    sa = f"{rendering.FULLNAME}-scheduler"
    bound = {
        (b["kind"], b["roleRef"]["kind"], b["roleRef"]["name"])
        for b in rendered.of_kind("ClusterRoleBinding") + rendered.of_kind("RoleBinding")
        if {s["name"] for s in b["subjects"]} == {sa}
    }
    assert {
        ("ClusterRoleBinding", "ClusterRole", "system:kube-scheduler"),
        ("ClusterRoleBinding", "ClusterRole", "system:volume-scheduler"),
        ("RoleBinding", "Role", "extension-apiserver-authentication-reader"),
    } <= bound
    (role,) = _roles_for(rendered, "kube-scheduler")
    ksc = rendering.embedded_yaml(rendered.one("ConfigMap", f"{rendering.FULLNAME}-kube-scheduler"))
    lease = ksc["leaderElection"]["resourceName"]
    assert role["metadata"]["namespace"] == ksc["leaderElection"]["resourceNamespace"]
    assert role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": [lease],
            "verbs": ["get", "update"],
        },
    ]
    assert _bound_to(rendered, role, sa)


@pytest.mark.parametrize("values", [None, rendering.HA_CERT_MANAGER], ids=["defaults", "ha-cert-manager"])
def test_nothing_is_a_wildcard_or_an_admin_role(values):
    rendered = rendering.render(values)
    for role in rendered.of_kind("ClusterRole") + rendered.of_kind("Role"):
        for rule in role["rules"]:
            for field in ("apiGroups", "resources", "nonResourceURLs", "verbs"):
                assert "*" not in rule.get(field, ()), f"{role['metadata']['name']}: {rule}"
            assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"])
            assert "secrets" not in rule.get("resources", ()) or role["metadata"]["name"].endswith("-certgen")
    for binding in rendered.of_kind("ClusterRoleBinding") + rendered.of_kind("RoleBinding"):
        assert binding["roleRef"]["name"] not in {"cluster-admin", "admin", "edit"}


def test_rbac_can_be_left_to_the_operator():
    kinds = {o["kind"] for o in rendering.render({"rbac": {"create": False}, "tls": {"mode": "certManager"}})}
    assert not kinds & {"ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}


def test_the_scanner_sees_calls_through_literals_constants_and_informers(tmp_path):
    """The scanner itself: each form of call it must recognise; a dict lookup by variable is no call."""
    mod = tmp_path / "probe.py"
    mod.write_text(
        "KIND = 'leases'\n"
        "async def f(api, informer, cache):\n"
        "    await api.get('nodes', 'n1')\n"
        "    await api.merge_patch('pods', 'p', {}, namespace='d')\n"
        "    await api.replace(KIND, {})\n"
        "    await api.bind_pod('d', 'p', node='n1')\n"
        "    await api.create_event(namespace='d', involved={}, reason='r', message='m')\n"
        "    informer.Informer(api, 'resourcequotas')\n"
        "    cache.get(key)\n"
        "    await api.delete(some_kind, 'x')\n"
        "    await api.get_resource_claim('ns', 'c')\n"
    )
    resolved, unresolved = apicalls.scan({"probe": mod})
    perms = {p for s in resolved for p in s.permissions}
    P = apicalls.Permission
    assert perms == {
        P("", "nodes", "get"),
        P("", "pods", "patch"),
        P("coordination.k8s.io", "leases", "update"),
        P("", "pods/binding", "create"),
        P("", "events", "create"),
        P("", "resourcequotas", "list"),
        P("", "resourcequotas", "watch"),
        P("resource.k8s.io", "resourceclaims", "get"),
    }
    assert [s.line for s in unresolved] == [10]
