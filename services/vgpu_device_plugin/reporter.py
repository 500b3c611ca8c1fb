"""What the plugin tells the cluster about its node: the register annotation and a liveness Lease.

* ``hami.io/node-nvidia-register`` (docs/protocol.md#the-register-annotation, v2.10 JSON): PATCHed when its content
  changes and at least every ``register_interval_s`` (a restarted scheduler never waits long).
* Lease ``coordination.k8s.io/v1`` ``vgpu-device-plugin-<node>`` in ``lease_namespace``:
  ``holderIdentity=<node>``, ``leaseDurationSeconds``, ``renewTime`` (MicroTime), renewed every
  ``lease_renew_s`` by the manager with a PUT of the Lease it last wrote (``renew_lease``). The
  scheduler treats a node whose lease is older than its duration as having no schedulable GPUs.
* On clean shutdown: every GPU ``health: false`` in the annotation, then the Lease is deleted.

A call the API adapter has started may run on (a worker thread) after its caller is cancelled, so
each write runs as a task the caller awaits through ``asyncio.shield`` and that stays known while it
runs. A new register write, the shutdown's ``health: false`` write and the Lease DELETE each first
wait (``settle_timeout_s`` at most) for the abandoned call before them: an old "healthy" PATCH can
never land after the shutdown's, nor a renewal re-create the Lease after its DELETE.
"""

import asyncio
import dataclasses
import datetime
import logging
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Literal

from vgpu.core import annotations, errors, lease
from vgpu.core.device import Gpu
from vgpu.kube.port import JsonObj, KubeApi

log = logging.getLogger(__name__)


_Slot = Literal["register annotation write", "lease renewal"]


def _utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _retrieved(task: asyncio.Task[JsonObj]) -> None:
    """Mark the outcome seen (``_settle`` logs an abandoned call's error; its caller saw the rest)."""
    if not task.cancelled():
        task.exception()


