"""What the plugin knows of its pods that the watch cache does not show yet.

Allocate writes after answering (``writebehind``), and the pod watch delivers those writes later
still; the next container's Allocate must see the to-allocate value as this plugin left it, never
the cache's older one. ``PodOverlay`` keeps, per pod, the pod as a write not made yet will leave
it, then that write's answer from the API server until the watch shows that resourceVersion.
"""

from collections.abc import Iterable, Mapping
from typing import Any

from vgpu.kube.port import JsonObj

Key = tuple[str, str]


def rv(obj: Mapping[str, Any]) -> int:
    """An object's resourceVersion as a number (0 when missing or not one)."""
    try:
        return int(obj.get("metadata", {}).get("resourceVersion", "0"))
    except (TypeError, ValueError):
        return 0


def key(pod: Mapping[str, Any]) -> Key:
    meta = pod.get("metadata", {})
    return (str(meta.get("namespace", "")), str(meta.get("name", "")))


def _uid(pod: Mapping[str, Any]) -> str:
    return str(pod.get("metadata", {}).get("uid", ""))


def patched(pod: JsonObj, patch: Mapping[str, Any]) -> JsonObj:
    """``pod`` with a metadata merge patch of annotations and labels applied (None removes a key)."""
    meta = dict(pod.get("metadata", {}))
    for field in ("annotations", "labels"):
        if field in patch.get("metadata", {}):
            merged = {**(meta.get(field) or {}), **patch["metadata"][field]}
            meta[field] = {k: v for k, v in merged.items() if v is not None}
    return {**pod, "metadata": meta}


class PodOverlay:
    def __init__(self) -> None:
        self._unwritten: dict[Key, tuple[int, JsonObj]] = {}  # (the write's number, the pod after it)
        self._answers: dict[Key, JsonObj] = {}  # our writes' answers, newer than the cache
        self._seq = 0

    def current(self, pod: JsonObj) -> JsonObj:
        """The cached ``pod``, or what our write not made yet leaves, or our newer patch answer."""
        k = key(pod)
        unwritten = self._unwritten.get(k)
        if unwritten is not None:
            if _uid(unwritten[1]) == _uid(pod):
                return unwritten[1]
            del self._unwritten[k]  # a new pod of that name
        answer = self._answers.get(k)
        if answer is None:
            return pod
        if rv(pod) >= rv(answer):
            del self._answers[k]
            return pod
        return answer

    def will_write(self, pod: JsonObj, patch: Mapping[str, Any]) -> int:
        """A write of ``patch`` to ``pod`` is coming: it is what the pod is from now; its number."""
        self._seq += 1
        self._unwritten[key(pod)] = (self._seq, patched(pod, patch))
        return self._seq

    def written(self, seq: int, answer: JsonObj) -> None:
        """Write ``seq`` landed with ``answer`` (kept unless a later write of the pod is pending)."""
        k = key(answer)
        pending = self._unwritten.get(k)
        if pending is not None and pending[0] != seq:
            return
        self._unwritten.pop(k, None)
        self._answers[k] = answer

    def keep_only(self, present: Iterable[Key]) -> None:
        """Forget pods no longer on the node (deleted)."""
        keep = set(present)
        for table in (self._unwritten, self._answers):
            for gone in [k for k in table if k not in keep]:
                del table[gone]
