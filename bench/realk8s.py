"""A real Kubernetes control plane for the throughput bench: etcd, kube-apiserver and kube-scheduler.

``scripts/build-kubernetes.sh`` builds kube-apiserver and kube-scheduler from Debian 12's
``kubernetes`` source package (v1.20.2, the newest server source a Debian registry carries:
trixie's 1.32 and sid's 1.36 packages hold kubectl's sources only) and
installs Debian's etcd; ``throughput_bench --k8s-bin DIR`` then runs its phases against them
instead of the emulation. Nothing in the services changes: they get a kubeconfig (HTTPS, a bearer
token) as they would in a cluster.

The API server serves HTTPS on loopback with a certificate from ``certs.make_serving_certs``
(so clients verify it against that CA), authenticates one static token (``system:masters``) and
authorizes everything; the ``ServiceAccount`` admission plugin is off (no controller-manager
creates the ``default`` service accounts). etcd keeps its data under the work directory, on disk:
its commit latency is the real one, not a configured delay.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import os
import pathlib
import re
import secrets
import shutil
import signal
import socket
import ssl
import time
from collections.abc import AsyncIterator, Sequence

import aiohttp
from prometheus_client.parser import text_string_to_metric_families
from vgpu.localcluster import certs

READY_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 20.0


@dataclasses.dataclass(frozen=True)
class ControlPlane:
    """Where the API server is and how to reach it; ``pids`` are its processes (CPU accounting)."""

    url: str
    token: str
    ca_file: pathlib.Path
    pids: dict[str, int]


def request_counts(metrics_text: str) -> dict[str, float]:
    """kube-apiserver's ``apiserver_request_total`` summed by ``VERB resource[/subresource]`` (every
    client and answer code together; WATCH counts the watches opened), from its /metrics text;
    empty when the text does not parse (the phase then shows no counts rather than wrong ones)."""
    out: dict[str, float] = {}
    try:
        families = list(text_string_to_metric_families(metrics_text))
    except ValueError:
        return {}
    for family in families:
        if family.name != "apiserver_request":  # the parser drops the counter's _total
            continue
        for sample in family.samples:
            if not sample.name.endswith("_total") or not sample.labels.get("resource"):
                continue
            labels = sample.labels
            what = labels["resource"] + (f"/{labels['subresource']}" if labels.get("subresource") else "")
            key = f"{labels.get('verb', '?')} {what}"
            out[key] = out.get(key, 0.0) + sample.value
    return out


# kube-scheduler's histograms of its own serial path: the scheduling algorithm (the filters, the
# extenders' /filter calls among them, and the scores), and the whole attempt (v1.20's e2e one
# ends after the bind; later versions time the attempt without it)
CYCLE_HISTOGRAMS = (
    "scheduler_scheduling_algorithm_duration_seconds",
    "scheduler_scheduling_attempt_duration_seconds",
    "scheduler_e2e_scheduling_duration_seconds",
)
# the framework's extension points inside the algorithm, each its own entry (``scheduler_Filter_
# duration_seconds``...): a GPU pod's algorithm less its PreFilter and Filter is the extenders'
# /filter call as kube-scheduler waits for it (one node back: no scores)
EXTENSION_POINTS_HISTOGRAM = "scheduler_framework_extension_point_duration_seconds"
CYCLE_EXTENSION_POINTS = ("PreFilter", "Filter", "PreScore", "Score")
# after the cycle, in the binding goroutine: PreBind (DRA's claim status write is there)
BINDING_EXTENSION_POINTS = ("PreBind",)
# one plugin's own time per extension point (kube-scheduler samples a share of its cycles): the
# DRA plugin's, ``scheduler_DynamicResources.<point>_duration_seconds``
PLUGIN_HISTOGRAM = "scheduler_plugin_execution_duration_seconds"
TIMED_PLUGINS = ("DynamicResources",)


def histogram_sums(
    metrics_text: str, names: Sequence[str] = CYCLE_HISTOGRAMS
) -> dict[str, tuple[float, float]]:
    """(sum of seconds, count) of each histogram in ``names`` that the text has, every label set
    together; empty when the text does not parse."""
    out: dict[str, tuple[float, float]] = {}
    try:
        families = list(text_string_to_metric_families(metrics_text))
    except ValueError:
        return {}
    for family in families:
        if family.name == PLUGIN_HISTOGRAM and family.type == "histogram":
            for plugin in TIMED_PLUGINS:
                mine = [x for x in family.samples if x.labels.get("plugin") == plugin]
                for point in sorted({x.labels.get("extension_point", "") for x in mine}):
                    samples = [x for x in mine if x.labels.get("extension_point") == point]
                    count = sum(x.value for x in samples if x.name == f"{family.name}_count")
                    if count:
                        total = sum(x.value for x in samples if x.name == f"{family.name}_sum")
                        out[f"scheduler_{plugin}.{point}_duration_seconds"] = (total, count)
            continue
        if family.name == EXTENSION_POINTS_HISTOGRAM and family.type == "histogram":
            for point in CYCLE_EXTENSION_POINTS + BINDING_EXTENSION_POINTS:
                samples = [x for x in family.samples if x.labels.get("extension_point") == point]
                count = sum(x.value for x in samples if x.name == f"{family.name}_count")
                if count:
                    total = sum(x.value for x in samples if x.name == f"{family.name}_sum")
                    out[f"scheduler_{point}_duration_seconds"] = (total, count)
            continue
        if family.name not in names or family.type != "histogram":
            continue
        total = sum(x.value for x in family.samples if x.name == f"{family.name}_sum")
        count = sum(x.value for x in family.samples if x.name == f"{family.name}_count")
        out[family.name] = (total, count)
    return out


async def scrape(plane: ControlPlane) -> str:
    """The API server's /metrics text ("" when it cannot be read)."""
    trust = ssl.create_default_context(cafile=str(plane.ca_file))
    return await metrics_text(plane.url, plane.token, trust)


