"""What the plugin tells the cluster about its node: the register annotation and a liveness Lease.

* ``hami.io/node-nvidia-register`` (PROTOCOL.md F.2, v2.10 JSON): PATCHed when its content
  changes and at least every ``register_interval_s`` (a restarted scheduler never waits long).
* Lease ``coordination.k8s.io/v1`` ``vgpu-device-plugin-<node>`` in ``lease_namespace``:
  ``holderIdentity=<node>``, ``leaseDurationSeconds``, ``renewTime`` (MicroTime), renewed every
  ``lease_renew_s`` by the manager with a PUT of the Lease it last wrote (``renew_lease``). The
  scheduler treats a node whose lease is older than its duration as having no schedulable GPUs.
* On clean shutdown: every GPU ``health: false`` in the annotation, then the Lease is deleted.
"""

import dataclasses
import datetime
import logging
import time
from collections.abc import Callable, Sequence

from vgpu.core import annotations, errors, lease
from vgpu.core.device import Gpu
from vgpu.kube.port import JsonObj, KubeApi

log = logging.getLogger(__name__)


def _utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


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
    ) -> None:
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
        await self._api.merge_patch("nodes", self._node, patch)
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
                self._lease = await self._api.replace("leases", body, namespace=self._lease_namespace)
                return
            except (errors.Conflict, errors.NotFound):
                pass  # written by someone else, or deleted: below, as if this were the first renewal
        try:
            self._lease = await self._api.merge_patch(
                "leases", name, {"spec": self._lease_spec()}, namespace=self._lease_namespace
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
            self._lease = await self._api.create("leases", body, namespace=self._lease_namespace)
            log.info("node %s: lease %s/%s created", self._node, self._lease_namespace, name)
        except errors.Conflict:  # created meanwhile (another replica of us?): renew next tick
            log.warning(
                "node %s: lease %s/%s appeared while creating it", self._node, self._lease_namespace, name
            )

    async def shutdown(self, gpus: Sequence[Gpu]) -> None:
        """Clean stop: GPUs unhealthy in the annotation, lease released. Errors are logged."""
        try:
            self._last_value = None
            await self.publish([dataclasses.replace(g, health=False) for g in gpus])
        except errors.KubeError as exc:
            log.error("node %s: marking GPUs unhealthy on shutdown failed: %s", self._node, exc)
        self._lease = None
        try:
            await self._api.delete("leases", lease.name(self._node), namespace=self._lease_namespace)
            log.info("node %s: lease released", self._node)
        except errors.NotFound:
            pass
        except errors.KubeError as exc:
            log.error("node %s: releasing the lease failed: %s", self._node, exc)
