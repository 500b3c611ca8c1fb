"""``OffloadedKubeApi``: the KubeApi port with its writes (and, asked, its watches) made by a helper process.

A Python process runs its Python on one core at a time. The vgpu-scheduler answers every GPU pod's
``/filter`` and ``/bind`` from one event loop, and on a machine with cores to spare that one core is
what caps GPU pods (docs/benchmarks.md, "Seventeenth pass"). Part of its CPU per GPU pod is spent
as an HTTPS client: the Binding and the Events (the node lock too, with ``nodeLock: always``), each
an aiohttp request over TLS. Handing such a write to another process over a socket costs this
process about a third of that (a pickled frame each way), and the helper's HTTP and TLS run on
another core: the scheduler's own CPU per GPU pod fell by 15-30 % ("Eighteenth pass").

With ``watches`` (``scheduler.apiWatches: process``) watches go there too: reading a watch stream is
TLS, HTTP chunks and JSON decoding of every changed object, and the informer's transform
(``vgpu.kube.slim``) then throws most of it away. The child
does all of that and sends each event's transformed object back, one frame each; unpickling a slim
object costs this process a fraction of decoding the full one (docs/benchmarks.md, "Twentieth
pass"). A watch's ``transform`` must be a module-level function: it travels by reference. Its
events arrive a hop later than a watch read here would bring them, which is why it is not the
scheduler's default yet (docs/scheduler.md). ``get`` and ``list`` stay in this process: a relist
is rare, and its answer is needed here whole.

Writes (``create``, ``replace``, ``merge_patch``, ``merge_patch_status``, ``delete``,
``bind_pod``, ``evict_pod``, ``create_event``) go, in the order they are made, to a child process: a fresh
interpreter (``python -m vgpu.kube.offload``; not a fork, since this process has threads, and not
``multiprocessing``, which would import this program's ``__main__`` again there) that inherits one
end of a socket pair and runs an ``AioKubeApi`` built by ``factory`` (a picklable callable: the
kubeconfig or in-cluster configuration is loaded, and its token refreshed, in the child as here).
Each write runs there as a task of its own, so writes are as concurrent as they are in process.

Every write holds one of ``max_in_flight`` places here until its answer is back, so readiness and
``/metrics`` see writes waiting (``busy``, ``queued``, ``oldest_wait_s``) as with ``AioKubeApi``.
Answers and errors come back as they would from ``AioKubeApi``: the decoded object, or NotFound,
Conflict, Gone or KubeError with the server's status and reason.

A child says it is ready (its ``AioKubeApi`` built, the socket connected) before any write is sent:
one that exits or stays silent for ``START_TIMEOUT_S`` first (a configuration it cannot load, a
broken install) fails its start with ``KubeError``, so a scheduler that cannot make its writes stops
at start-up instead of serving binds that all fail.

If the child dies, or leaves a write unanswered for ``ANSWER_TIMEOUT_S`` or a watch silent for
``STREAM_SILENCE_S`` past the watch's own timeout (stuck: it is then stopped), every write waiting
on it fails with ``KubeError`` status 0, as a request whose connection broke does: it may or may
not have been made (``/bind`` checks, as it does after any failed Binding); its watches end with
the same error, and an informer resumes from the last resourceVersion it saw. The next write or
watch starts a new child, at most one start per ``RESTART_INTERVAL_S``. A watch whose reader stops
is stopped in the child. ``close()`` shuts the sending side of the socket: the child stops its
watches, answers the writes it has, then closes and exits; it gets ``CLOSE_TIMEOUT_S`` for that.

This module is the scheduler's side; the socket's frames, the messages and the helper's end are in
``vgpu.kube.offloadwire`` (``python -m vgpu.kube.offload`` runs that end).
"""

from __future__ import annotations

import asyncio
import logging
import pickle
import socket
import sys
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, Literal

