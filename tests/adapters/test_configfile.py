"""Reading the shared config file: good files load, bad ones are a ConfigError naming the flag."""

from __future__ import annotations

import pathlib

import pytest
from vgpu import configfile
from vgpu.core import config, errors


def test_none_gives_the_defaults() -> None:
    assert configfile.load(None) == config.Config()


def test_a_file_loads_and_validates(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "vgpu.yaml"
    path.write_text("scheduler:\n  nodePolicy: spread\n")
    assert configfile.load(path).scheduler.node_policy is config.Policy.SPREAD
    path.write_text("scheduler:\n  nodePolicy: sideways\n")
    with pytest.raises(errors.ConfigError) as info:
        configfile.load(path)
    assert info.value.field == "scheduler.nodePolicy"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read"),
        (b"scheduler: [unclosed", "is not valid YAML"),
        (b"\xff\xfe\x00garbage", "is not UTF-8 text"),
    ],
)
def test_unusable_files_name_the_flag(tmp_path: pathlib.Path, content: bytes | None, message: str) -> None:
    path = tmp_path / "vgpu.yaml"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(errors.ConfigError) as info:
        configfile.read_yaml(path, field="--config")
    assert info.value.field == "--config"
    assert message in str(info.value) and str(path) in str(info.value)
