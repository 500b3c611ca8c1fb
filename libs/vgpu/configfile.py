"""Reading the shared YAML config file: the I/O half of ``vgpu.core.config`` (which stays pure).

Every program (``vgpu-scheduler``, ``vgpu-device-plugin``, ``vgpu status``, ``vgpu demo``) reads the
same file the same way, and a file that cannot be used is a ``ConfigError`` naming the flag.
"""

import pathlib
from typing import Any

import yaml

from vgpu.core import config as core_config
from vgpu.core import errors


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (PyYAML keeps the last silently, so
    a second ``scheduler:`` section would drop the first), as the API server's YAML decoding does."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base`: its keys may be overridden
                continue
            key = self.construct_object(key_node, deep=deep)
            try:
                duplicate = key in seen
                seen.add(key)
            except TypeError:  # an unhashable key: SafeLoader's own error says so
                break
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
        return super().construct_mapping(node, deep=deep)


def read_yaml(path: str | pathlib.Path, *, field: str = "--config") -> Any:
    """The parsed YAML document at ``path``; ConfigError(field) when it cannot be read or parsed."""
    try:
        text = pathlib.Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise errors.ConfigError(field, f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise errors.ConfigError(field, f"{path} is not UTF-8 text ({exc.reason})") from None
    try:
        return yaml.load(text, Loader=_StrictLoader)  # a SafeLoader
    except yaml.YAMLError as exc:
        raise errors.ConfigError(field, f"{path} is not valid YAML: {exc}") from None


def load(path: str | pathlib.Path | None, *, field: str = "--config") -> core_config.Config:
    """The validated Config from ``path``; the defaults when ``path`` is None."""
    return core_config.load(None if path is None else read_yaml(path, field=field))
