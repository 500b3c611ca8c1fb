"""The configuration and the command lines: bad input is an error naming the key or flag,
with exit code 2 and one line, never a traceback, a silent loss or a value that breaks later."""

from __future__ import annotations

import pathlib

import pytest
import yaml
from vgpu import cli, configfile
from vgpu.core import config, errors
from vgpu.kube.kubeconfig import write_kubeconfig
from vgpu_scheduler import main as scheduler_main


def _load_error(raw: object) -> errors.ConfigError:
    with pytest.raises(errors.ConfigError) as info:
        config.load(raw)
    return info.value


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("devicePlugin: {deviceMemoryScaling: .nan}", "devicePlugin.deviceMemoryScaling"),
        ("devicePlugin: {deviceCoreScaling: .inf}", "devicePlugin.deviceCoreScaling"),
        ("devicePlugin: {leaseRenewS: .nan}", "devicePlugin.leaseRenewS"),
        ("devicePlugin: {kubeletPollS: .nan}", "devicePlugin.kubeletPollS"),
        ("scheduler: {nodeLockTimeoutS: .nan}", "scheduler.nodeLockTimeoutS"),
        ("scheduler: {reservationTtlS: .inf}", "scheduler.reservationTtlS"),
        ("nodes: {n1: {healthRecoveryS: -.inf}}", "nodes.n1.healthRecoveryS"),
        (f"scheduler: {{leaseTimeoutS: {10**400}}}", "scheduler.leaseTimeoutS"),
    ],
    ids=[
        "nan-scaling",
        "inf-scaling",
        "nan-renew",
        "nan-poll",
        "nan-lock",
        "inf-ttl",
        "node-inf",
        "huge-int",
    ],
)
def test_numbers_that_are_not_finite_are_refused(text: str, key: str) -> None:
    """NaN passes every ``<= 0`` check (a NaN memory scaling then crashes the device plugin in
    ``int()``, a NaN sleep returns at once: a busy loop of Lease renewals); an integer beyond a
    float's range raised OverflowError."""
    error = _load_error(yaml.safe_load(text))
    assert error.field == key
    assert "finite number" in str(error)


def test_negative_preconfigured_memory_is_refused() -> None:
    """It is reported as the memory of GPUs NVML cannot size: -5 registered a GPU with -5 MiB."""
    error = _load_error({"devicePlugin": {"preconfiguredDeviceMemoryMib": -5}})
    assert error.field == "devicePlugin.preconfiguredDeviceMemoryMib"
    assert "must not be negative" in str(error)


def test_default_gpu_count_above_the_maximum_is_refused() -> None:
    """The webhook would add 32 GPUs to a container asking only for memory, then deny it for
    asking more than maxGpuCount: every such pod refused with a message about a count never asked."""
    error = _load_error({"webhook": {"defaultGpuCount": 32}})
    assert error.field == "webhook.defaultGpuCount"
    assert "maxGpuCount (16)" in str(error)
    assert (
        config.load({"webhook": {"defaultGpuCount": 32, "maxGpuCount": 32}}).webhook.default_gpu_count == 32
    )


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        ({"devicePlugin": {"leaseRenewS": 40}}, "devicePlugin.leaseRenewS"),
        ({"devicePlugin": {"leaseRenewS": 60}}, "devicePlugin.leaseRenewS"),
        ({"scheduler": {"leaseTimeoutS": 5}}, "devicePlugin.leaseRenewS"),
        ({"nodes": {"slow": {"leaseRenewS": 45}}}, "nodes.slow.leaseRenewS"),
    ],
    ids=["equal", "above", "timeout-lowered", "node-override"],
)
def test_lease_renewal_must_be_below_the_lease_timeout(raw: dict[str, object], key: str) -> None:
    """A Lease renewed no more often than it expires: the scheduler sees the node die between renewals."""
    error = _load_error(raw)
    assert error.field == key
    assert "below scheduler.leaseTimeoutS" in str(error)


def test_lease_timeout_below_a_second_is_refused() -> None:
    """The device plugin writes int(leaseTimeoutS) as leaseDurationSeconds: 0.5 became 0, which the
    API server refuses (it must be above 0), so no Lease and every node dead."""
    error = _load_error({"scheduler": {"leaseTimeoutS": 0.5}, "devicePlugin": {"leaseRenewS": 0.1}})
    assert error.field == "scheduler.leaseTimeoutS"
    assert "at least 1" in str(error)


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("nodes:\n  on: {deviceSplitCount: 2}\n", "nodes.True"),  # a node named "on" read as true
        ("nodes:\n  0123: {deviceSplitCount: 2}\n", "nodes.83"),  # an octal integer
        ("webhook:\n  runtimeClassByType: {null: nvidia}\n", "webhook.runtimeClassByType.None"),
    ],
    ids=["bool", "octal", "null"],
)
def test_mapping_keys_that_yaml_does_not_read_as_strings_are_refused(text: str, key: str) -> None:
    """They were renamed by str(): the override of node "on" went to a node "True", silently."""
    error = _load_error(yaml.safe_load(text))
    assert error.field == key
    assert "quote it" in str(error)


