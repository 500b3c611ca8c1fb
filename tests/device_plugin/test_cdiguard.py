"""The CDI specs a CDI strategy needs on the host: found, missing, garbage files."""

import json
import logging
import pathlib

import pytest
from vgpu_device_plugin import cdiguard, inventory

from tests.device_plugin.builders import GPU_A, GPU_B, config, fake_backend


def write(root: pathlib.Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_specs_of_both_directories_and_formats_are_read_and_garbage_skipped(tmp_path: pathlib.Path) -> None:
    write(
        tmp_path, "etc/cdi/nvidia.json", json.dumps({"kind": "nvidia.com/gpu", "devices": [{"name": GPU_A}]})
    )
    write(tmp_path, "var/run/cdi/nvidia.yaml", f"kind: nvidia.com/gpu\ndevices:\n- name: '{GPU_B}'\n")
    write(tmp_path, "var/run/cdi/broken.json", "{not json")
    write(tmp_path, "var/run/cdi/broken.yaml", "kind: [unclosed")
    write(
        tmp_path, "var/run/cdi/other.json", json.dumps({"kind": "intel.com/fpga", "devices": [{"name": "x"}]})
    )
    write(tmp_path, "var/run/cdi/README.txt", "not a spec")
    assert cdiguard.read_spec_names(tmp_path, kind="nvidia.com/gpu") == {GPU_A, GPU_B}
    assert cdiguard.read_spec_names(tmp_path / "nothing-here", kind="nvidia.com/gpu") == set()


@pytest.mark.parametrize(
    ("case"),
    [
        ("cdi-cri", "uuid", [GPU_A], [GPU_B]),
        ("cdi-annotations", "index", ["0", "1"], []),
        ("cdi-annotations", "index", [GPU_A, GPU_B], ["0", "1"]),
        ("envvar", "uuid", [], []),  # no CDI: nothing to check
    ],
    ids=["cdi-cri-one-missing", "index-names", "uuid-spec-index-names", "envvar"],
)
async def test_check_specs_logs_the_devices_no_spec_defines(
    tmp_path: pathlib.Path,
    caplog: pytest.LogCaptureFixture,
    case: tuple[str, str, list[str], list[str]],
) -> None:
    strategy, ids, spec_names, missing = case
    write(
        tmp_path,
        "var/run/cdi/nvidia.json",
        json.dumps({"kind": "nvidia.com/gpu", "devices": [{"name": n} for n in spec_names]}),
    )
    cfg = config(device_list_strategy=strategy, device_id_strategy=ids)
    names = cdiguard.cdi_names(inventory.build(fake_backend().devices(), cfg), cfg)
    with caplog.at_level(logging.ERROR):
        got = await cdiguard.check_specs(root=tmp_path, config=cfg, names=names, node="n1")
    assert got == missing
    assert ("unresolvable CDI devices" in caplog.text) == bool(missing)