from vgpu.core import errors
from vgpu.kube import offloadwire
from vgpu.kube.aioapi import AioKubeApi, RequestGate
from vgpu.kube.port import JsonObj, Kind, ObjectList, Transform, WatchEvent
from vgpu.waits import wait_at_most

log = logging.getLogger(__name__)

RESTART_INTERVAL_S = 1.0  # at most one child started per this long
# a write not answered in this long means a stuck child (its own requests time out after 30 s):
# the write fails, and the child is stopped and replaced
ANSWER_TIMEOUT_S = 45.0
START_TIMEOUT_S = 30.0  # for a child to say it is ready (a fresh interpreter's imports: about 1 s)
# a watch stream that sends nothing for this long past its own timeout means a stuck child (the
# child's request gives up 30 s after the watch's timeout and ends the stream itself)
STREAM_SILENCE_S = 60.0


class OffloadedKubeApi:
    """Implements ``vgpu.kube.port.KubeApi``: gets and lists through ``reader``, writes in a child
    process running ``factory()``, watches there too with ``watches`` (else through ``reader``); at
    most ``max_in_flight`` writes at once (None: no cap; watches take no place)."""

    def __init__(
        self,
        reader: AioKubeApi,
        factory: offloadwire.Factory,
        *,
        max_in_flight: int | None = None,
        answer_timeout_s: float = ANSWER_TIMEOUT_S,
        start_timeout_s: float = START_TIMEOUT_S,
        stream_silence_s: float = STREAM_SILENCE_S,
        watches: bool = False,
        log_level: int = logging.INFO,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._reader = reader
        self._factory = factory
        self._answer_timeout_s = answer_timeout_s
        self._start_timeout_s = start_timeout_s
        self._stream_silence_s = stream_silence_s
        self.watches_in_child = watches
        self._log_level = log_level
        self._clock = clock
        self._gate = RequestGate(max_in_flight, clock=clock)
        self._process: asyncio.subprocess.Process | None = None
        self._calls: offloadwire.Calls | None = None
        self._starting = asyncio.Lock()
        self._started_at: float | None = None
        self._closed = False
        self.starts = 0  # children started so far (more than one: the writer died and came back)

    # ----- readiness and /metrics (vgpu_scheduler/load.py PoolBacklog): reads and writes together -----

    @property
    def busy(self) -> int:
        return self._reader.busy + self._gate.busy

    @property
    def queued(self) -> int:
        return self._reader.queued + self._gate.queued

    def oldest_wait_s(self) -> float:
        return max(self._reader.oldest_wait_s(), self._gate.oldest_wait_s())

    @property
    def writer_pid(self) -> int | None:
        """The child's pid while one runs."""
        process = self._process
        return process.pid if process is not None and process.returncode is None else None

    # ----- the child's life -----

    async def start(self) -> None:
        """Start the child now (else the first write does)."""
        await self._connected()

    async def _connected(self) -> offloadwire.Calls:
        calls = self._calls
        if calls is not None and calls.alive:
            return calls
        async with self._starting:
            calls = self._calls
            if calls is not None and calls.alive:
                return calls
            if self._closed:
                raise errors.KubeError("the API writer is closed", status=0)
            await self._reap()
            if self._started_at is not None:
                wait_s = self._started_at + RESTART_INTERVAL_S - self._clock()
                if wait_s > 0:
                    await asyncio.sleep(wait_s)
            self._started_at = self._clock()
            self._calls = await self._spawn()
            return self._calls

    async def _spawn(self) -> offloadwire.Calls:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        fd = theirs.fileno()
        try:
            # a fresh interpreter, not multiprocessing: nothing of this process (its threads, its
            # __main__) is copied or imported again; it inherits only its end of the socket
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "vgpu.kube.offload",
                stdin=asyncio.subprocess.PIPE, pass_fds=(fd,),
            )  # fmt: skip
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self._process = process
        self.starts += 1
        assert process.stdin is not None
        process.stdin.write(pickle.dumps((fd, self._factory, self._log_level)))
        process.stdin.close()
        loop = asyncio.get_running_loop()
        transport, calls = await loop.create_unix_connection(offloadwire.Calls, sock=ours)
        # asyncio.wait: until it has a result or an exception, without raising the exception
        answered = await wait_at_most(asyncio.wait([calls.ready]), self._start_timeout_s)
        if not answered or calls.ready.exception():
            calls.ready.cancel()  # nothing waits for it any more (a no-op once it has failed)
            transport.abort()
            await self._reap()  # logs its exit code; kills it if it is still there
            how = (
                f"exited with code {process.returncode} (its error is logged above)"
                if answered
                else f"said nothing for {self._start_timeout_s:g} s and was stopped"
            )
            raise errors.KubeError(
                f"the API writer process (python -m vgpu.kube.offload, pid {process.pid}) did not start: "
                f"it {how}; scheduler.apiWriter: inline makes the writes in this process instead",
                status=0,
            )
        if self.starts > 1:
            log.warning("API writer process started again (pid %s, start %d)", process.pid, self.starts)
        else:
            log.info("API writer process started (pid %s)", process.pid)
        return calls

    async def _reap(self) -> None:
        """Collect a child that is gone (its exit code logged), or stop one whose channel broke."""
        process, self._process = self._process, None
        if process is None:
            return
        await wait_at_most(process.wait(), offloadwire.CLOSE_TIMEOUT_S if self._closed else 0.5)
        if process.returncode is None:
            process.kill()
            await process.wait()
        if not self._closed:
            log.warning("API writer process %s exited with code %s", process.pid, process.returncode)

    async def close(self) -> None:
        """Let the child finish its writes and stop it; close the reader."""
        self._closed = True
        async with self._starting:
            calls = self._calls
            if calls is not None and calls.transport is not None and not calls.closed.done():
                calls.transport.write_eof()  # the child answers what it has, then closes
                await wait_at_most(asyncio.shield(calls.closed), offloadwire.CLOSE_TIMEOUT_S)
                calls.transport.close()
            await self._reap()
        await self._reader.close()

    async def __aenter__(self) -> OffloadedKubeApi:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _write(self, method: str, *args: Any, **kwargs: Any) -> Any:
        async with self._gate.place():
            calls = await self._connected()
            try:
                # asyncio.timeout, not wait_for: in 3.11 wait_for can swallow a cancellation that
                # races the answer (a bind abandoned by kube-scheduler must end cancelled)
                async with asyncio.timeout(self._answer_timeout_s):
                    return await calls.call(method, args, kwargs)
            except TimeoutError:
                log.error(
                    "API writer process: no answer to %s in %g s; stopping it (another starts with the next write)",
                    method,
                    self._answer_timeout_s,
                )
                if calls.transport is not None:
                    calls.transport.abort()  # fails its other writes too; _connected reaps it
                raise errors.KubeError(
                    f"{method}: no answer from the API writer process in {self._answer_timeout_s:g} s: it may "
                    "or may not have been made",
                    status=0,
                ) from None

    # ----- gets and lists: here -----

    async def get(self, kind: Kind, name: str, *, namespace: str | None = None) -> JsonObj:
        return await self._reader.get(kind, name, namespace=namespace)

    async def list(
        self,
        kind: Kind,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> ObjectList:
        return await self._reader.list(
            kind, namespace=namespace, label_selector=label_selector, field_selector=field_selector
        )

    # ----- watches: in the child -----

    def watch(
        self,
        kind: Kind,
        *,
        resource_version: str,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        timeout_s: float | None = None,
        transform: Transform | None = None,
    ) -> AsyncIterator[WatchEvent]:
        """Read by the child with ``watches`` (its HTTP, TLS, JSON decoding and ``transform`` run
        there, and each event comes back transformed, one frame each), else by ``reader``."""
        if not self.watches_in_child:
            # the reader's own stream, not one wrapped in another generator: a watch event is on
            # the hot path (every pod change), and a wrapper would add a step to each
            return self._reader.watch(
                kind,
                resource_version=resource_version,
                namespace=namespace,
                label_selector=label_selector,
                field_selector=field_selector,
                timeout_s=timeout_s,
                transform=transform,
            )
        kwargs = {
            "resource_version": resource_version,
            "namespace": namespace,
            "label_selector": label_selector,
            "field_selector": field_selector,
            "timeout_s": timeout_s,
            "transform": transform,
        }
        return self._watch_in_child(kind, kwargs)

    async def _watch_in_child(self, kind: Kind, kwargs: dict[str, Any]) -> AsyncIterator[WatchEvent]:
        calls = await self._connected()
        timeout_s = kwargs["timeout_s"]
        rid, queue = calls.stream(offloadwire.WATCH, (kind,), kwargs)
        silence_s = None if timeout_s is None else timeout_s + self._stream_silence_s
        try:
            while True:
                try:
                    if queue.empty():
                        async with asyncio.timeout(silence_s):
                            item = await queue.get()
                    else:  # events come in bursts, several to a read: no timer for those
                        item = queue.get_nowait()
                except TimeoutError:
                    log.error(
                        "API writer process: its watch of %s sent nothing for %g s; stopping it (another "
                        "starts with the next call)",
                        kind,
                        silence_s,
                    )
                    if calls.transport is not None:
                        calls.transport.abort()
                    raise errors.KubeError(
                        f"watch {kind}: nothing from the API writer process in {silence_s:g} s", status=0
                    ) from None
                if item is offloadwire.END:
                    return
                if isinstance(item, errors.KubeError):
                    raise item
                yield WatchEvent(*item)
        finally:
            calls.cancel(rid)

    # ----- writes: in the child -----

    async def create(self, kind: Kind, body: JsonObj, *, namespace: str | None = None) -> JsonObj:
        result: JsonObj = await self._write("create", kind, body, namespace=namespace)
        return result

    async def replace(self, kind: Kind, body: JsonObj, *, namespace: str | None = None) -> JsonObj:
        result: JsonObj = await self._write("replace", kind, body, namespace=namespace)
        return result

    async def merge_patch(
        self, kind: Kind, name: str, patch: Mapping[str, Any], *, namespace: str | None = None
    ) -> JsonObj:
        result: JsonObj = await self._write("merge_patch", kind, name, dict(patch), namespace=namespace)
        return result

    async def merge_patch_status(
        self, kind: Kind, name: str, patch: Mapping[str, Any], *, namespace: str | None = None
    ) -> JsonObj:
        result: JsonObj = await self._write(
            "merge_patch_status", kind, name, dict(patch), namespace=namespace
        )
        return result

    async def delete(
        self, kind: Kind, name: str, *, namespace: str | None = None, grace_period_s: int | None = None
    ) -> None:
        await self._write("delete", kind, name, namespace=namespace, grace_period_s=grace_period_s)

    async def bind_pod(
        self,
        namespace: str,
        name: str,
        *,
        node: str,
        uid: str | None = None,
        annotations: Mapping[str, str] | None = None,
    ) -> None:
        await self._write(
            "bind_pod",
            namespace,
            name,
            node=node,
            uid=uid,
            annotations=None if annotations is None else dict(annotations),
        )

    async def evict_pod(
        self, namespace: str, name: str, *, uid: str | None = None, grace_period_s: int | None = None
    ) -> None:
        await self._write("evict_pod", namespace, name, uid=uid, grace_period_s=grace_period_s)

    async def create_event(
        self,
        *,
        namespace: str,
        involved: JsonObj,
        reason: str,
        message: str,
        type: Literal["Normal", "Warning"] = "Normal",
        component: str = "vgpu-scheduler",
        count: int = 1,
    ) -> None:
        await self._write(
            "create_event",
            namespace=namespace,
            involved=involved,
            reason=reason,
            message=message,
            type=type,
            component=component,
            count=count,
        )


if __name__ == "__main__":
    offloadwire.child_main()
