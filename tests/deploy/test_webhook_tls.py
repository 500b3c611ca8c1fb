"""The MutatingWebhookConfiguration reaches our container's /webhook through the Service, with the
fields docs/protocol.md#webhook-configuration requires, and each of the three TLS sources ends in the Secret the pod
mounts and the CA the webhook trusts."""

from __future__ import annotations

from typing import Any

import pytest

from tests.deploy import rendering

SVC = f"{rendering.FULLNAME}-scheduler"
SECRET = f"{rendering.FULLNAME}-scheduler-tls"
WEBHOOK = f"{rendering.FULLNAME}-webhook"
IGNORE = {"key": "hami.io/webhook", "operator": "NotIn", "values": ["ignore"]}


def _webhook(rendered: rendering.Rendered) -> dict[str, Any]:
    hooks: list[dict[str, Any]] = rendered.one("MutatingWebhookConfiguration", WEBHOOK)["webhooks"]
    assert len(hooks) == 1
    return hooks[0]


def _port_of(container: dict[str, Any], name_or_number: str | int) -> int:
    if isinstance(name_or_number, int):
        return name_or_number
    (port,) = [p["containerPort"] for p in container["ports"] if p["name"] == name_or_number]
    return int(port)


def test_webhook_reaches_our_container_through_the_service():
    rendered = rendering.render()
    hook = _webhook(rendered)
    ref = hook["clientConfig"]["service"]
    assert (ref["name"], ref["namespace"], ref["path"]) == (SVC, rendering.NAMESPACE, "/webhook")
    svc = rendered.one("Service", SVC)
    (svc_port,) = [p for p in svc["spec"]["ports"] if p["port"] == ref["port"]]
    ours = rendered.container("Deployment", "vgpu-scheduler")
    target = _port_of(ours, svc_port["targetPort"])
    listen = next(a for a in ours["command"] if a.startswith("--port="))
    assert target == int(listen.partition("=")[2]) == 8443
    pod_labels = rendered.one("Deployment")["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= pod_labels.items()


def test_webhook_fields_follow_the_protocol():
    hook = _webhook(rendering.render())
    assert hook["admissionReviewVersions"] == ["v1", "v1beta1"]
    assert hook["sideEffects"] == "NoneOnDryRun"  # the DRA mode creates templates, never on a dry run
    # Fail by default: a GPU pod never skips the webhook (and its anti-forgery check) while we are
    # down; kube-system and the release namespace are never sent, so the cluster can always recover
    assert hook["failurePolicy"] == "Fail"
    assert hook["timeoutSeconds"] == 10
    assert hook["rules"] == [
        {
            "operations": ["CREATE"],
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "resources": ["pods"],
            "scope": "Namespaced",
        }
    ]
    assert hook["namespaceSelector"]["matchExpressions"] == [
        IGNORE,
        _names_not_in("kube-system", rendering.NAMESPACE),
    ]
    # pods labelled ignore are still sent (and left unmodified): skipping them in the objectSelector
    # would let any pod creator pass forged scheduler annotations, which the guard (UPDATE) never sees
    assert hook["objectSelector"] == {}


def _names_not_in(*names: str) -> dict[str, Any]:
    return {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": list(names)}


def test_webhook_options_are_configurable():
    values = {
        "webhook": {
            "failurePolicy": "Ignore",
            "timeoutSeconds": 5,
            "excludeNamespaces": ["kube-system", "gpu-operator"],
            "objectSelectorExpressions": [{"key": "team", "operator": "Exists"}],
        }
    }
    hook = _webhook(rendering.render(values))
    assert (hook["failurePolicy"], hook["timeoutSeconds"]) == ("Ignore", 5)
    assert hook["namespaceSelector"]["matchExpressions"] == [
        IGNORE,
        _names_not_in("kube-system", "gpu-operator", rendering.NAMESPACE),
    ]
    assert hook["objectSelector"]["matchExpressions"] == [{"key": "team", "operator": "Exists"}]


def test_every_pod_can_be_sent_to_the_anti_forgery_check():
    values = {
        "webhook": {
            "objectSelectorSkipsIgnored": False,
            "excludeReleaseNamespace": False,
            "excludeKubeSystem": False,
        }
    }
    hook = _webhook(rendering.render(values))
    assert hook["objectSelector"] == {}
    assert hook["namespaceSelector"]["matchExpressions"] == [IGNORE]


def test_our_own_pods_are_never_sent_to_our_webhook():
    rendered = rendering.render({"webhook": {"objectSelectorSkipsIgnored": False}})
    hook = _webhook(rendered)
    assert _names_not_in("kube-system", rendering.NAMESPACE) in hook["namespaceSelector"]["matchExpressions"]
    for obj in rendered.of_kind("Deployment") + rendered.of_kind("DaemonSet") + rendered.of_kind("Job"):
        assert obj["metadata"]["namespace"] == rendering.NAMESPACE
        labels = obj["spec"]["template"]["metadata"]["labels"]
        assert labels.get("hami.io/webhook") == "ignore", obj["metadata"]["name"]


def test_webhook_disabled_renders_no_webhook_and_no_patch_job():
    rendered = rendering.render({"webhook": {"enabled": False}, "guard": {"mode": "none"}})
    assert not rendered.of_kind("MutatingWebhookConfiguration")
    assert [j["metadata"]["name"] for j in rendered.of_kind("Job")] == [
        f"{rendering.FULLNAME}-certgen-create"
    ]


def _args(job: dict[str, Any]) -> dict[str, str]:
    (container,) = job["spec"]["template"]["spec"]["containers"]
    return {a.partition("=")[0]: a.partition("=")[2] for a in container["args"][1:]}


def test_certgen_makes_the_secret_before_install_and_patches_the_ca_after():
    rendered = rendering.render()
    create = rendered.one("Job", f"{rendering.FULLNAME}-certgen-create")
    patch = rendered.one("Job", f"{rendering.FULLNAME}-certgen-patch")
    assert create["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    assert patch["metadata"]["annotations"]["helm.sh/hook"] == "post-install,post-upgrade"
    made, patched = _args(create), _args(patch)
    assert made["--secret-name"] == patched["--secret-name"] == SECRET
    assert (made["--cert-name"], made["--key-name"]) == ("tls.crt", "tls.key")
    hosts = made["--host"].split(",")
    assert f"{SVC}.{rendering.NAMESPACE}.svc" in hosts
    assert f"{SVC}.{rendering.NAMESPACE}.svc.cluster.local" in hosts
    assert patched["--webhook-name"] == WEBHOOK
    assert patched["--patch-mutating"] == "true"
    assert "--patch-failure-policy" not in patched  # the chart's failurePolicy stays as configured
    role = rendered.one("ClusterRole", f"{rendering.FULLNAME}-certgen")
    assert role["rules"] == [
        {
            "apiGroups": ["admissionregistration.k8s.io"],
            "resources": ["mutatingwebhookconfigurations"],
            "resourceNames": [WEBHOOK],
            "verbs": ["get", "update"],
        },
        {  # the update guard's ValidatingWebhookConfiguration has the same name
            "apiGroups": ["admissionregistration.k8s.io"],
            "resources": ["validatingwebhookconfigurations"],
            "resourceNames": [WEBHOOK],
            "verbs": ["get", "update"],
        },
    ]
    # every certgen object is a hook, so it exists before the Jobs and is gone after them
    for obj in rendered:
        if obj["metadata"]["name"].startswith(f"{rendering.FULLNAME}-certgen"):
            assert "helm.sh/hook" in obj["metadata"].get("annotations", {}), obj["kind"]
    assert "caBundle" not in _webhook(rendered)["clientConfig"]  # the patch Job writes it


def test_cert_manager_issues_the_mounted_secret_and_injects_the_ca():
    rendered = rendering.render(rendering.HA_CERT_MANAGER)
    assert not rendered.of_kind("Job")
    cert = rendered.one("Certificate")
    issuer = rendered.one("Issuer")
    assert cert["spec"]["secretName"] == SECRET
    assert cert["spec"]["issuerRef"] == {
        "name": issuer["metadata"]["name"],
        "kind": "Issuer",
        "group": "cert-manager.io",
    }
    assert f"{SVC}.{rendering.NAMESPACE}.svc" in cert["spec"]["dnsNames"]
    webhook = rendered.one("MutatingWebhookConfiguration")
    inject = webhook["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
    assert inject == f"{rendering.NAMESPACE}/{cert['metadata']['name']}"
    assert _webhook(rendered)["failurePolicy"] == "Fail"
    volumes = rendered.one("Deployment")["spec"]["template"]["spec"]["volumes"]
    assert {"name": "tls", "secret": {"secretName": SECRET}} in volumes


def test_cert_manager_can_use_an_existing_cluster_issuer():
    values = {
        "tls": {
            "mode": "certManager",
            "certManager": {"issuerRef": {"name": "corp-ca", "kind": "ClusterIssuer"}},
        }
    }
    rendered = rendering.render(values)
    assert not rendered.of_kind("Issuer")
    assert rendered.one("Certificate")["spec"]["issuerRef"] == {
        "name": "corp-ca",
        "kind": "ClusterIssuer",
        "group": "cert-manager.io",
    }


def test_user_secret_is_mounted_and_its_ca_trusted():
    values = {"tls": {"mode": "secret", "secret": {"name": "my-tls", "caBundle": "Q0EgUEVN"}}}
    rendered = rendering.render(values)
    assert not rendered.of_kind("Job") and not rendered.of_kind("Certificate")
    assert _webhook(rendered)["clientConfig"]["caBundle"] == "Q0EgUEVN"
    volumes = rendered.one("Deployment")["spec"]["template"]["spec"]["volumes"]
    assert {"name": "tls", "secret": {"secretName": "my-tls"}} in volumes


@pytest.mark.parametrize("mode", ["certgen", "certManager", "secret"])
def test_every_tls_mode_serves_https(mode):
    values: dict[str, Any] = {"tls": {"mode": mode, "secret": {"name": "s", "caBundle": "Q0E="}}}
    ours = rendering.render(values).container("Deployment", "vgpu-scheduler")
    assert ours["ports"][0]["name"] == "https"
    assert any(a.startswith("--tls-cert-file=") for a in ours["command"])


def test_skipping_pods_labelled_ignore_is_opt_in():
    hook = _webhook(rendering.render({"webhook": {"objectSelectorSkipsIgnored": True}}))
    assert hook["objectSelector"]["matchExpressions"] == [IGNORE]


def test_the_ignore_label_follows_the_annotation_prefix():
    """The webhook honours ``<annotationPrefix>/webhook=ignore``: the selectors and our own pods'
    labels use the same key, not HAMi's when the prefix is another."""
    rendered = rendering.render(
        {"config": {"annotationPrefix": "gpu.example.com"}, "webhook": {"objectSelectorSkipsIgnored": True}}
    )
    ignore = {**IGNORE, "key": "gpu.example.com/webhook"}
    hook = _webhook(rendered)
    assert hook["namespaceSelector"]["matchExpressions"][0] == ignore
    assert hook["objectSelector"]["matchExpressions"] == [ignore]
    for obj in rendered.of_kind("Deployment") + rendered.of_kind("DaemonSet") + rendered.of_kind("Job"):
        labels = obj["spec"]["template"]["metadata"]["labels"]
        assert labels.get("gpu.example.com/webhook") == "ignore" and "hami.io/webhook" not in labels
