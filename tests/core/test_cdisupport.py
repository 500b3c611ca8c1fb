"""Which kubelet versions pass the cdi-cri strategy's CDI device names on (``vgpu.core.cdisupport``)."""

import pytest
from vgpu.core import cdisupport


@pytest.mark.parametrize(
    ("version", "minor"),
    [
        ("v1.28.3", (1, 28)),
        ("v1.27.3-eks-2f008fe", (1, 27)),
        ("v1.29.0+k3s1", (1, 29)),
        ("1.31", (1, 31)),
        ("v1.30.0-localcluster", (1, 30)),
        ("", None),
        ("latest", None),
        ("v1", None),
        ("v1.x.3", None),
    ],
)
def test_parse_minor(version: str, minor: tuple[int, int] | None) -> None:
    assert cdisupport.parse_minor(version) == minor


@pytest.mark.parametrize(
    ("strategy", "version", "level", "words"),
    [
        ("envvar", "v1.20.0", "ok", ""),
        ("cdi-annotations", "v1.20.0", "ok", ""),
        ("cdi-cri", "v1.27.9", "refuse", "this node's kubelet is v1.27.9, which drops cdi_devices"),
        ("cdi-cri", "v1.28.0", "warn", "--feature-gates=DevicePluginCDIDevices=true"),
        ("cdi-cri", "v1.29.2", "ok", ""),
        ("cdi-cri", "v1.36.0", "ok", ""),
        ("cdi-cri", None, "warn", "version is unknown: not checked"),
        ("cdi-cri", "garbage", "warn", "version is garbage: not checked"),
    ],
)
def test_check(strategy: str, version: str | None, level: str, words: str) -> None:
    verdict = cdisupport.check(strategy, version)
    assert verdict.level == level and words in verdict.message


@pytest.mark.parametrize(
    ("doc", "names"),
    [
        (
            {"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu", "devices": [{"name": "0"}, {"name": "GPU-a"}]},
            {"0", "GPU-a"},
        ),
        ({"kind": "other.com/gpu", "devices": [{"name": "0"}]}, set()),
        ({"kind": "nvidia.com/gpu", "devices": "all"}, set()),
        ({"kind": "nvidia.com/gpu", "devices": [{"name": 3}, "x", {"nope": 1}, {"name": "all"}]}, {"all"}),
        (["not", "a", "spec"], set()),
        (None, set()),
    ],
    ids=["spec", "other-kind", "devices-not-a-list", "garbage-entries", "list", "empty-file"],
)
def test_spec_device_names(doc: object, names: set[str]) -> None:
    assert cdisupport.spec_device_names(doc, kind="nvidia.com/gpu") == names


def test_missing_spec_message_names_devices_and_the_fix() -> None:
    text = cdisupport.missing_spec_message(
        "cdi-cri", kind="nvidia.com/gpu", missing=[f"GPU-{i}" for i in range(10)]
    )
    assert "nvidia.com/gpu=GPU-0, " in text and "nvidia.com/gpu=GPU-8" not in text and " ..." in text
    assert "nvidia-ctk cdi generate" in text
