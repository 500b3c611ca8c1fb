"""NodePrepareResources and NodeUnprepareResources of the DRA kubelet plugin, without gRPC.

Prepare, per claim: a claim in the checkpoint whose spec file is still there gets the recorded
answer (kubelet retries; the same answer, no API call). Otherwise the claim is read from the API
server (``port.ClaimReader``) by namespace/name and its UID checked, ``cdiclaim.plan`` maps its
allocation on this node to our GPUs, HAMi-core's files are checked (a runtime would make a missing
one a directory and start the container unlimited), each request's cache directory is made, the CDI
spec written (temp file + rename) and then the checkpoint. Unprepare, per claim: the spec file and
the cache directories (named from the claim UID, so a claim missing from the checkpoint, after a
crash between the spec and the checkpoint, is cleaned too) are removed, then the entry; a claim
never prepared succeeds. Every failure is that claim's ``error`` in kubelet's answer, never raised.

Cache directories live in ``<hook>/vgpu/claims/<claim uid>-<request>``: inside root's
``<hook>/vgpu`` (checked as the lock directory is: a real directory owned by root, by lstat),
``claims`` made by us and checked likewise, each entry made with ``mkdir`` (no symlink followed) and
opened ``O_NOFOLLOW`` to set mode 0777 (HAMi-core in the container runs as any user); a planted
symlink in its place is refused. File work runs off the event loop (``offload``), one claim's
writes at a time (the checkpoint is one file).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import os
import pathlib
import shutil
import stat
from collections.abc import Mapping, Sequence

from vgpu.core import allocation, cdispec, errors
from vgpu.core.config import DevicePluginConfig
from vgpu.core.device import GpuUuid
from vgpu.core.dra import cdiclaim
from vgpu.kube.port import ClaimReader

from vgpu_device_plugin import cdispecfile
from vgpu_device_plugin.allocator import Offload
from vgpu_device_plugin.dra import checkpoint
from vgpu_device_plugin.hostfs import HostFs

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, slots=True)
class ClaimRef:
    """kubelet's ``Claim``: which claim to prepare or unprepare."""

    uid: str
    namespace: str
    name: str


@dataclasses.dataclass(frozen=True, slots=True)
class Prepared:
    """One claim's Prepare result: its devices, or why not (``error`` non-empty)."""

    devices: tuple[cdiclaim.PreparedDevice, ...] = ()
    error: str = ""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Deps:
    """What the preparer works with."""

    claims: ClaimReader
    node: str
    config: DevicePluginConfig
    gpus: Sequence[cdiclaim.Gpu]
    host: HostFs
    plugin_dir: pathlib.Path  # where the checkpoint lives (a path this process reaches)
    offload: Offload = asyncio.to_thread