def test_a_key_given_twice_in_the_file_is_refused(tmp_path: pathlib.Path) -> None:
    """PyYAML keeps the last of two ``scheduler:`` sections and drops the first without a word."""
    path = tmp_path / "c.yaml"
    path.write_text("scheduler:\n  nodePolicy: spread\ndevicePlugin: {}\nscheduler:\n  gpuPolicy: binpack\n")
    with pytest.raises(errors.ConfigError) as info:
        configfile.load(path)
    assert info.value.field == "--config"
    assert "duplicate key 'scheduler'" in str(info.value)
    path.write_text("devicePlugin:\n  deviceSplitCount: 4\n  deviceSplitCount: 2\n")
    with pytest.raises(errors.ConfigError, match="duplicate key 'deviceSplitCount'"):
        configfile.load(path)


def test_merge_keys_may_still_override_what_they_merge(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        "devicePlugin: &base {deviceSplitCount: 4, leaseRenewS: 5}\n"
        "nodes:\n  n1:\n    <<: *base\n    deviceSplitCount: 2\n"
    )
    loaded = configfile.load(path)
    assert (loaded.for_node("n1").device_split_count, loaded.for_node("n1").lease_renew_s) == (2, 5.0)


@pytest.fixture
def scheduler_argv(tmp_path: pathlib.Path) -> list[str]:
    """Flags that get past the config and the kubeconfig, up to listening (nothing to connect to)."""
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", server="http://127.0.0.1:9")
    cfg = tmp_path / "c.yaml"
    cfg.write_text("scheduler:\n  apiWriter: inline\n")
    return [
        "--kubeconfig",
        str(kubeconfig),
        "--config",
        str(cfg),
        "--host",
        "127.0.0.1",
        "--extender-port",
        "0",
    ]


@pytest.mark.parametrize("port", ["-1", "70000"])
def test_scheduler_port_out_of_range_is_a_flag_error(
    scheduler_argv: list[str], port: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """It was checked by nobody: bind() raised OverflowError, a traceback and exit code 1."""
    assert scheduler_main.main([*scheduler_argv, "--port", port]) == 2
    err = capsys.readouterr().err
    assert f"--port: not a port: {port}" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("scheduler: spread\n", "scheduler"),
        ("scheduler: [spread]\n", "scheduler"),
        ("bogus: 1\n", "bogus"),
    ],
    ids=["string-section", "list-section", "unknown-key"],
)
def test_demo_refuses_a_bad_config_before_it_starts(
    tmp_path: pathlib.Path, text: str, key: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A section that is not a mapping crashed in dict() with a traceback; an unknown key was found
    only once the local cluster had started, with exit code 1."""
    path = tmp_path / "c.yaml"
    path.write_text(text)
    assert cli.main(["demo", "--config", str(path), "--nodes", "1", "--gpus", "1"]) == 2
    out, err = capsys.readouterr()
    assert err.startswith(f"vgpu demo: {key}")
    assert "starting the local cluster" not in out


@pytest.mark.parametrize("timeout", ["-1", "0", "nan"])
def test_demo_refuses_a_timeout_that_is_not_a_duration(
    timeout: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """-1 waited for nothing, nan forever (no time is past a NaN deadline)."""
    assert cli.main(["demo", "--timeout", timeout, "--nodes", "1", "--gpus", "1"]) == 2
    assert "--timeout" in capsys.readouterr().err


@pytest.mark.parametrize("prefix", ["", "hami.io/", "Hami.io", "hami io", "-hami.io"])
def test_an_annotation_prefix_that_cannot_prefix_a_key_is_refused(prefix: str) -> None:
    """``hami.io/`` made ``hami.io//vgpu-node``: the API server refuses every annotation and label
    write under it, so no node ever registered and no pod was bound, with nothing said at start."""
    error = _load_error({"annotationPrefix": prefix})
    assert error.field == "annotationPrefix"
    assert "DNS subdomain" in str(error)


@pytest.mark.parametrize("prefix", ["hami.io", "gpu.example.com", "vgpu-1.example.com"])
def test_dns_subdomain_prefixes_load(prefix: str) -> None:
    assert config.load({"annotationPrefix": prefix}).annotation_prefix == prefix


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        ({"devicePlugin": {"cdiSpecDir": "var/run/cdi"}}, "devicePlugin.cdiSpecDir"),
        ({"nodes": {"n1": {"cdiSpecDir": ""}}}, "nodes.n1.cdiSpecDir"),
        ({"devicePlugin": {"hookPath": "usr/local"}}, "devicePlugin.hookPath"),
    ],
    ids=["relative", "empty-override", "hook-relative"],
)
def test_host_directories_must_be_absolute(raw: dict[str, object], key: str) -> None:
    """A relative CDI spec directory would be written below the plugin's working directory."""
    error = _load_error(raw)
    assert error.field == key
    assert "must be an absolute path" in str(error)