class NodeReporter:
    def __init__(
        self,
        api: KubeApi,
        *,
        node: str,
        keys: annotations.Keys,
        lease_namespace: str,
        lease_duration_s: int,
        register_interval_s: float,
        clock: Callable[[], datetime.datetime] = _utcnow,
        monotonic: Callable[[], float] = time.monotonic,
        init_error: str = "",
        settle_timeout_s: float = 10.0,
    ) -> None:
        """``settle_timeout_s``: how long a write waits for an abandoned call still in flight."""
        self._api = api
        self._init_error = init_error  # GPU backend start-up failure kept with --fail-on-init-error=false
        self._node = node
        self._keys = keys
        self._lease_namespace = lease_namespace
        self._lease_duration_s = lease_duration_s
        self._register_interval_s = register_interval_s
        self._clock = clock
        self._monotonic = monotonic
        self._last_value: str | None = None
        self._last_at = 0.0
        self._lease: JsonObj | None = None  # the Lease as this reporter last wrote it
        self._settle_timeout_s = settle_timeout_s
        self._inflight: dict[_Slot, asyncio.Task[JsonObj]] = {}  # calls whose caller has not seen the end

    async def _call(self, slot: _Slot, call: Coroutine[Any, Any, JsonObj]) -> JsonObj:
        """Run an API call as a task that a cancelled caller leaves running (and in ``_inflight``)."""
        task = asyncio.create_task(call, name=f"{self._node} {slot}")
        task.add_done_callback(_retrieved)
        self._inflight[slot] = task
        try:
            return await asyncio.shield(task)
        finally:
            if task.done() and self._inflight.get(slot) is task:
                del self._inflight[slot]  # its caller has the outcome

    async def _settle(self, slot: _Slot) -> None:
        """Wait for the call a cancelled caller left in flight, if any; its error is only logged."""
        task = self._inflight.get(slot)
        if task is None:
            return
        done, _ = await asyncio.wait({task}, timeout=self._settle_timeout_s)
        if self._inflight.get(slot) is task:  # kept while waiting: a cancelled waiter leaves it known
            del self._inflight[slot]
        if not done:
            log.warning(
                "node %s: the %s in flight is still running after %.0f s; going on",
                self._node,
                slot,
                self._settle_timeout_s,
            )
        elif not task.cancelled() and (exc := task.exception()) is not None:
            log.warning("node %s: the %s left in flight failed: %s", self._node, slot, exc)

    async def publish(self, gpus: Sequence[Gpu]) -> bool:
        """PATCH the register annotation if it changed or is due; True when it was written."""
        value = annotations.encode_node_register(gpus)
        due = self._monotonic() - self._last_at >= self._register_interval_s
        if value == self._last_value and not due:
            return False
        # the error annotation says why a node has zero devices; null removes a stale one
        patch = {
            "metadata": {
                "annotations": {
                    self._keys.node_register: value,
                    self._keys.node_plugin_error: self._init_error or None,
                }
            }
        }
        await self._settle("register annotation write")  # writes land in the order they were made
        await self._call("register annotation write", self._api.merge_patch("nodes", self._node, patch))
        if value != self._last_value:
            healthy = sum(1 for g in gpus if g.health)
            log.info(
                "node %s: register annotation written: %d GPU(s), %d healthy", self._node, len(gpus), healthy
            )
        self._last_value = value
        self._last_at = self._monotonic()
        return True

    def _lease_spec(self) -> JsonObj:
        return {
            "holderIdentity": self._node,
            "leaseDurationSeconds": self._lease_duration_s,
            "renewTime": lease.format_micro_time(self._clock()),
        }

    async def renew_lease(self) -> None:
        """Renew the Lease: a PUT of the one this reporter last wrote, as kubelet renews its node
        Lease (kube-apiserver v1.20 with etcd spent 0.50 + 0.33 ms of CPU on a Lease PUT against
        0.70 + 0.45 on a merge PATCH: docs/benchmarks.md, sixteenth pass; at 1,000 nodes renewing
        every 10 s that is 3 % of a core). Its resourceVersion makes it a compare-and-swap: when
        another writer got there first (Conflict) the renewal is a merge PATCH instead, and when
        the Lease is gone it is created again."""
        name = lease.name(self._node)
        held, self._lease = self._lease, None
        if held is not None:
            body = {**held, "spec": {**(held.get("spec") or {}), **self._lease_spec()}}
            try:
                self._lease = await self._call(
                    "lease renewal", self._api.replace("leases", body, namespace=self._lease_namespace)
                )
                return
            except (errors.Conflict, errors.NotFound):
                pass  # written by someone else, or deleted: below, as if this were the first renewal
        try:
            self._lease = await self._call(
                "lease renewal",
                self._api.merge_patch(
                    "leases", name, {"spec": self._lease_spec()}, namespace=self._lease_namespace
                ),
            )
            return
        except errors.NotFound:
            pass
        spec = self._lease_spec()
        spec["acquireTime"] = spec["renewTime"]
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": name, "namespace": self._lease_namespace},
            "spec": spec,
        }
        try:
            self._lease = await self._call(
                "lease renewal", self._api.create("leases", body, namespace=self._lease_namespace)
            )
            log.info("node %s: lease %s/%s created", self._node, self._lease_namespace, name)
        except errors.Conflict:  # created meanwhile (another replica of us?): renew next tick
            log.warning(
                "node %s: lease %s/%s appeared while creating it", self._node, self._lease_namespace, name
            )

    async def shutdown(self, gpus: Sequence[Gpu]) -> None:
        """Clean stop: GPUs unhealthy in the annotation, lease released. Errors are logged. Each waits
        for a write or renewal the cancelled loops left in flight (``publish`` does the first)."""
        try:
            self._last_value = None
            await self.publish([dataclasses.replace(g, health=False) for g in gpus])
        except errors.KubeError as exc:
            log.error("node %s: marking GPUs unhealthy on shutdown failed: %s", self._node, exc)
        await self._settle("lease renewal")  # else it could re-create the Lease after the DELETE
        self._lease = None
        try:
            await self._api.delete("leases", lease.name(self._node), namespace=self._lease_namespace)
            log.info("node %s: lease released", self._node)
        except errors.NotFound:
            pass
        except errors.KubeError as exc:
            log.error("node %s: releasing the lease failed: %s", self._node, exc)
