"""Every object the chart renders is valid Kubernetes, for 1.29 and the newest release the schema
package knows, for the default values and for HA + cert-manager; one template holds one object."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import yaml

from tests.deploy import rendering

kv = pytest.importorskip(
    "kubernetes_validate", reason="kubernetes-validate (dev dependency) is not installed"
)

SCHEMA_VERSIONS = ["1.29.0", kv.latest_version()]
CLUSTER_SCOPED = {
    "ClusterRole",
    "ClusterRoleBinding",
    "MutatingWebhookConfiguration",
    "Namespace",
    "ValidatingWebhookConfiguration",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
}
CRD_KINDS = {("cert-manager.io/v1", "Issuer"), ("cert-manager.io/v1", "Certificate")}
VALUE_SETS: dict[str, dict[str, Any] | None] = {
    "defaults": None,
    "ha-cert-manager": rendering.HA_CERT_MANAGER,
    "own-secret-all-pods-checked": {
        "tls": {"mode": "secret", "secret": {"name": "my-tls", "caBundle": "Q0EK"}},
        "webhook": {"objectSelectorSkipsIgnored": False},
    },
    "no-webhook-plain-http-no-priority": {
        "webhook": {"enabled": False},
        "guard": {"mode": "none"},
        "tls": {"mode": "none"},
        "scheduler": {"priorityClassName": ""},
        "devicePlugin": {"priorityClassName": ""},
    },
}


def _check_crd(obj: dict[str, Any]) -> None:
    """cert-manager kinds have no schema in kubernetes-validate: check the fields we rely on."""
    spec = obj["spec"]
    if obj["kind"] == "Issuer":
        assert spec == {"selfSigned": {}}
    else:
        assert set(spec) <= {
            "secretName",
            "duration",
            "renewBefore",
            "commonName",
            "dnsNames",
            "ipAddresses",
            "privateKey",
            "issuerRef",
        }
        assert spec["secretName"] and spec["dnsNames"] and spec["issuerRef"]["name"]
        assert re.fullmatch(r"\d+h", spec["duration"]) and re.fullmatch(r"\d+h", spec["renewBefore"])


@pytest.mark.parametrize("schema_version", SCHEMA_VERSIONS)
@pytest.mark.parametrize("values", list(VALUE_SETS.values()), ids=list(VALUE_SETS))
def test_every_object_validates_against_the_kubernetes_schema(values, schema_version):
    rendered = rendering.render(values, kube_version=f"v{schema_version}")
    assert rendered.objects
    problems = []
    for obj in rendered:
        if (obj["apiVersion"], obj["kind"]) in CRD_KINDS:
            _check_crd(obj)
            continue
        try:
            kv.validate(obj, schema_version, strict=True)
        except kv.ValidationError as exc:
            path = ".".join(str(p) for p in exc.path)
            problems.append(f"{obj['kind']}/{obj['metadata']['name']}: {path}: {exc.message}")
    assert not problems, "\n".join(problems)


def test_each_template_holds_at_most_one_object():
    for values in VALUE_SETS.values():
        for template, objs in rendering.render(values).by_template.items():
            assert len(objs) <= 1, f"{template} renders {len(objs)} objects"


def test_object_names_are_unique_per_kind_and_namespace():
    rendered = rendering.render(rendering.HA_CERT_MANAGER)
    keys = [(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]) for o in rendered]
    assert len(keys) == len(set(keys))


def test_default_install_has_both_services_and_their_plumbing():
    rendered = rendering.render()
    kinds = {o["kind"] for o in rendered}
    assert {
        "DaemonSet",
        "Deployment",
        "Service",
        "ConfigMap",
        "MutatingWebhookConfiguration",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "Job",
    } <= kinds
    assert "PodDisruptionBudget" not in kinds  # one replica: a PDB would block every drain
    assert not {"Issuer", "Certificate"} & kinds


def test_namespaced_objects_go_to_the_release_namespace():
    for obj in rendering.render(rendering.HA_CERT_MANAGER):
        ns = obj["metadata"].get("namespace")
        if obj["kind"] in CLUSTER_SCOPED:
            assert ns is None, obj["metadata"]["name"]
        elif obj["metadata"]["name"].endswith("-auth-reader"):
            assert ns == "kube-system"  # kube-scheduler reads the API server's client CA there
        elif obj["metadata"]["name"].endswith(("-scheduler-leases", "-device-plugin-leases")):
            assert ns == rendering.LEASE_NAMESPACE  # the device plugins' Leases: a namespace of their own
        else:
            assert ns == rendering.NAMESPACE, f"{obj['kind']}/{obj['metadata']['name']}"


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"tls": {"mode": "plaintext"}}, "at '/tls/mode': value must be one of"),
        ({"tls": {"mode": "none"}}, "webhook.enabled needs TLS"),
        ({"tls": {"mode": "secret"}}, "tls.secret.name is required"),
        ({"webhook": {"failurePolicy": "Maybe"}}, "at '/webhook/failurePolicy': value must be one of"),
        ({"webhook": {"timeoutSeconds": 31}}, "maximum: got 31, want 30"),
        (
            {"scheduler": {"replicas": 2, "leaderElection": {"enabled": False}}},
            "needs scheduler.leaderElection",
        ),
    ],
    ids=[
        "bad-tls-mode",
        "webhook-without-tls",
        "secret-without-name",
        "bad-failure-policy",
        "timeout-too-long",
        "ha-without-election",
    ],
)
def test_broken_value_combinations_fail_with_a_clear_message(values, message):
    assert message in rendering.render_error(values)


def test_chart_refuses_clusters_older_than_1_23():
    assert "needs Kubernetes 1.23 or newer" in rendering.render_error({}, kube_version="v1.22.9")
    rendering.render(kube_version="v1.23.0")


def test_values_yaml_documents_every_key():
    """Each key of values.yaml has a comment line directly above it (list items excepted)."""
    lines = (rendering.CHART_DIR / "values.yaml").read_text().splitlines()
    undocumented = []
    item_indent = -1  # keys continuing a list item ("- key: ...") are that item's fields
    for i, line in enumerate(lines):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        indent = len(line) - len(line.lstrip())
        if line.lstrip().startswith("- "):
            item_indent = indent + 2
            continue
        if indent < item_indent:
            item_indent = -1
        m = re.match(r"^\s*([A-Za-z][\w.-]*):", line)
        if not m or indent == item_indent:
            continue
        prev = lines[i - 1].strip() if i else ""
        if not prev.startswith("#"):
            undocumented.append(f"line {i + 1}: {line.strip()}")
    assert not undocumented, "values without a comment above them:\n" + "\n".join(undocumented)


@pytest.mark.parametrize("kube_version", ["v1.24.17", "v1.29.0"])
def test_helm_lint_strict_finds_nothing_above_info(kube_version):
    report = rendering.helm.lint(str(rendering.CHART_DIR), strict=True, kube_version=kube_version)
    assert report["errors"] == []
    serious = [m for m in report["messages"] if m["severity"] >= 2]  # 2 warning, 3 error
    assert not serious, serious


def test_manifest_parser_refuses_duplicate_keys():
    """Every render goes through this parser, so a template that repeats a key fails every test."""
    with pytest.raises(yaml.constructor.ConstructorError, match="duplicate key 'app'"):
        rendering.parse_manifest("metadata:\n  labels:\n    app: a\n    app: b\n")
    assert rendering.parse_manifest("a: 1\n---\nb: 2\n") == [{"a": 1}, {"b": 2}]


def _schema_paths(schema: dict[str, Any], prefix: str = "") -> set[str]:
    out = set()
    for key, sub in schema.get("properties", {}).items():
        path = f"{prefix}.{key}" if prefix else key
        out.add(path)
        out |= _schema_paths(sub, path)
    return out


def _value_paths(values: dict[str, Any], schema: dict[str, Any], prefix: str = "") -> set[str]:
    """Paths of values.yaml, not descending where the schema leaves an object free-form."""
    out = set()
    for key, value in values.items():
        path = f"{prefix}.{key}" if prefix else key
        out.add(path)
        sub = schema.get("properties", {}).get(key, {})
        if isinstance(value, dict) and "properties" in sub:
            out |= _value_paths(value, sub, path)
    return out


def test_values_schema_describes_exactly_the_keys_of_values_yaml():
    schema = json.loads((rendering.CHART_DIR / "values.schema.json").read_text())
    values = yaml.safe_load((rendering.CHART_DIR / "values.yaml").read_text())
    assert _value_paths(values, schema) == _schema_paths(schema)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"scheduler": {"replica": 2}}, "additional properties 'replica' not allowed"),
        ({"devicePlugin": {"nodeselector": {}}}, "additional properties 'nodeselector' not allowed"),
        ({"resourceNames": {"count": "gpu"}}, "does not match pattern"),
        ({"scheduler": {"replicas": 0}}, "minimum: got 0, want 1"),
        ({"scheduler": {"kubeScheduler": {"percentageOfNodesToScore": 101}}}, "maximum: got 101, want 100"),
    ],
    ids=["typo", "wrong-case", "bad-resource-name", "no-replicas", "percentage"],
)
def test_values_schema_rejects_typos_and_out_of_range_values(values, message):
    with rendering.helm.Chart.load(str(rendering.CHART_DIR)) as chart:
        chart.validate_schema(None)
        with pytest.raises(rendering.helm.HelmError, match=re.escape(message)):
            chart.validate_schema(values)
