"""The update guard's ValidatingAdmissionPolicy as the chart renders it (``guard.mode: policy``),
enforced by a real kube-apiserver (marked ``realk8s``): its CEL compiles against the real types,
and the device plugin, whose token names its node (``userInfo.extra
authentication.kubernetes.io/node-name``, impersonated here as the API server would set it for a
pod-bound token), may change a pod's decision only on its own node and only its own Node; without
the node name (older clusters) it may change them everywhere (issue 49)."""

from __future__ import annotations

import asyncio
import datetime
import itertools
import pathlib
import ssl
from typing import Any

import aiohttp
import pytest

from bench import realk8s
from tests.deploy import rendering

pytestmark = [pytest.mark.realk8s, pytest.mark.slow, pytest.mark.timeout(300)]

PLUGIN = f"system:serviceaccount:{rendering.NAMESPACE}:{rendering.FULLNAME}-device-plugin"
NODE_EXTRA = "authentication.kubernetes.io%2fnode-name"  # the header name escapes the '/'
VAP = "/apis/admissionregistration.k8s.io/v1"


class Client:
    def __init__(self, session: aiohttp.ClientSession, plane: realk8s.ControlPlane) -> None:
        self._session = session
        self._url = plane.url
        self._headers = {"Authorization": f"Bearer {plane.token}"}
        self._ssl = ssl.create_default_context(cafile=str(plane.ca_file))

    async def call(
        self, method: str, path: str, body: Any, *, as_plugin_on: str | bool | None = False
    ) -> tuple[int, Any]:
        headers = dict(self._headers)
        if as_plugin_on is not False:
            headers["Impersonate-User"] = PLUGIN
            headers["Impersonate-Group"] = "system:serviceaccounts"
            if isinstance(as_plugin_on, str):
                headers[f"Impersonate-Extra-{NODE_EXTRA}"] = as_plugin_on
        if method == "PATCH":
            headers["Content-Type"] = "application/merge-patch+json"
        async with self._session.request(
            method, self._url + path, json=body, headers=headers, ssl=self._ssl
        ) as resp:
            return resp.status, await resp.json(content_type=None)


def _annotate(key: str, value: str) -> dict[str, Any]:
    return {"metadata": {"annotations": {key: value}}}


async def test_the_policy_holds_the_device_plugin_to_its_own_node(
    k8s_bin: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    rendered = rendering.render({"guard": {"mode": "policy"}}, kube_version="v1.36.0")
    now = datetime.datetime.now(datetime.UTC)
    async with realk8s.control_plane(k8s_bin, tmp_path, now=now) as plane, aiohttp.ClientSession() as session:
        api = Client(session, plane)
        status, served = await api.call("GET", VAP, None)
        kinds = {r.get("kind") for r in served.get("resources", [])} if status == 200 else set()
        if "ValidatingAdmissionPolicy" not in kinds:  # admissionregistration.k8s.io/v1: v1.30+
            pytest.skip("this kube-apiserver serves no ValidatingAdmissionPolicy in v1 (Kubernetes < 1.30)")
        for policy in rendered.of_kind("ValidatingAdmissionPolicy"):
            status, body = await api.call("POST", f"{VAP}/validatingadmissionpolicies", policy)
            assert status == 201, body  # the CEL compiled and type-checked
            assert not body.get("status", {}).get("typeChecking", {}).get("expressionWarnings"), body
        for binding in rendered.of_kind("ValidatingAdmissionPolicyBinding"):
            status, body = await api.call("POST", f"{VAP}/validatingadmissionpolicybindings", binding)
            assert status == 201, body
        for name in ("n1", "n2"):
            status, body = await api.call("POST", "/api/v1/nodes", {"metadata": {"name": name}})
            assert status == 201, body
            pod = {
                "metadata": {"name": f"p-{name}"},
                "spec": {"nodeName": name, "containers": [{"name": "c", "image": "busybox"}]},
            }
            status, body = await api.call("POST", "/api/v1/namespaces/default/pods", pod)
            assert status == 201, body
        phase = "hami.io/bind-phase"
        register = "hami.io/node-nvidia-register"

        # the policies take effect once the API server has loaded them: wait for a refusal
        async with asyncio.timeout(60):
            for attempt in itertools.count():  # a new value each time: an unchanged key passes
                status, body = await api.call(
                    "PATCH",
                    "/api/v1/namespaces/default/pods/p-n2",
                    _annotate(phase, f"try-{attempt}"),
                    as_plugin_on="n1",
                )
                if status == 403:
                    break
                assert status == 200, body
                await asyncio.sleep(0.5)  # polling the API server's policy sync, with a deadline
        assert f"{PLUGIN} may not change it" in body["message"], body

        cases: list[tuple[str, str, str | None, int]] = [
            ("/api/v1/namespaces/default/pods/p-n1", phase, "n1", 200),
            ("/api/v1/namespaces/default/pods/p-n2", phase, "n1", 403),
            ("/api/v1/nodes/n1", register, "n1", 200),
            ("/api/v1/nodes/n2", register, "n1", 403),
            ("/api/v1/namespaces/default/pods/p-n2", phase, None, 200),  # no node name: older clusters
            ("/api/v1/nodes/n2", register, None, 200),
        ]
        for i, (path, key, node, expected) in enumerate(cases):
            status, body = await api.call("PATCH", path, _annotate(key, f"v{i}"), as_plugin_on=node)
            assert status == expected, (path, node, body)
        status, body = await api.call("PATCH", "/api/v1/nodes/n2", _annotate(register, "admin"))
        assert status == 200, body  # the cluster admin (system:masters) stays trusted


async def test_the_webhooks_match_conditions_compile_in_kube_apiserver(
    k8s_bin: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    """``guard.mode: webhook`` on 1.28+: the same trust rule as CEL matchConditions, which the API
    server compiles when the configuration is created."""
    vwc = rendering.render(kube_version="v1.36.0").one("ValidatingWebhookConfiguration")
    assert all(len(hook["matchConditions"]) == 2 for hook in vwc["webhooks"])
    now = datetime.datetime.now(datetime.UTC)
    async with realk8s.control_plane(k8s_bin, tmp_path, now=now) as plane, aiohttp.ClientSession() as session:
        status, body = await Client(session, plane).call(
            "POST", f"{VAP}/validatingwebhookconfigurations", vwc
        )
        assert status == 201, body