async def metrics_text(url: str, token: str, trust: ssl.SSLContext | bool) -> str:
    """``url``/metrics read with ``token`` ("" when it cannot be read)."""
    try:
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"{url}/metrics", ssl=trust, headers={"Authorization": f"Bearer {token}"}) as resp,
        ):
            return await resp.text() if resp.status == 200 else ""
    except (aiohttp.ClientError, OSError):
        return ""


def free_port() -> int:
    """A loopback port free now (the OS's pick; another process could take it before we bind)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def binary(bin_dir: pathlib.Path, name: str) -> str:
    """``bin_dir/name``, else ``name`` on PATH (Debian's etcd is /usr/bin/etcd); FileNotFoundError if neither."""
    local = bin_dir / name
    if local.is_file() and os.access(local, os.X_OK):
        return str(local)
    found = shutil.which(name)
    if found is None:
        raise FileNotFoundError(
            f"{name}: not in {bin_dir} nor on PATH (scripts/build-kubernetes.sh builds it)"
        )
    return found


def minor_version(version_output: str) -> int | None:
    """The minor version from ``kube-scheduler --version`` (``Kubernetes v1.20.2`` -> 20), or None."""
    match = re.search(r"\bv1\.(\d+)\.", version_output)
    return int(match.group(1)) if match else None


def scheduler_config_api(minor: int | None) -> str:
    """The newest ``KubeSchedulerConfiguration`` API a kube-scheduler of this minor version reads
    (v1beta1 from 1.19, v1beta2 from 1.22, v1beta3 from 1.23, v1 from 1.25)."""
    if minor is None or minor >= 25:
        return "kubescheduler.config.k8s.io/v1"
    if minor >= 23:
        return "kubescheduler.config.k8s.io/v1beta3"
    if minor >= 22:
        return "kubescheduler.config.k8s.io/v1beta2"
    return "kubescheduler.config.k8s.io/v1beta1"


def no_insecure_serving(api_version: str) -> dict[str, str]:
    """The config fields that turn off kube-scheduler's plain-HTTP healthz and metrics port (10251
    by default up to v1beta2, where they were removed): two benches at once would clash on it, and
    ``--port 0`` is ignored when a config file is given."""
    if api_version.endswith(("v1beta1", "v1beta2")):
        return {"healthzBindAddress": "", "metricsBindAddress": ""}
    return {}


async def kube_scheduler_minor(bin_dir: pathlib.Path) -> int | None:
    """The minor version ``kube-scheduler --version`` prints (a child process, off the loop)."""
    proc = await asyncio.create_subprocess_exec(
        binary(bin_dir, "kube-scheduler"),
        "--version",
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 30)
    return minor_version(out.decode(errors="replace"))


async def start_process(argv: Sequence[str], log_path: pathlib.Path) -> asyncio.subprocess.Process:
    """``argv`` started with its output appended to ``log_path`` (stop it with ``stop_process``)."""
    with log_path.open("ab") as out:
        return await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=asyncio.subprocess.STDOUT
        )


async def stop_process(proc: asyncio.subprocess.Process) -> None:
    """SIGTERM, then SIGKILL after ``STOP_TIMEOUT_S``; nothing when it has exited already."""
    if proc.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        await asyncio.wait_for(proc.wait(), STOP_TIMEOUT_S)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()


