"""The DRA plugin's checkpoint: a restarted plugin answers a retried Prepare and serves Unprepare
from it (the claim may be gone from the API server by then), a crash between the spec and the
checkpoint leaves nothing behind after Unprepare, and a checkpoint that does not decode is logged
and read as empty."""

from __future__ import annotations

import json
import pathlib
import shutil
from collections.abc import Iterator

import pytest
from vgpu.core.dra import cdiclaim
from vgpu_device_plugin.dra import checkpoint
from vgpu_device_plugin.dra.prepare import ClaimRef

from tests.device_plugin.builders import short_tmp
from tests.device_plugin.dra import claims as c

UID = "5eed0000-0000-0000-0000-000000000001"
REF = ClaimRef(uid=UID, namespace="ns", name="one")


@pytest.fixture
def root() -> Iterator[pathlib.Path]:
    path = short_tmp()
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def test_a_restarted_plugin_answers_from_the_checkpoint_and_unprepares(root: pathlib.Path) -> None:
    first = c.preparer(root, c.FakeClaims(c.claim("one", UID)))
    await first.start()
    answer = (await first.prepare([REF]))[UID]
    assert answer.error == "" and answer.devices

    gone = c.FakeClaims()  # the API server no longer has it: only the checkpoint can answer
    second = c.preparer(root, gone)
    await second.start()
    assert set(second.prepared) == {UID}
    assert (await second.prepare([REF]))[UID] == answer
    assert gone.reads == 0

    assert await second.unprepare([REF]) == {UID: ""}
    assert not c.spec_path(root, UID).exists() and not c.cache_dir(root, UID).exists()
    assert checkpoint.load(second.checkpoint_path) == {}


async def test_a_crash_before_the_checkpoint_leaves_nothing_after_unprepare(root: pathlib.Path) -> None:
    first = c.preparer(root, c.FakeClaims(c.claim("one", UID)))
    await first.start()
    await first.prepare([REF])
    first.checkpoint_path.unlink()  # the spec and directory were written, the checkpoint not
    second = c.preparer(root, c.FakeClaims())
    await second.start()
    assert second.prepared == {}
    assert await second.unprepare([REF]) == {UID: ""}
    assert not c.spec_path(root, UID).exists() and not c.cache_dir(root, UID).exists()


@pytest.mark.parametrize("lost", ["spec", "cache-dir"])
async def test_a_recorded_claim_whose_files_are_gone_is_prepared_again(root: pathlib.Path, lost: str) -> None:
    claims = c.FakeClaims(c.claim("one", UID))
    prep = c.preparer(root, claims)
    await prep.start()
    before = (await prep.prepare([REF]))[UID]
    if lost == "spec":
        c.spec_path(root, UID).unlink()
    else:
        shutil.rmtree(c.cache_dir(root, UID))
    assert (await prep.prepare([REF]))[UID] == before
    assert claims.reads == 2 and c.spec_path(root, UID).is_file() and c.cache_dir(root, UID).is_dir()


def test_entries_round_trip() -> None:
    entry = checkpoint.Entry(
        uid=UID,
        namespace="ns",
        name="one",
        spec_file=cdiclaim.spec_file_name(UID),
        cache_dirs=("/usr/local/vgpu/claims/x-gpu",),
        devices=(
            cdiclaim.PreparedDevice(
                request="gpu", pool="n", device="gpu-0", share_id="s", cdi_device_ids=("a=b",)
            ),
            cdiclaim.PreparedDevice(
                request="gpu", pool="n", device="gpu-1", share_id=None, cdi_device_ids=()
            ),
        ),
    )
    assert checkpoint.decode(checkpoint.encode({UID: entry})) == {UID: entry}


def _doc(claim: object) -> str:
    return json.dumps({"version": 1, "claims": {UID: claim}})


GOOD = {"namespace": "ns", "name": "one", "specFile": "f.json", "cacheDirs": [], "devices": []}


@pytest.mark.parametrize(
    "text",
    [
        "",
        "{not json",
        "[]",
        json.dumps({"version": 2, "claims": {}}),
        json.dumps({"version": 1, "claims": []}),
        _doc("x"),
        _doc({**GOOD, "name": 3}),
        _doc({**GOOD, "cacheDirs": "dir"}),
        _doc({**GOOD, "devices": {}}),
        _doc({**GOOD, "devices": ["x"]}),
        _doc({**GOOD, "devices": [{"request": "gpu", "pool": "n", "device": 0}]}),
        _doc({**GOOD, "devices": [{"request": "gpu", "pool": "n", "device": "d", "cdiDeviceIDs": "x"}]}),
        json.dumps({"version": 1, "claims": {"../x": GOOD}}),
    ],
    ids=[
        "empty",
        "not-json",
        "list",
        "version",
        "claims-list",
        "claim-string",
        "name-number",
        "dirs-string",
        "devices-object",
        "device-string",
        "device-name-number",
        "cdi-ids-string",
        "unsafe-uid",
    ],
)
def test_garbage_checkpoints_are_refused(text: str) -> None:
    with pytest.raises(checkpoint.CheckpointError):
        checkpoint.decode(text)


async def test_an_unreadable_checkpoint_is_logged_and_read_as_empty(
    root: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    prep = c.preparer(root, c.FakeClaims(c.claim("one", UID)))
    prep.checkpoint_path.parent.mkdir(parents=True)
    prep.checkpoint_path.write_text("{garbage")
    await prep.start()
    assert prep.prepared == {}
    assert "is not readable" in caplog.text
    assert (await prep.prepare([REF]))[UID].error == ""  # and the plugin keeps working
    assert set(checkpoint.load(prep.checkpoint_path)) == {UID}


def _block(path: pathlib.Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("not a directory")


async def test_a_checkpoint_that_cannot_be_saved_fails_the_claim_until_it_can(root: pathlib.Path) -> None:
    prep = c.preparer(root, c.FakeClaims(c.claim("one", UID)))
    await prep.start()
    _block(prep.checkpoint_path.parent)  # the plugin directory is a file: nothing can be saved there
    failed = (await prep.prepare([REF]))[UID]
    assert "cannot write its files" in failed.error
    assert prep.prepared == {}  # not answered from memory on the retry
    prep.checkpoint_path.parent.unlink()
    assert (await prep.prepare([REF]))[UID].error == ""
    assert set(checkpoint.load(prep.checkpoint_path)) == {UID}
