"""``DraTemplates``: the ResourceClaimTemplates the webhook's DRA mode names, and the GPU memory
sizes our ResourceSlices publish (docs/dra.md, "Admission").

Both are watch-fed, read from memory on the webhook's path:

- templates labelled ``kube-vgpu.io/claim-template=true`` (slimmed to identity and spec), plus the
  ones this process created and the watch has not shown yet;
- per ResourceSlice of driver ``gpu.kube-vgpu.io``, the ``memoryMiB`` of its devices: their union
  is what ``gpumem-percentage`` becomes ``firstAvailable`` alternatives over. The slices' watch is
  the scheduler's one (``draviews.DraViews``, which keeps them for the views), told here through
  ``slice_changed``.

``ensure(bodies)`` is what the webhook awaits before it answers a DRA pod: each template the cache
does not hold is created through the KubeApi port (its I/O never blocks the event loop), at most
one create per template at a time (concurrent pods of a new size share it), within
``webhook.draTemplateWaitS``. A template of that name, in the cache or found after a 409
AlreadyExists, is ours only when it carries our label and its spec is exactly the one we send (the
API server stores it as sent but for quantities' canonical form, which are compared canonically):
another replica, or our own earlier create, made it. Anything else (an extra request, field or
claim label, a missing label) is a user's object in the pod's namespace under our name: the pod is
refused naming it, and it is neither used nor overwritten. A create that outlives the wait goes on
in the background, so the next pod of that size finds it.

Garbage collection: none. A template is a few hundred bytes, one per namespace and distinct GPU
ask; kube-controller-manager copies it into each pod's claim at pod start, and a pod whose claim is
not made yet (pending, or its ReplicaSet's next pod, which the webhook converts again) needs it
then. Deleting one by hand is safe for pods that are running and for pods still to be created (the
next admission re-creates it); it breaks only a pod admitted but whose claim is not made yet.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from vgpu.core import errors, quantity
from vgpu.core.dra import names
from vgpu.kube import informer
from vgpu.kube.port import JsonObj, KubeApi

log = logging.getLogger(__name__)

KIND: Final = "resourceclaimtemplates"
TEMPLATE_SELECTOR = f"{names.TEMPLATE_LABEL}=true"


class TemplateError(Exception):
    """A template the pod needs could not be made; the message says which and why."""


def slim_template(obj: JsonObj) -> JsonObj:
    """What the cache keeps of a template: identity, our label and the template spec (informer
    transform); a garbage spec is kept as an empty claim spec, which is nobody's ask."""
    meta = obj.get("metadata") or {}
    keep = {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion") if k in meta}
    labels = meta.get("labels")
    if isinstance(labels, dict) and names.TEMPLATE_LABEL in labels:
        keep["labels"] = {names.TEMPLATE_LABEL: labels[names.TEMPLATE_LABEL]}
    spec = obj.get("spec")
    inner = spec.get("spec") if isinstance(spec, dict) else None
    if not isinstance(spec, dict) or not isinstance(inner, dict):
        return {"metadata": keep, "spec": {"spec": {}}}
    return {"metadata": keep, "spec": spec}


def _memory_mib(attributes: object) -> int | None:
    if not isinstance(attributes, dict):
        return None
    for key in (names.ATTR_MEMORY_MIB, f"{names.DRIVER}/{names.ATTR_MEMORY_MIB}"):
        value = attributes.get(key)
        if isinstance(value, dict):
            number = value.get("int")
            if isinstance(number, int) and not isinstance(number, bool) and number > 0:
                return number
    return None


def slim_slice(obj: JsonObj) -> JsonObj:
    """What is kept of a ResourceSlice: identity and, for our driver's, the distinct
    ``memoryMiB`` of its devices (garbage devices are skipped)."""
    meta = obj.get("metadata") or {}
    keep = {k: meta[k] for k in ("name", "uid", "resourceVersion") if k in meta}
    spec = obj.get("spec")
    sizes: set[int] = set()
    if isinstance(spec, dict) and spec.get("driver") == names.DRIVER:
        devices = spec.get("devices")
        for device in devices if isinstance(devices, list) else ():
            size = _memory_mib(device.get("attributes")) if isinstance(device, dict) else None
            if size is not None:
                sizes.add(size)
    return {"metadata": keep, "memoryMiB": sorted(sizes)}


def _same(theirs: Any, ours: Any, *, path: tuple[str, ...] = ()) -> bool:
    """``theirs == ours`` exactly (same keys, same list lengths, same types), but for the amounts of
    a ``capacity.requests``, which are compared as quantities (the API server writes its canonical
    form; ours is canonical already, so this only matters for templates made another way)."""
    if isinstance(ours, Mapping):
        return (
            isinstance(theirs, Mapping)
            and theirs.keys() == ours.keys()
            and all(_same(theirs[k], v, path=(*path[-2:], str(k))) for k, v in ours.items())
        )
    if isinstance(ours, list):
        return (
            isinstance(theirs, list)
            and len(theirs) == len(ours)
            and all(_same(t, o, path=path) for t, o in zip(theirs, ours, strict=True))
        )
    if path[-3:-1] == ("capacity", "requests") and isinstance(ours, str) and isinstance(theirs, str):
        try:
            return quantity.canonical(theirs) == quantity.canonical(ours)
        except errors.QuantityError:
            return False
    return type(theirs) is type(ours) and bool(theirs == ours)


def not_ours(stored: Any, body: Mapping[str, Any]) -> str | None:
    """Why the stored template ``stored`` (as read from the API, or slimmed by ``slim_template``)
    is not the one ``body`` makes, or None when it is: it must carry our label, and its spec must
    be ``body``'s exactly (an empty claim ``metadata``, which the API server may write, aside)."""
    meta = stored.get("metadata") if isinstance(stored, Mapping) else None
    labels = meta.get("labels") if isinstance(meta, Mapping) else None
    if not isinstance(labels, Mapping) or labels.get(names.TEMPLATE_LABEL) != "true":
        return f"it is not labelled {TEMPLATE_SELECTOR}"
    spec = stored.get("spec")
    if isinstance(spec, Mapping) and spec.get("metadata") in ({}, None):
        spec = {k: v for k, v in spec.items() if k != "metadata"}
    if not _same(spec, body.get("spec")):
        return "its spec is not the one kube-vgpu made"
    return None


def _key(body: Mapping[str, Any]) -> tuple[str, str]:
    meta = body["metadata"]
    return str(meta["namespace"]), str(meta["name"])


def _claim_spec(body: Mapping[str, Any]) -> Any:
    spec = body.get("spec")
    return spec.get("spec") if isinstance(spec, Mapping) else None


def _refuse_unless_ours(stored: Any, body: Mapping[str, Any]) -> None:
    """``TemplateError`` naming the template when ``stored`` is not the one ``body`` makes."""
    why = not_ours(stored, body)
    if why is not None:
        namespace, name = _key(body)
        raise TemplateError(
            f"ResourceClaimTemplate {namespace}/{name} exists but is not kube-vgpu's ({why}); "
            f"kube-vgpu neither uses nor overwrites it: delete or rename it (kube-vgpu re-creates it)"
        )


class DraTemplates:
    """The templates and slice sizes (see the module docstring). ``informers()`` feed it the
    templates; ``slice_changed`` is told each change of the ResourceSlices' cache (the scheduler
    watches them once, for this and for the views: ``draviews.DraViews``)."""

    def __init__(
        self, api: KubeApi, *, wait_s: float, on_template: Callable[[informer.Change], None] | None = None
    ) -> None:
        """``on_template``: told every change of the templates' cache (the quota's ``DraUsage``)."""
        self._api = api
        self._wait_s = wait_s
        self._on_template = on_template
        self.templates = informer.Informer(
            api,
            KIND,
            label_selector=TEMPLATE_SELECTOR,
            transform=slim_template,
            on_event=self._template_changed,
            unserved_ok=True,
            forbidden_ok=True,  # a chart without the DRA rules: DRA pods are refused with the reason
        )
        self._slice_sizes: dict[informer.Key, list[int]] = {}  # per slice: its GPUs' memoryMiB
        self._sizes: tuple[int, ...] | None = None
        self._made: dict[tuple[str, str], Mapping[str, Any]] = {}  # created here: key -> body
        self._creating: dict[tuple[str, str], asyncio.Task[None]] = {}
        self.creates = 0  # create calls sent (tests, and the curious)

    def informers(self) -> list[informer.Informer]:
        return [self.templates]

    def _template_changed(self, change: informer.Change) -> None:
        # the watch has it now (or it was deleted: the next pod that names it re-creates it)
        self._made.pop(informer.object_key(change.object), None)
        if self._on_template is not None:
            self._on_template(change)

    def slice_changed(self, change: informer.Change) -> None:
        """One change of the ResourceSlices' cache (any driver's: ``slim_slice`` reads ours only)."""
        key = informer.object_key(change.object)
        if change.type == "DELETED":
            self._slice_sizes.pop(key, None)
        else:
            self._slice_sizes[key] = slim_slice(change.object)["memoryMiB"]
        self._sizes = None

    def memory_sizes_mib(self) -> tuple[int, ...]:
        """The distinct memory sizes of our published GPUs, ascending."""
        if self._sizes is None:
            self._sizes = tuple(sorted({s for sizes in self._slice_sizes.values() for s in sizes}))
        return self._sizes

    def _known(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        """The template ``namespace/name`` as known here (the watch's, else one created here)."""
        cached = self.templates.get(namespace, name)
        return cached if cached is not None else self._made.get((namespace, name))

    def claim_spec(self, namespace: str, name: str) -> Any:
        """The claim spec of the template ``namespace/name`` as known here, or None."""
        known = self._known(namespace, name)
        return None if known is None else _claim_spec(known)

    def _held(self, body: Mapping[str, Any]) -> bool:
        """True when the cache holds the template ``body`` makes; TemplateError when it holds
        another under that name."""
        namespace, name = _key(body)
        known = self._known(namespace, name)
        if known is None:
            return False
        _refuse_unless_ours(known, body)
        return True

    async def ensure(self, bodies: Sequence[Mapping[str, Any]]) -> None:
        """Make sure every template in ``bodies`` exists; raises ``TemplateError`` when one cannot
        be made within the wait (see the module docstring)."""
        missing = [b for b in bodies if not self._held(b)]
        if not missing:
            return
        tasks = [self._creation(b) for b in missing]
        try:
            async with asyncio.timeout(self._wait_s):
                # shielded: a pod that gives up does not cancel a create other pods share
                await asyncio.gather(*(asyncio.shield(t) for t in tasks))
        except TimeoutError:
            waiting = ", ".join(
                "/".join(_key(b)) for b, t in zip(missing, tasks, strict=True) if not t.done()
            )
            raise TemplateError(
                f"ResourceClaimTemplate {waiting} not created within {self._wait_s:g}s; retry"
            ) from None

    def _creation(self, body: Mapping[str, Any]) -> asyncio.Task[None]:
        key = _key(body)
        task = self._creating.get(key)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._create(body), name=f"template-{key[1]}")
            self._creating[key] = task
            task.add_done_callback(lambda done: self._created(key, done))
        return task

    def _created(self, key: tuple[str, str], task: asyncio.Task[None]) -> None:
        if self._creating.get(key) is task:
            del self._creating[key]
        if not task.cancelled() and task.exception() is not None:
            log.warning("%s", task.exception())

    async def _create(self, body: Mapping[str, Any]) -> None:
        namespace, name = _key(body)
        self.creates += 1
        found = False
        try:
            await self._api.create(KIND, dict(body), namespace=namespace)
        except errors.Conflict:
            found = True
            try:
                existing = await self._api.get(KIND, name, namespace=namespace)
            except errors.KubeError as exc:
                raise TemplateError(f"ResourceClaimTemplate {namespace}/{name}: {exc}") from None
            _refuse_unless_ours(existing, body)
        except errors.KubeError as exc:
            raise TemplateError(f"creating ResourceClaimTemplate {namespace}/{name}: {exc}") from None
        self._made[(namespace, name)] = body
        log.info("%s ResourceClaimTemplate %s/%s", "found ours:" if found else "created", namespace, name)

    async def aclose(self) -> None:
        """Cancel the creates still under way (shutdown)."""
        tasks = list(self._creating.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