async def _wait_ok(
    url: str,
    proc: asyncio.subprocess.Process,
    *,
    what: str,
    ssl_context: ssl.SSLContext | bool,
    token: str = "",
    expect: str = "ok",
) -> None:
    """Poll ``url`` until it answers 200 with ``expect`` in its body; RuntimeError if ``proc``
    exits or time runs out."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    deadline = time.monotonic() + READY_TIMEOUT_S
    async with aiohttp.ClientSession() as session:
        while True:
            if proc.returncode is not None:
                raise RuntimeError(f"{what} exited with code {proc.returncode} before it was ready")
            with contextlib.suppress(aiohttp.ClientError, OSError):
                async with session.get(url, ssl=ssl_context, headers=headers) as resp:
                    if resp.status == 200 and expect in await resp.text():
                        return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} not ready after {READY_TIMEOUT_S:.0f} s")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), 0.25)  # nothing to wait on but time (or its exit)


@contextlib.asynccontextmanager
async def control_plane(
    bin_dir: pathlib.Path, workdir: pathlib.Path, *, now: datetime.datetime
) -> AsyncIterator[ControlPlane]:
    """etcd and kube-apiserver under ``workdir``; stopped (API server first) on the way out."""
    logs = workdir / "logs"
    logs.mkdir(exist_ok=True)
    tls = certs.make_serving_certs(workdir / "apiserver-certs", now=now)
    token = secrets.token_hex(16)
    tokens = workdir / "tokens.csv"
    tokens.write_text(f"{token},admin,admin,system:masters\n")
    client_port, peer_port, api_port = free_port(), free_port(), free_port()
    etcd_url = f"http://127.0.0.1:{client_port}"
    etcd = await start_process(
        [
            binary(bin_dir, "etcd"),
            "--data-dir", str(workdir / "etcd"),
            "--listen-client-urls", etcd_url, "--advertise-client-urls", etcd_url,
            "--listen-peer-urls", f"http://127.0.0.1:{peer_port}",
        ],
        logs / "etcd.log",
    )  # fmt: skip
    apiserver: asyncio.subprocess.Process | None = None
    try:
        await _wait_ok(f"{etcd_url}/health", etcd, what="etcd", ssl_context=False, expect='"true"')
        apiserver = await start_process(
            [
                binary(bin_dir, "kube-apiserver"),
                "--etcd-servers", etcd_url,
                "--bind-address", "127.0.0.1", "--secure-port", str(api_port),
                "--tls-cert-file", str(tls.cert_file), "--tls-private-key-file", str(tls.key_file),
                "--token-auth-file", str(tokens),
                "--authorization-mode", "AlwaysAllow",
                "--service-account-issuer", "https://kubernetes.default.svc",
                "--service-account-key-file", str(tls.cert_file),
                "--service-account-signing-key-file", str(tls.key_file),
                "--disable-admission-plugins", "ServiceAccount",
                "--service-cluster-ip-range", "10.96.0.0/16",
            ],
            logs / "kube-apiserver.log",
        )  # fmt: skip
        url = f"https://127.0.0.1:{api_port}"
        trust = ssl.create_default_context(cafile=str(tls.ca_file))
        await _wait_ok(f"{url}/readyz", apiserver, what="kube-apiserver", ssl_context=trust, token=token)
        yield ControlPlane(
            url=url, token=token, ca_file=tls.ca_file, pids={"etcd": etcd.pid, "apiserver": apiserver.pid}
        )
    finally:
        if apiserver is not None:
            await stop_process(apiserver)
        await stop_process(etcd)


@dataclasses.dataclass(frozen=True)
class KubeScheduler:
    proc: asyncio.subprocess.Process
    url: str  # its secure port (a self-signed certificate; it asks the API server who a token is)

    async def metrics(self, token: str) -> str:
        """Its /metrics text ("" when it cannot be read)."""
        return await metrics_text(self.url, token, False)


@contextlib.asynccontextmanager
async def kube_scheduler(
    bin_dir: pathlib.Path,
    *,
    config: pathlib.Path,
    kubeconfig_path: pathlib.Path,
    log_path: pathlib.Path,
    feature_gates: str = "",
) -> AsyncIterator[KubeScheduler]:
    """The real kube-scheduler with ``config`` (its clientConnection names ``kubeconfig_path``) and
    ``feature_gates`` (``--feature-gates``, ``A=false,B=true``) where given."""
    port = free_port()
    proc = await start_process(
        [
            binary(bin_dir, "kube-scheduler"),
            "--config", str(config),
            "--authentication-kubeconfig", str(kubeconfig_path),
            "--authorization-kubeconfig", str(kubeconfig_path),
            "--bind-address", "127.0.0.1", "--secure-port", str(port),
            "-v", "1",
            *(["--feature-gates", feature_gates] if feature_gates else []),
        ],
        log_path,
    )  # fmt: skip
    try:
        await _wait_ok(f"https://127.0.0.1:{port}/healthz", proc, what="kube-scheduler", ssl_context=False)
        yield KubeScheduler(proc, f"https://127.0.0.1:{port}")
    finally:
        await stop_process(proc)
