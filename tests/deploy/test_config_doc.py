"""docs/configuration.md's config reference is generated from ``vgpu.core.config``; it must be fresh,
and it must name every key with its real default."""

from __future__ import annotations

import dataclasses
import importlib.util
import pathlib
import sys
from types import ModuleType

import pytest
import yaml
from vgpu.core import config, configload

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def gen() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_config_doc", REPO / "scripts" / "gen_config_doc.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("gen_config_doc", module)
    spec.loader.exec_module(module)
    return module


def test_configuration_doc_is_up_to_date(gen):
    page = gen.DOC.read_text()
    assert gen.apply(page) == page, (
        "docs/configuration.md is stale (the config model changed): run `python scripts/gen_config_doc.py`"
    )


def test_check_mode_reports_a_stale_page(gen, tmp_path, monkeypatch, capsys):
    stale = tmp_path / "configuration.md"
    stale.write_text(gen.DOC.read_text().replace("`nodeLockTimeoutS`", "`oldName`"))
    monkeypatch.setattr(gen, "DOC", stale)
    monkeypatch.setattr(gen, "REPO", tmp_path)
    assert gen.main(["--check"]) == 1
    assert "stale" in capsys.readouterr().err
    assert gen.main([]) == 0
    assert gen.main(["--check"]) == 0
    assert "`nodeLockTimeoutS`" in stale.read_text()


def test_every_key_of_every_section_is_in_the_reference(gen):
    generated = gen.generate()
    for section in (
        config.ResourceNames,
        config.SchedulerConfig,
        config.WebhookConfig,
        config.DevicePluginConfig,
    ):
        for f in dataclasses.fields(section):
            assert f"| `{configload.camel(f.name)}` |" in generated, f.name


def test_the_defaults_file_in_the_doc_loads_to_the_defaults(gen):
    block = gen.generate().split("```yaml\n", 1)[1].split("```", 1)[0]
    assert config.load(yaml.safe_load(block)) == config.Config()


def test_missing_markers_are_an_error(gen):
    with pytest.raises(SystemExit, match="markers"):
        gen.apply("# Configuration\n\nno markers here\n")
