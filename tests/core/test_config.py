"""Configuration loading: defaults, overrides per node, and errors that name the bad key."""

from __future__ import annotations

import pytest
import yaml
from vgpu.core import config, errors

EXAMPLE = """
annotationPrefix: hami.io
resources:
  memory: example.com/vmem
scheduler:
  schedulerName: my-scheduler
  nodePolicy: spread
  gpuPolicy: binpack
  nodeLockTimeoutS: 30
webhook:
  defaultMemoryMib: 1024
  gpuCorePolicy: force
devicePlugin:
  deviceSplitCount: 8
  deviceMemoryScaling: 1.5
nodes:
  gpu-node-1:
    deviceSplitCount: 2
"""


def test_defaults_match_hami_resource_names() -> None:
    cfg = config.load(None)
    assert cfg.resources.all() == (
        "nvidia.com/gpu",
        "nvidia.com/gpumem",
        "nvidia.com/gpumem-percentage",
        "nvidia.com/gpucores",
        "nvidia.com/priority",
    )
    assert cfg.scheduler.node_policy is config.Policy.BINPACK
    assert cfg.scheduler.gpu_policy is config.Policy.SPREAD
    assert cfg.device_plugin.device_split_count == 10
    assert config.load({}) == cfg


def test_example_file_loads_and_node_overrides_apply() -> None:
    cfg = config.load(yaml.safe_load(EXAMPLE))
    assert cfg.resources.memory == "example.com/vmem"
    assert cfg.scheduler.scheduler_name == "my-scheduler"
    assert cfg.scheduler.node_lock_timeout_s == 30.0
    assert cfg.webhook.gpu_core_policy is config.CorePolicy.FORCE
    assert cfg.for_node("gpu-node-1").device_split_count == 2
    assert cfg.for_node("gpu-node-1").device_memory_scaling == 1.5
    assert cfg.for_node("other").device_split_count == 8


@pytest.mark.parametrize(
    ("raw", "key", "message"),
    [
        ({"bogus": 1}, "bogus", "unknown key"),
        ({"scheduler": {"nodePolicy": "random"}}, "scheduler.nodePolicy", "not one of binpack, spread"),
        ({"scheduler": []}, "scheduler", "expected a mapping"),
        (
            {"devicePlugin": {"deviceSplitCount": "ten"}},
            "devicePlugin.deviceSplitCount",
            "expected an integer",
        ),
        (
            {"devicePlugin": {"deviceSplitCount": True}},
            "devicePlugin.deviceSplitCount",
            "expected an integer",
        ),
        ({"devicePlugin": {"deviceSplitCount": 0}}, "devicePlugin.deviceSplitCount", "at least 1"),
        ({"devicePlugin": {"deviceMemoryScaling": 0}}, "devicePlugin.deviceMemoryScaling", "greater than 0"),
        ({"webhook": {"defaultCores": 101}}, "webhook.defaultCores", "between 0 and 100"),
        ({"webhook": {"overwriteEnv": "yes"}}, "webhook.overwriteEnv", "true or false"),
        ({"annotationPrefix": 5}, "annotationPrefix", "expected a string"),
        ({"nodes": {"n1": {"deviceSplitCount": -1}}}, "nodes.n1.deviceSplitCount", "at least 1"),
        ({"nodes": {"n1": {"nope": 1}}}, "nodes.n1.nope", "unknown key"),
        ({"nodes": {"n1": 3}}, "nodes.n1", "expected a mapping"),
        ("just a string", "config", "expected a mapping"),
    ],
)
def test_invalid_config_names_the_key(raw: object, key: str, message: str) -> None:
    with pytest.raises(errors.ConfigError) as info:
        config.load(raw)
    assert info.value.field == key
    assert message in str(info.value)


def test_to_dict_is_camel_case_plain_data() -> None:
    data = config.to_dict(config.load(yaml.safe_load(EXAMPLE)))
    assert data["scheduler"]["nodePolicy"] == "spread"
    assert data["devicePlugin"]["deviceSplitCount"] == 8
    assert yaml.safe_load(yaml.safe_dump(data)) == data


@pytest.mark.parametrize(
    ("scheduler", "usable_cpus", "from_helper"),
    [
        ({}, 8, True),  # the defaults: apiWriter auto with apiClient asyncio
        ({}, 2, True),
        ({}, 1.9, False),  # a CPU limit under 2: the helper would have no core of its own
        ({}, 0.5, False),
        ({"apiWriter": "auto", "apiClient": "threads"}, 8, False),  # the threads client writes itself
        ({"apiWriter": "inline"}, 8, False),
        ({"apiWriter": "process"}, 8, True),
        ({"apiWriter": "process"}, 0.5, True),  # asked for by name: whatever the CPUs
        ({"apiWriter": "inline", "apiClient": "threads"}, 8, False),
    ],
)
def test_the_writes_helper_is_used_by_default_with_the_asyncio_client_and_two_cpus(
    scheduler: dict[str, str], usable_cpus: float, from_helper: bool
) -> None:
    loaded = config.load({"scheduler": scheduler})
    assert loaded.scheduler.writes_from_helper(usable_cpus=usable_cpus) is from_helper
    with pytest.raises(errors.ConfigError, match="apiWriter: process needs apiClient: asyncio"):
        config.load({"scheduler": {"apiWriter": "process", "apiClient": "threads"}})


@pytest.mark.parametrize(
    ("scheduler", "usable_cpus", "from_helper"),
    [
        ({}, 8, True),  # the default (auto): the helper reads them where it runs
        ({}, 1, False),  # auto writes inline under a CPU limit: no helper, the watches read here
        ({"apiWriter": "process"}, 1, True),  # a helper asked for reads them whatever the CPUs
        ({"apiWriter": "inline"}, 8, False),  # no helper: auto reads them here, no error
        ({"apiClient": "threads"}, 8, False),
        ({"apiWatches": "inline"}, 8, False),
        ({"apiWatches": "process"}, 8, True),
        ({"apiWatches": "process", "apiWriter": "process"}, 1, True),
        ({"apiWatches": "process"}, 1, False),  # auto writes inline under a CPU limit: no helper
    ],
)
def test_the_helper_reads_the_watches_where_it_runs(
    scheduler: dict[str, str], usable_cpus: float, from_helper: bool
) -> None:
    loaded = config.load({"scheduler": scheduler})
    assert loaded.scheduler.watches_from_helper(usable_cpus=usable_cpus) is from_helper
    for bad in (
        {"apiWatches": "process", "apiWriter": "inline"},
        {"apiWatches": "process", "apiClient": "threads"},
    ):
        with pytest.raises(errors.ConfigError, match="apiWatches: process needs the writes' helper"):
            config.load({"scheduler": bad})
    with pytest.raises(errors.ConfigError, match=r"scheduler\.apiWatches"):
        config.load({"scheduler": {"apiWatches": "elsewhere"}})
