"""HAMi-core's per-container directories are removed once their pod has left the node (issue 47)."""

from __future__ import annotations

import pytest
from vgpu.core import cachedirs
from vgpu.core.cachedirs import CacheDir


def test_a_directory_of_a_departed_pod_older_than_the_grace_is_stale() -> None:
    entries = [
        CacheDir("uid-gone_main", 61.0),  # pod gone, old: removed
        CacheDir("uid-gone_side", 61.0),
        CacheDir("uid-live_main", 9999.0),  # pod still on the node
        CacheDir("uid-new_main", 5.0),  # too young: its pod may not be in the view yet
    ]
    assert cachedirs.stale(entries, live_pod_uids={"uid-live"}, grace_s=60.0) == [
        "uid-gone_main",
        "uid-gone_side",
    ]


@pytest.mark.parametrize(
    "name",
    ["", "_main", "uid_", "nounderscore", ".hidden_x", "lost+found"],
    ids=["empty", "no-uid", "no-container", "no-separator", "hidden", "other"],
)
def test_names_that_are_not_uid_and_container_are_never_touched(name: str) -> None:
    assert cachedirs.pod_uid_of(name) is None
    assert cachedirs.stale([CacheDir(name, 1e9)], live_pod_uids=set(), grace_s=0.0) == []


def test_container_names_with_underscores_keep_the_uid_before_the_first() -> None:
    assert cachedirs.pod_uid_of("6f1c-aa_my_container") == "6f1c-aa"
