"""Reading the shared YAML config file: the I/O half of ``vgpu.core.config`` (which stays pure).

Every program (``vgpu-scheduler``, ``vgpu-device-plugin``, ``vgpu status``, ``vgpu demo``) reads the
same file the same way, and a file that cannot be used is a ``ConfigError`` naming the flag.
"""

import pathlib
from typing import Any

import yaml

from vgpu.core import config as core_config
from vgpu.core import errors


def read_yaml(path: str | pathlib.Path, *, field: str = "--config") -> Any:
    """The parsed YAML document at ``path``; ConfigError(field) when it cannot be read or parsed."""
    try:
        text = pathlib.Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise errors.ConfigError(field, f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise errors.ConfigError(field, f"{path} is not UTF-8 text ({exc.reason})") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise errors.ConfigError(field, f"{path} is not valid YAML: {exc}") from None


def load(path: str | pathlib.Path | None, *, field: str = "--config") -> core_config.Config:
    """The validated Config from ``path``; the defaults when ``path`` is None."""
    return core_config.load(None if path is None else read_yaml(path, field=field))
