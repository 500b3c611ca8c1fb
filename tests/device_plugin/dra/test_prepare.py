"""Prepare's host files: the per-request cache directories are made only inside root's
``<hook>/vgpu`` and never through a symlink someone planted; Unprepare unlinks a planted symlink
without following it; the CDI spec appears whole (temp file + rename, no temp left)."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
from collections.abc import Iterator

import pytest
from vgpu.core import cdispec
from vgpu_device_plugin.dra.prepare import ClaimRef

from tests.device_plugin.builders import short_tmp
from tests.device_plugin.dra import claims as c

UID = "5afe0000-0000-0000-0000-000000000001"
REF = ClaimRef(uid=UID, namespace="ns", name="one")


@pytest.fixture
def root() -> Iterator[pathlib.Path]:
    path = short_tmp()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _plant(link: pathlib.Path, target: pathlib.Path) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    target.mkdir(parents=True, exist_ok=True)
    os.symlink(target, link)


async def test_a_planted_symlink_in_place_of_the_cache_dir_is_refused(root: pathlib.Path) -> None:
    prep = c.preparer(root, c.FakeClaims(c.claim("one", UID)))
    await prep.start()
    elsewhere = root / "elsewhere"
    _plant(c.cache_dir(root, UID), elsewhere)
    answer = (await prep.prepare([REF]))[UID]
    assert f"/usr/local/vgpu/claims/{UID}-gpu is not a directory (a symlink or a file?)" in answer.error
    assert not c.spec_path(root, UID).exists()
    assert elsewhere.stat().st_mode & 0o777 != 0o777  # never chmod'ed through the link
    assert await prep.unprepare([REF]) == {UID: ""}
    assert not c.cache_dir(root, UID).is_symlink() and elsewhere.is_dir()  # unlinked, not followed


async def test_a_symlinked_claims_dir_is_refused(root: pathlib.Path) -> None:
    prep = c.preparer(root, c.FakeClaims(c.claim("one", UID)))
    await prep.start()
    _plant(root / "usr/local/vgpu/claims", root / "elsewhere")
    answer = (await prep.prepare([REF]))[UID]
    assert "claims is not a directory (a symlink or a file?)" in answer.error
    assert not (root / "elsewhere" / f"{UID}-gpu").exists()


async def test_a_hook_dir_not_owned_by_root_is_refused(root: pathlib.Path) -> None:
    prep = c.preparer(root, c.FakeClaims(c.claim("one", UID)), trusted_uids=frozenset({os.geteuid() + 1}))
    await prep.start()
    answer = (await prep.prepare([REF]))[UID]
    assert "not root" in answer.error
    assert not c.spec_path(root, UID).exists()


async def test_the_spec_is_valid_and_no_temp_file_is_left(root: pathlib.Path) -> None:
    prep = c.preparer(root, c.FakeClaims(c.claim("one", UID)))
    await prep.start()
    await prep.prepare([REF])
    cdi_dir = root / "var/run/cdi"
    assert sorted(p.name for p in cdi_dir.iterdir()) == [f"kube-vgpu.io-claim_{UID}.json"]
    assert cdispec.validate(json.loads(c.spec_path(root, UID).read_text())) == []
