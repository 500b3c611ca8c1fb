"""kube-controller-manager's resourceclaim controller (``pkg/controller/resourceclaim``), emulated.

For a pod with ``spec.resourceClaims[].resourceClaimTemplateName`` it creates the claim from the
template, as the real one does:

- ``metadata.generateName`` ``<pod>-<pod claim name>-`` (the API server adds 5 random characters);
  when that is longer than 57 characters both names are cut in proportion to their lengths and
  joined with ``-`` (no trailing ``-``, as upstream);
- an ``ownerReference`` to the pod (``controller: true``), the annotation
  ``resource.kubernetes.io/pod-claim-name: <pod claim name>`` added to the template's annotations,
  the template's labels, and the template's ``spec.spec`` as the claim's spec;
- before creating, a claim already owned by the pod with that annotation is reused (the controller
  created it and failed before recording it);
- the claim's name is recorded in ``pod.status.resourceClaimStatuses`` (``{name, resourceClaimName}``);
- a missing template is a ``FailedResourceClaimCreation`` Warning event on the pod and a retry when
  the template appears.

When a pod is deleted or done (Succeeded/Failed) its entries in claims' ``status.reservedFor`` are
removed; a claim left with no consumer loses its ``allocation`` (deallocation), and a claim the pod
owns is deleted. Upstream, the controller deletes a done pod's claims but leaves a *deleted* pod's
claims to the garbage collector (ownerReferences); the local cluster has no garbage collector, so
this controller deletes those too. No finalizers (the store has none)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import Any

from vgpu.core import errors
from vgpu.kube import informer
from vgpu.kube.port import JsonObj, KubeApi
from vgpu.localcluster import podresources, statuswriter

log = logging.getLogger(__name__)

POD_CLAIM_ANNOTATION = "resource.kubernetes.io/pod-claim-name"
MAX_BASE_LEN = 57  # leaves room for "-" and 5 random characters in a 63-character name

PodKey = tuple[str, str]


def generate_name(pod: str, claim: str) -> str:
    """The ``generateName`` of the claim for pod claim ``claim`` of pod ``pod`` (see module doc)."""
    base = f"{pod}-{claim}-"
    if len(base) <= MAX_BASE_LEN:
        return base
    return pod[: len(pod) * MAX_BASE_LEN // len(base)] + "-" + claim[: len(claim) * MAX_BASE_LEN // len(base)]


def claim_from_template(pod: Mapping[str, Any], pod_claim: str, template: Mapping[str, Any]) -> JsonObj:
    """The ResourceClaim the controller creates for ``pod``'s ``pod_claim`` from ``template``."""
    meta = pod["metadata"]
    tmeta = (template.get("spec") or {}).get("metadata") or {}
    annotations = dict(tmeta.get("annotations") or {})
    annotations[POD_CLAIM_ANNOTATION] = pod_claim
    claim_meta: JsonObj = {
        "generateName": generate_name(meta["name"], pod_claim),
        "namespace": meta.get("namespace") or "default",
        "ownerReferences": [
            {"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"], "controller": True}
        ],
        "annotations": annotations,
    }
    if tmeta.get("labels"):
        claim_meta["labels"] = dict(tmeta["labels"])
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": claim_meta,
        "spec": (template.get("spec") or {}).get("spec") or {},
    }


def owner_uid(claim: Mapping[str, Any]) -> str | None:
    """The uid of the pod that controls ``claim``, if any."""
    for ref in (claim.get("metadata") or {}).get("ownerReferences") or ():
        if ref.get("kind") == "Pod" and ref.get("apiVersion") == "v1" and ref.get("controller"):
            return str(ref.get("uid"))
    return None