class Preparer:
    def __init__(self, deps: Deps) -> None:
        self._deps = deps
        self._by_index = cdiclaim.gpus_by_index(deps.gpus)
        self._refs: Mapping[GpuUuid, allocation.GpuRef] = {g.ref.uuid: g.ref for g in deps.gpus}
        self._entries: dict[str, checkpoint.Entry] = {}
        self._lock = asyncio.Lock()
        self._cdi_dir = deps.host.root / deps.config.cdi_spec_dir.lstrip("/")
        self.checkpoint_path = deps.plugin_dir / checkpoint.FILE_NAME

    @property
    def prepared(self) -> Mapping[str, checkpoint.Entry]:
        """The claims prepared now, by UID."""
        return dict(self._entries)

    async def start(self) -> None:
        """Read the checkpoint (an earlier run's prepared claims)."""
        self._entries = await self._deps.offload(functools.partial(checkpoint.load, self.checkpoint_path))
        log.info(
            "node %s: DRA plugin starts with %d prepared claim(s) from %s",
            self._deps.node,
            len(self._entries),
            self.checkpoint_path,
        )

    # --- Prepare ------------------------------------------------------------------------------

    async def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, Prepared]:
        results = await asyncio.gather(*(self._prepare_one(c) for c in claims))
        return {c.uid: r for c, r in zip(claims, results, strict=True)}

    async def _prepare_one(self, ref: ClaimRef) -> Prepared:
        where = f"claim {ref.namespace}/{ref.name} ({ref.uid}) on node {self._deps.node}"
        try:
            cdiclaim.check_uid(ref.uid)
            if not ref.namespace or not ref.name:
                raise cdiclaim.ClaimError("kubelet named no namespace or no name for it")
            recorded = await self._recorded(ref)
            if recorded is not None:
                log.info("NodePrepareResources: %s asked again; same answer", where)
                return Prepared(devices=recorded.devices)
            claim = await self._deps.claims.get_resource_claim(ref.namespace, ref.name)
            uid = (claim.get("metadata") or {}).get("uid")
            if uid != ref.uid:
                raise cdiclaim.ClaimError(f"the API server has UID {uid!r} under that name (a new claim?)")
            plan = cdiclaim.plan(claim, node=self._deps.node, gpus=self._by_index, config=self._deps.config)
            async with self._lock:
                entry = await self._deps.offload(functools.partial(self._write, ref, plan))
                await self._record({**self._entries, ref.uid: entry})
        except errors.NotFound:
            return self._failed(where, "the claim is not on the API server (deleted?)")
        except errors.KubeError as exc:
            return self._failed(where, f"reading it from the API server failed: {exc}")
        except (cdiclaim.ClaimError, errors.AllocationError) as exc:
            return self._failed(where, str(exc))
        except OSError as exc:
            return self._failed(where, f"cannot write its files: {exc}")
        except Exception as exc:  # a bug is that claim's error, never the plugin's crash
            log.exception("NodePrepareResources: %s failed unexpectedly", where)
            return Prepared(error=f"{where}: internal error: {exc!r}")
        log.info(
            "NodePrepareResources: %s prepared: %s",
            where,
            ", ".join(
                f"{r.request}={','.join(f'{d.uuid}({d.memory_mib}MiB,{d.cores}%)' for d in r.devices)}"
                for r in plan.requests
            ),
        )
        return Prepared(devices=entry.devices)

    async def _record(self, entries: dict[str, checkpoint.Entry]) -> None:
        """Save ``entries`` as the checkpoint, then hold them (a failed save changes nothing, so
        kubelet's retry does the work again)."""
        await self._deps.offload(functools.partial(checkpoint.save, self.checkpoint_path, entries))
        self._entries = entries

    @staticmethod
    def _failed(where: str, why: str) -> Prepared:
        message = f"{where}: {why}"
        log.warning("NodePrepareResources: %s", message)
        return Prepared(error=message)

    async def _recorded(self, ref: ClaimRef) -> checkpoint.Entry | None:
        entry = self._entries.get(ref.uid)
        if entry is None:
            return None
        present = await self._deps.offload(functools.partial(self._files_present, entry))
        return entry if present else None

    def _files_present(self, entry: checkpoint.Entry) -> bool:
        """Whether what ``entry`` wrote is all still there (blocking: off the loop): else the
        claim is prepared again (a runtime would make a missing cache directory an empty one)."""
        if not (self._cdi_dir / entry.spec_file).is_file():
            return False
        root = self._deps.host.root
        try:
            return all(stat.S_ISDIR(os.lstat(root / d.lstrip("/")).st_mode) for d in entry.cache_dirs)
        except OSError:
            return False

    def _write(self, ref: ClaimRef, plan: cdiclaim.Plan) -> checkpoint.Entry:
        """The claim's directories and spec (blocking: off the loop)."""
        host = self._deps.host
        host.check_hami_core()
        config = self._deps.config
        dirs = cdiclaim.cache_dirs(plan, hook_path=config.hook_path)
        for host_path in dirs:
            self._cache_dir(host_path)
        doc = cdiclaim.document(plan, config=config, gpus=self._refs, host=host.facts())
        spec_file = cdiclaim.spec_file_name(plan.claim_uid)
        cdispecfile.write_atomically(self._cdi_dir / spec_file, cdispec.encode(doc))
        return checkpoint.Entry(
            uid=ref.uid,
            namespace=ref.namespace,
            name=ref.name,
            spec_file=spec_file,
            cache_dirs=tuple(dirs),
            devices=plan.devices,
        )

    def _claims_dir(self) -> pathlib.Path:
        """``<root><hook>/vgpu/claims``, made and checked (see the module docstring)."""
        host = self._deps.host
        host.lock_dir()  # checks <hook>/vgpu (root's real directory) and makes the lock dir
        local = host.root / allocation.hami_core_dir(host.hook_path).lstrip("/") / "claims"
        with contextlib.suppress(FileExistsError):
            os.mkdir(local, 0o755)
        self._trusted(os.lstat(local), str(local))
        return local

    def _trusted(self, st: os.stat_result, path: str) -> None:
        if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
            raise cdiclaim.ClaimError(f"{path} is not a directory (a symlink or a file?); refusing it")
        if st.st_uid not in self._deps.host.trusted_uids:
            raise cdiclaim.ClaimError(f"{path} is owned by uid {st.st_uid}, not root; refusing it")

    def _cache_dir(self, host_path: str) -> None:
        local = self._claims_dir() / host_path.rsplit("/", 1)[-1]
        with contextlib.suppress(FileExistsError):
            os.mkdir(local, 0o700)
        self._trusted(os.lstat(local), host_path)  # a planted symlink or file: refused, not followed
        fd = os.open(local, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            self._trusted(os.fstat(fd), host_path)
            os.fchmod(fd, 0o777)
        finally:
            os.close(fd)

    # --- Unprepare ----------------------------------------------------------------------------

    async def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        """Each claim's error ('' when done)."""
        out: dict[str, str] = {}
        for ref in claims:
            out[ref.uid] = await self._unprepare_one(ref)
        return out

    async def _unprepare_one(self, ref: ClaimRef) -> str:
        where = f"claim {ref.namespace}/{ref.name} ({ref.uid}) on node {self._deps.node}"
        try:
            cdiclaim.check_uid(ref.uid)
            async with self._lock:
                known = ref.uid in self._entries
                await self._deps.offload(functools.partial(self._remove, ref.uid))
                if known:
                    await self._record({u: e for u, e in self._entries.items() if u != ref.uid})
        except (cdiclaim.ClaimError, OSError) as exc:
            log.warning("NodeUnprepareResources: %s: %s", where, exc)
            return f"{where}: {exc}"
        log.info("NodeUnprepareResources: %s %s", where, "unprepared" if known else "was not prepared here")
        return ""

    def _remove(self, uid: str) -> None:
        """The spec file and cache directories of claim ``uid`` (blocking: off the loop)."""
        (self._cdi_dir / cdiclaim.spec_file_name(uid)).unlink(missing_ok=True)
        host = self._deps.host
        local = host.root / allocation.hami_core_dir(host.hook_path).lstrip("/") / "claims"
        try:
            names = [e.name for e in os.scandir(local) if e.name.startswith(f"{uid}-")]
        except FileNotFoundError:
            return
        for name in names:
            path = local / name
            if stat.S_ISDIR(os.lstat(path).st_mode):
                shutil.rmtree(path)
            else:
                path.unlink()  # a planted symlink: unlinked, never followed
