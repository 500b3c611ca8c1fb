"""The admission webhook configurations the Helm chart installs, for the stacks that run without it.

``webhook_configuration``: the MutatingWebhookConfiguration of ``/webhook``;
``guard_configuration``: the update guard's ValidatingWebhookConfiguration (``guard.mode: webhook``).
Both point at a URL with a CA bundle instead of the chart's Service.
"""

from __future__ import annotations

import base64

from vgpu.core import annotations as hami
from vgpu.kube.port import JsonObj


def webhook_configuration(url: str, ca_pem: bytes, keys: hami.Keys) -> JsonObj:
    """The MutatingWebhookConfiguration the Helm chart installs (deploy/helm/kube-vgpu/templates/
    webhook.yaml), with ``url`` for its Service and ``ca_pem`` as caBundle."""
    ignore = {"key": keys.webhook_ignore_label, "operator": "NotIn", "values": ["ignore"]}
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "kube-vgpu-webhook"},
        "webhooks": [
            {
                "name": "vgpu.kube-vgpu.io",
                "clientConfig": {"url": url, "caBundle": base64.b64encode(ca_pem).decode()},
                "rules": [
                    {
                        "operations": ["CREATE"],
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "resources": ["pods"],
                    }
                ],
                "failurePolicy": "Fail",
                "sideEffects": "None",
                "admissionReviewVersions": ["v1", "v1beta1"],
                "timeoutSeconds": 10,
                "namespaceSelector": {"matchExpressions": [ignore]},
                "objectSelector": {"matchExpressions": [ignore]},
            }
        ],
    }


def guard_configuration(url: str, ca_pem: bytes, *, release_namespace: str) -> JsonObj:
    """The update guard's ValidatingWebhookConfiguration as the Helm chart renders it for a cluster
    before 1.28 (deploy/helm/kube-vgpu/templates/guard-webhook.yaml, ``guard.mode: webhook``, no
    ``matchConditions``): every UPDATE of a pod outside ``release_namespace`` and of a node goes to
    ``url``. Pods ``Fail``, nodes ``Ignore``, as there."""

    def hook(kind: str, scope: str, failure_policy: str) -> JsonObj:
        hook: JsonObj = {
            "name": f"{kind}.guard.kube-vgpu.io",
            "admissionReviewVersions": ["v1", "v1beta1"],
            "sideEffects": "None",
            "failurePolicy": failure_policy,
            "matchPolicy": "Equivalent",
            "timeoutSeconds": 10,
            "clientConfig": {"url": url, "caBundle": base64.b64encode(ca_pem).decode()},
            "rules": [
                {
                    "operations": ["UPDATE"],
                    "apiGroups": [""],
                    "apiVersions": ["v1"],
                    "resources": [kind],
                    "scope": scope,
                }
            ],
        }
        if kind == "pods":
            hook["namespaceSelector"] = {
                "matchExpressions": [
                    {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": [release_namespace]}
                ]
            }
        return hook

    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "kube-vgpu-webhook"},
        "webhooks": [hook("pods", "Namespaced", "Fail"), hook("nodes", "Cluster", "Ignore")],
    }
