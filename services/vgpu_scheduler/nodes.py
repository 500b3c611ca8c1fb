"""``NodeDecoder``: a node's GPUs, cordoned GPUs and outside usage, read from its annotations.

Each node watch event becomes a ``NodeEntry``: the GPU inventory decoded from the register
annotation (none registered, a device plugin error, or a corrupt value makes the node
unschedulable with a ``problem``; a corrupt value is logged and recorded as a Warning event once
per distinct value), the cordoned GPUs, and the memory used outside kube-vgpu per GPU (a corrupt
value counts as 0, logged and warned once). An annotation that did not change is not decoded
again: the new entry shares the old one's values, so a reader can tell "unchanged" by identity.
"""

import dataclasses
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from vgpu.core import annotations, errors, outside
from vgpu.core.device import Gpu, GpuUuid
from vgpu.kube.port import JsonObj

log = logging.getLogger(__name__)

# (node object, reason, message) -> a Warning event on the node
NodeWarning = Callable[[JsonObj, str, str], None]


@dataclass
class NodeEntry:
    name: str
    obj: JsonObj
    gpus: tuple[Gpu, ...] = ()
    problem: str | None = None  # why the node has no schedulable GPUs, from its annotations
    cordoned: frozenset[GpuUuid] = frozenset()
    outside: Mapping[GpuUuid, int] = dataclasses.field(default_factory=dict)  # MiB used outside kube-vgpu


class NodeDecoder:
    """Turns node objects into ``NodeEntry``s, warning once per distinct bad annotation value."""

    def __init__(
        self,
        keys: annotations.Keys,
        *,
        subtract_outside_usage: bool,
        on_node_warning: NodeWarning | None = None,
    ) -> None:
        self.keys = keys
        self._subtract_outside_usage = subtract_outside_usage
        self._on_node_warning = on_node_warning
        self._warned: dict[str, str] = {}  # node -> the register value we already warned about
        self._warned_outside: dict[str, str] = {}  # node -> the outside-usage value warned about

    def entry(self, name: str, obj: JsonObj, old: NodeEntry | None) -> NodeEntry:
        """``obj`` decoded, reusing ``old``'s values where their annotations did not change."""
        ann = annotations.of(obj)
        raw = ann.get(self.keys.node_register)
        cordoned = annotations.decode_cordon(ann.get(self.keys.device_cordon, ""))
        error_key = self.keys.node_plugin_error
        was = annotations.of(old.obj if old is not None else None)
        if (
            old is not None
            and was.get(self.keys.node_register) == raw
            and was.get(error_key) == ann.get(error_key)
        ):
            entry = NodeEntry(name, obj, old.gpus, old.problem, cordoned)
        else:
            entry = self._decode_node(name, obj, raw)
            entry.cordoned = cordoned
        outside_key = self.keys.node_outside_usage
        if old is not None and was.get(outside_key) == ann.get(outside_key):
            entry.outside = old.outside
        else:
            entry.outside = self._decode_outside(name, obj)
        return entry

    def _decode_node(self, name: str, obj: JsonObj, raw: str | None) -> NodeEntry:
        if raw is None:
            return NodeEntry(name, obj, problem="no GPUs registered (no register annotation)")
        plugin_error = annotations.of(obj).get(self.keys.node_plugin_error)
        if plugin_error:
            return NodeEntry(name, obj, problem=f"device plugin has no GPUs: {plugin_error}")
        try:
            gpus = tuple(annotations.decode_node_register(raw))
        except errors.AnnotationError as exc:
            problem = f"corrupt register annotation: {exc}"
            if self._warned.get(name) != raw:
                self._warned[name] = raw
                log.warning("node %s has no schedulable GPUs: %s", name, problem)
                if self._on_node_warning is not None:
                    self._on_node_warning(obj, "InvalidGPURegister", problem)
            return NodeEntry(name, obj, problem=problem)
        self._warned.pop(name, None)
        return NodeEntry(name, obj, gpus)

    def _decode_outside(self, name: str, obj: JsonObj) -> Mapping[GpuUuid, int]:
        """The node's memory used outside kube-vgpu, per GPU (``subtractOutsideUsage``). A value that
        does not decode counts as 0: logged and recorded as a Warning event once per distinct value,
        the node stays schedulable (as with a device plugin too old to publish it)."""
        raw = annotations.of(obj).get(self.keys.node_outside_usage)
        if raw is None or not self._subtract_outside_usage:
            return {}
        try:
            got = outside.decode(raw, field=self.keys.node_outside_usage)
        except errors.AnnotationError as exc:
            if self._warned_outside.get(name) != raw:
                self._warned_outside[name] = raw
                message = f"ignoring memory used outside kube-vgpu (counted as 0): {exc}"
                log.warning("node %s: %s", name, message)
                if self._on_node_warning is not None:
                    self._on_node_warning(obj, "InvalidGPUOutsideUsage", message)
            return {}
        self._warned_outside.pop(name, None)
        return got
