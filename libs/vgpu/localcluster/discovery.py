"""Discovery documents of the local API server: ``/version``, ``/api``, ``/apis``, and the
``APIResourceList`` of each group version, derived from the store's ``KINDS``."""

from __future__ import annotations

from vgpu.kube.port import JsonObj
from vgpu.localcluster.kinds import KINDS

VERSION_INFO: JsonObj = {
    "major": "1",
    "minor": "30",
    "gitVersion": "v1.30.0-vgpu-local",
    "gitCommit": "",
    "gitTreeState": "clean",
    "buildDate": "1970-01-01T00:00:00Z",
    "goVersion": "",
    "compiler": "python",
    "platform": "linux/amd64",
}
VERBS = ["create", "delete", "get", "list", "patch", "update", "watch"]


def api_versions() -> JsonObj:
    """``GET /api``."""
    return {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}


def api_groups() -> JsonObj:
    """``GET /apis``: every named group the store serves."""
    groups = sorted({k.api_version for k in KINDS.values() if "/" in k.api_version})
    return {
        "kind": "APIGroupList",
        "apiVersion": "v1",
        "groups": [
            {
                "name": gv.split("/")[0],
                "versions": [{"groupVersion": gv, "version": gv.split("/")[1]}],
                "preferredVersion": {"groupVersion": gv, "version": gv.split("/")[1]},
            }
            for gv in groups
        ],
    }


def resource_list(group_version: str) -> JsonObj | None:
    """``GET /api/v1`` or ``/apis/{group}/{version}``; None for a group version not served."""
    resources: list[JsonObj] = []
    for k in KINDS.values():
        if k.api_version != group_version:
            continue
        resources.append(
            {
                "name": k.plural,
                "singularName": k.kind.lower(),
                "namespaced": k.namespaced,
                "kind": k.kind,
                "verbs": VERBS,
            }
        )
        if k.has_status:
            resources.append(
                {
                    "name": f"{k.plural}/status",
                    "singularName": "",
                    "namespaced": k.namespaced,
                    "kind": k.kind,
                    "verbs": ["get", "patch", "update"],
                }
            )
        if k.plural == "pods":
            resources.append(
                {
                    "name": "pods/binding",
                    "singularName": "",
                    "namespaced": True,
                    "kind": "Binding",
                    "verbs": ["create"],
                }
            )
            resources.append(
                {
                    "name": "pods/eviction",
                    "singularName": "",
                    "namespaced": True,
                    "group": "policy",
                    "version": "v1",
                    "kind": "Eviction",
                    "verbs": ["create"],
                }
            )
    if not resources:
        return None
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": resources,
    }