class ResourceClaimController:
    """See the module docstring. ``run()`` until cancelled."""

    def __init__(
        self,
        api: KubeApi,
        *,
        status_writer: statuswriter.StatusWriter | None = None,
        retry_s: float = 0.5,
    ) -> None:
        self._api = api
        self._status = statuswriter.resolve(api, status_writer)
        self._retry_s = retry_s
        self._pods = informer.Informer(api, "pods", on_event=self._on_pod)
        self._claims = informer.Informer(api, "resourceclaims")
        self._templates = informer.Informer(api, "resourceclaimtemplates", on_event=self._on_template)
        self._queue: asyncio.Queue[PodKey] = asyncio.Queue()
        self._queued: set[PodKey] = set()
        self._gone: dict[PodKey, JsonObj] = {}  # deleted pods whose claims still need releasing
        self._waiting_for_template: dict[tuple[str, str], set[PodKey]] = {}
        self.synced = asyncio.Event()

    async def run(self) -> None:
        tasks = [asyncio.create_task(i.run()) for i in (self._claims, self._templates, self._pods)]
        try:
            for i in (self._claims, self._templates, self._pods):
                await i.synced.wait()
            self.synced.set()
            await self._work()
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    # ----- events -----

    def _enqueue(self, key: PodKey) -> None:
        if key not in self._queued:
            self._queued.add(key)
            self._queue.put_nowait(key)

    def _on_pod(self, change: informer.Change) -> None:
        meta = change.object.get("metadata") or {}
        key = (meta.get("namespace") or "default", meta.get("name") or "")
        if change.type == "DELETED":
            self._gone[key] = change.object
        elif not (change.object.get("spec") or {}).get("resourceClaims") and not self._reserves(
            change.object
        ):
            return
        self._enqueue(key)

    def _on_template(self, change: informer.Change) -> None:
        if change.type == "DELETED":
            return
        meta = change.object.get("metadata") or {}
        for key in self._waiting_for_template.pop(
            (meta.get("namespace") or "", meta.get("name") or ""), set()
        ):
            self._enqueue(key)

    def _reserves(self, pod: Mapping[str, Any]) -> bool:
        uid = (pod.get("metadata") or {}).get("uid")
        return any(uid in _reserved_uids(c) for c in self._claims.items())

    # ----- the worker -----

    async def _work(self) -> None:
        while True:
            key = await self._queue.get()
            self._queued.discard(key)
            try:
                await self._sync(key)
            except errors.KubeError as err:
                log.info("resourceclaim controller: pod %s/%s: %s; retrying", *key, err)
                await asyncio.sleep(self._retry_s)
                self._enqueue(key)

    async def _sync(self, key: PodKey) -> None:
        gone = self._gone.pop(key, None)
        pod = self._pods.get(*key)
        if gone is not None:
            await self._release(gone, delete_owned=True)
        if pod is None:
            return
        if podresources.is_terminated(pod):
            await self._release(pod, delete_owned=True)
            return
        if (pod.get("metadata") or {}).get("deletionTimestamp"):
            return  # "Nothing to do for pod, it is marked for deletion"
        await self._create_claims(key, pod)

    async def _create_claims(self, key: PodKey, pod: JsonObj) -> None:
        uid = pod["metadata"].get("uid")
        recorded = {s.get("name"): s for s in (pod.get("status") or {}).get("resourceClaimStatuses") or ()}
        new: dict[str, str] = {}
        for pod_claim in (pod.get("spec") or {}).get("resourceClaims") or ():
            name, template_name = pod_claim.get("name"), pod_claim.get("resourceClaimTemplateName")
            if not template_name or name in recorded:
                continue
            existing = next(
                (
                    c
                    for c in self._claims.items()
                    if owner_uid(c) == uid
                    and ((c.get("metadata") or {}).get("annotations") or {}).get(POD_CLAIM_ANNOTATION) == name
                ),
                None,
            )
            if existing is None:
                template = self._templates.get(key[0], template_name)
                if template is None:
                    self._waiting_for_template.setdefault((key[0], template_name), set()).add(key)
                    await self._warn(
                        pod,
                        f'PodResourceClaim {name}: resource claim template "{template_name}": resourceclaimtemplates.resource.k8s.io "{template_name}" not found',
                    )
                    return
                existing = await self._api.create(
                    "resourceclaims", claim_from_template(pod, name, template), namespace=key[0]
                )
                log.info(
                    "created ResourceClaim %s/%s for pod %s/%s", key[0], existing["metadata"]["name"], *key
                )
            new[name] = existing["metadata"]["name"]
        if new:
            statuses = [*recorded.values(), *({"name": n, "resourceClaimName": c} for n, c in new.items())]
            try:
                await self._status.merge_patch_status(
                    "pods", key[1], {"status": {"resourceClaimStatuses": statuses}}, namespace=key[0]
                )
            except errors.NotFound:
                return

    async def _release(self, pod: JsonObj, *, delete_owned: bool) -> None:
        meta = pod.get("metadata") or {}
        ns, uid = meta.get("namespace") or "default", meta.get("uid")
        for claim in [c for c in self._claims.items() if (c.get("metadata") or {}).get("namespace") == ns]:
            cmeta = claim["metadata"]
            reserved = (claim.get("status") or {}).get("reservedFor") or []
            remaining = [r for r in reserved if r.get("uid") != uid]
            if len(remaining) < len(reserved):
                patch: JsonObj = {
                    "metadata": {"resourceVersion": cmeta["resourceVersion"]},
                    "status": {"reservedFor": remaining or None},
                }
                if not remaining:
                    patch["status"]["allocation"] = None  # the last consumer is gone: deallocate
                try:
                    await self._status.merge_patch_status(
                        "resourceclaims", cmeta["name"], patch, namespace=ns
                    )
                except errors.NotFound:
                    continue
                reserved = remaining
            if delete_owned and not reserved and owner_uid(claim) == uid:
                with contextlib.suppress(errors.NotFound):
                    await self._api.delete("resourceclaims", cmeta["name"], namespace=ns)

    async def _warn(self, pod: JsonObj, message: str) -> None:
        try:
            await self._api.create_event(
                namespace=(pod.get("metadata") or {}).get("namespace") or "default",
                involved={**pod, "kind": "Pod", "apiVersion": "v1"},
                reason="FailedResourceClaimCreation",
                message=message,
                type="Warning",
                component="resource_claim",
            )
        except errors.KubeError as err:
            log.warning("could not record FailedResourceClaimCreation: %s", err)


def _reserved_uids(claim: Mapping[str, Any]) -> set[str]:
    return {
        str(r.get("uid"))
        for r in (claim.get("status") or {}).get("reservedFor") or ()
        if isinstance(r, Mapping)
    }
