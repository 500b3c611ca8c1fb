"""The Dockerfile, checked statically (no Docker daemon here): multi-stage on python:3.11-slim, a
non-root runtime user that matches the chart, an exec-form entrypoint naming our console script,
build inputs that exist and are not excluded by .dockerignore, and no sources in the runtime."""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
import tomllib
from dataclasses import dataclass, field

import pytest

from tests.deploy import rendering

REPO = rendering.REPO


@dataclass
class Stage:
    base: str
    name: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [args for kw, args in self.instructions if kw == keyword]


def parse(text: str) -> tuple[dict[str, str], list[Stage]]:
    """Global ARG defaults and the stages, each a list of (KEYWORD, arguments); continuations joined."""
    logical: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    assert not pending, "Dockerfile ends inside a continued line"
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in logical:
        keyword, _, rest = line.partition(" ")
        keyword = keyword.upper()
        rest = rest.strip()
        if keyword == "FROM":
            m = re.fullmatch(r"(\S+)(?:\s+AS\s+(\S+))?", rest, re.IGNORECASE)
            assert m, f"bad FROM: {line}"
            base = re.sub(r"\$\{?(\w+)\}?", lambda v: args.get(v.group(1), v.group(0)), m.group(1))
            stages.append(Stage(base=base, name=m.group(2) or str(len(stages))))
        elif not stages:
            assert keyword == "ARG", f"only ARG may precede the first FROM, got {keyword}"
            name, _, default = rest.partition("=")
            args[name] = default
        else:
            stages[-1].instructions.append((keyword, rest))
    return args, stages


def _dockerignored(path: str, patterns: list[str]) -> bool:
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pat = pattern.lstrip("!").rstrip("/")
        hit = any(
            fnmatch.fnmatch(candidate, pat) or fnmatch.fnmatch(candidate, pat.removeprefix("**/"))
            for candidate in _prefixes(path)
        )
        if hit:
            ignored = not negate
    return ignored


def _prefixes(path: str) -> list[str]:
    parts = path.split("/")
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]


@pytest.fixture(scope="module")
def dockerfile() -> tuple[dict[str, str], list[Stage]]:
    return parse((REPO / "Dockerfile").read_text())


@pytest.fixture(scope="module")
def ignore_patterns() -> list[str]:
    lines = (REPO / ".dockerignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def test_multi_stage_on_python_311_slim(dockerfile):
    _, stages = dockerfile
    assert len(stages) >= 2
    for stage in stages:
        assert re.fullmatch(r"python:3\.11-slim(-\w+)?", stage.base), stage.base


def test_runtime_runs_as_the_non_root_user_the_chart_expects(dockerfile):
    _, stages = dockerfile
    runtime = stages[-1]
    (user,) = runtime.all("USER")
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and int(uid) != 0, "USER must be a numeric non-root uid (runAsNonRoot checks it)"
    pod = rendering.render().one("Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsUser"] == int(uid)
    assert pod["securityContext"]["runAsGroup"] == int(gid)
    assert any(f"--uid {uid}" in run for run in runtime.all("RUN")), "the user is created in the image"
    # the device plugin is the one program that needs root, and the chart says so explicitly
    plugin = rendering.render().container("DaemonSet", "device-plugin")
    assert plugin["securityContext"]["runAsUser"] == 0
    assert plugin["securityContext"]["privileged"] is False
    assert plugin["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_entrypoint_is_exec_form_and_every_chart_command_is_a_console_script(dockerfile):
    _, stages = dockerfile
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    (entrypoint,) = stages[-1].all("ENTRYPOINT")
    argv = json.loads(entrypoint)  # exec form: signals reach the program, not a shell
    assert argv[0] in scripts
    (env,) = [e for e in stages[-1].all("ENV") if "PATH=" in e]
    venv_bin = re.search(r"PATH=(\S+?):\$PATH", env)
    assert venv_bin, env
    rendered = rendering.render()
    commands = [
        c["command"][0]
        for kind in ("Deployment", "DaemonSet")
        for c in rendered.one(kind)["spec"]["template"]["spec"]["containers"]
        if c["image"] == rendered.container("DaemonSet", "device-plugin")["image"]
    ]
    assert sorted(commands) == ["vgpu-device-plugin", "vgpu-monitor", "vgpu-scheduler"]
    assert set(commands) <= set(scripts)
    build = stages[0]
    for command in commands:  # the build smoke-runs every program from the venv on PATH
        assert any(f"{venv_bin.group(1)}/{command} --help" in run for run in build.all("RUN"))


def test_build_inputs_exist_and_are_not_dockerignored(dockerfile, ignore_patterns):
    _, stages = dockerfile
    sources: list[str] = []
    for stage in stages:
        for copy in stage.all("COPY"):
            words = shlex.split(copy)
            if any(w.startswith("--from=") for w in words):
                continue
            sources.extend(w.rstrip("/") for w in words[:-1] if not w.startswith("--"))
    assert sources
    for src in sources:
        assert (REPO / src).exists(), f"COPY {src}: no such path"
        assert not _dockerignored(src, ignore_patterns), f"COPY {src} is excluded by .dockerignore"
    for must_not_ship in (".venv", ".git", "tests", "libs/vgpu/__pycache__", "kube_vgpu.egg-info"):
        assert _dockerignored(must_not_ship, ignore_patterns), must_not_ship


def test_runtime_stage_holds_only_the_venv(dockerfile):
    _, stages = dockerfile
    build, runtime = stages[0], stages[-1]
    copies = [shlex.split(c) for c in runtime.all("COPY")]
    assert copies == [[f"--from={build.name}", "/opt/kube-vgpu", "/opt/kube-vgpu"]]
    assert not any("pip install" in run for run in runtime.all("RUN"))


def test_parser_handles_continuations_and_args():
    args, stages = parse(
        "# c\nARG BASE=python:3.11-slim\nFROM ${BASE} AS b\nRUN a \\\n  # comment inside\n  && b\nFROM $BASE\nUSER 1\n"
    )
    assert args == {"BASE": "python:3.11-slim"}
    assert [(s.base, s.name) for s in stages] == [("python:3.11-slim", "b"), ("python:3.11-slim", "1")]
    assert stages[0].instructions == [("RUN", "a  && b")]
