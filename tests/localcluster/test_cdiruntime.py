"""The emulated runtime's CDI resolution: names from answers, spec directories, garbage specs."""

import json
import pathlib

import pytest
from vgpu.localcluster import cdiruntime


def spec(kind: str, name: str, env: str, version: str = "0.3.0") -> str:
    return json.dumps(
        {"cdiVersion": version, "kind": kind, "devices": [{"name": name, "containerEdits": {"env": [env]}}]}
    )


@pytest.fixture
def dirs(tmp_path: pathlib.Path) -> list[pathlib.Path]:
    etc, run = tmp_path / "etc/cdi", tmp_path / "var/run/cdi"
    etc.mkdir(parents=True)
    run.mkdir(parents=True)
    (etc / "a.json").write_text(spec("vendor.com/dev", "one", "FROM=etc"))
    (run / "a.json").write_text(spec("vendor.com/dev", "one", "FROM=run"))  # /var/run/cdi wins
    (etc / "b.yaml").write_text(
        "cdiVersion: 0.3.0\nkind: vendor.com/dev\ndevices:\n- name: two\n  containerEdits:\n    env: [B=1]\n"
    )
    (run / "broken.json").write_text("{not json")
    (run / "broken.yaml").write_text("kind: [unclosed")
    (run / "invalid.json").write_text(spec("vendor.com/dev", "three", "NOEQUALS"))
    (run / "too-new.json").write_text(spec("vendor.com/dev", "four", "A=1", version="9.0.0"))
    (run / "notes.txt").write_text(spec("vendor.com/dev", "five", "A=1"))
    return [etc, run]


def test_names_come_from_cdi_devices_and_cdi_annotations() -> None:
    entry = {
        "cdiDevices": ["a.com/x=1"],
        "annotations": {"cdi.k8s.io/p_1": "b.com/y=2, c.com/z=3", "other": "d.com/w=4"},
    }
    assert cdiruntime.requested(entry) == ["a.com/x=1", "b.com/y=2", "c.com/z=3"]
    assert cdiruntime.requested({}) == []


def test_valid_specs_resolve_and_the_later_directory_wins(dirs: list[pathlib.Path]) -> None:
    got = cdiruntime.resolve(["vendor.com/dev=one", "vendor.com/dev=two"], spec_dirs=dirs)
    assert got["env"] == ["FROM=run", "B=1"]


@pytest.mark.parametrize(
    "name", ["three", "four", "five", "six"], ids=["invalid", "too-new", "not-a-spec-file", "absent"]
)
def test_garbage_or_absent_specs_leave_names_unresolvable(dirs: list[pathlib.Path], name: str) -> None:
    with pytest.raises(cdiruntime.Unresolvable) as info:
        cdiruntime.resolve(["vendor.com/dev=one", f"vendor.com/dev={name}"], spec_dirs=dirs)
    assert str(info.value) == f"CDI device injection failed: unresolvable CDI devices vendor.com/dev={name}"


def test_missing_directories_resolve_nothing(tmp_path: pathlib.Path) -> None:
    assert cdiruntime.resolve([], spec_dirs=[tmp_path / "none"]) == {}
    with pytest.raises(cdiruntime.Unresolvable):
        cdiruntime.resolve(["a.com/x=1"], spec_dirs=[tmp_path / "none"])
