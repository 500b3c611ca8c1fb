"""kubectl against the cluster of ``scripts/cluster/cluster.sh``, and a pod watch that timestamps
every change and checks, at each one, that no GPU is overcommitted."""

from __future__ import annotations

import dataclasses
import json
import pathlib
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from vgpu.core import annotations as hami

KEYS = hami.Keys("hami.io")
Obj = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Cluster:
    """Where the cluster is: its directory (kubeconfig, logs, state), the binaries it runs (Kubernetes;
    containerd from ``containerd_bin``, else PATH) and kubelet's root directory."""

    dir: pathlib.Path
    k8s_bin: pathlib.Path
    repo: pathlib.Path
    containerd_bin: pathlib.Path | None = None
    kubelet_root: pathlib.Path = pathlib.Path("/var/lib/kubelet")

    def cdi_enabled(self) -> bool:
        """Whether cluster.sh turned on containerd's CDI support (containerd 1.7 or newer)."""
        config = self.dir / "containerd" / "config.toml"
        return config.exists() and "enable_cdi = true" in config.read_text()

    def kubectl_argv(self) -> list[str]:
        """kubectl with the cluster's kubeconfig; its cache under the cluster's directory."""
        cache = str(self.dir / "kubectl-cache")
        return [
            str(self.k8s_bin / "kubectl"),
            "--kubeconfig",
            str(self.dir / "kubeconfig"),
            "--cache-dir",
            cache,
        ]

    def kubectl(
        self, *args: str, stdin: str | None = None, check: bool = True, timeout_s: float = 120
    ) -> str:
        argv = [*self.kubectl_argv(), *args]
        done = subprocess.run(
            argv, input=stdin, capture_output=True, text=True, timeout=timeout_s, check=False
        )
        if check and done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {done.stderr.strip()}")
        return done.stdout if done.returncode == 0 else done.stderr

    def get(self, *args: str) -> Obj:
        out: Obj = json.loads(self.kubectl("get", *args, "-o", "json"))
        return out

    def apply(self, objects: list[Obj]) -> None:
        self.kubectl(
            "apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects})
        )

    def script(self, name: str, *args: str, timeout_s: float = 900) -> str:
        done = subprocess.run(
            [str(self.repo / "scripts" / "cluster" / name), *args],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
            env={
                "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
                "CLUSTER_DIR": str(self.dir),
                "HOME": str(self.dir),  # kubectl's cache goes there, and with it at the end
                "K8S_BIN": str(self.k8s_bin),
                "CONTAINERD_BIN": str(self.containerd_bin or ""),
                "KUBELET_ROOT_DIR": str(self.kubelet_root),
                "PYTHON": sys.executable,
            },
        )
        if done.returncode != 0:
            raise AssertionError(f"{name} {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
        return done.stderr


def wait_until(what: str, done: Callable[[], bool], *, timeout_s: float = 180, every_s: float = 0.5) -> None:
    """Poll ``done`` until it holds; fail naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(every_s)


def phase(pod: Obj | None) -> str | None:
    return None if pod is None else pod.get("status", {}).get("phase")


def gpu_use(pods: list[Obj]) -> dict[str, list[tuple[str, int, int]]]:
    """Per GPU UUID, (pod, memory MiB, cores) of every container the scheduler gave it, over the
    pods not yet finished."""
    use: dict[str, list[tuple[str, int, int]]] = {}
    for pod in pods:
        if phase(pod) in ("Succeeded", "Failed") or pod["metadata"].get("deletionTimestamp"):
            continue
        raw = (pod["metadata"].get("annotations") or {}).get(KEYS.devices_allocated)
        if not raw:
            continue
        for container in hami.decode_pod_devices(raw, field="allocated"):
            for device in container:
                use.setdefault(device.uuid, []).append(
                    (pod["metadata"]["name"], device.memory_mib, device.cores)
                )
    return use


def overcommitted(pods: list[Obj], *, memory_mib: int, split: int) -> list[str]:
    """What is wrong with the GPUs' sharing: memory or cores over the card, more containers than
    slots, or a container with the whole card's cores sharing it."""
    wrong = []
    for uuid, users in gpu_use(pods).items():
        if sum(m for _, m, _ in users) > memory_mib:
            wrong.append(f"{uuid}: memory {users}")
        if sum(c for _, _, c in users) > 100:
            wrong.append(f"{uuid}: cores {users}")
        if len(users) > split:
            wrong.append(f"{uuid}: {len(users)} containers")
        if len(users) > 1 and any(c == 100 for _, _, c in users):
            wrong.append(f"{uuid}: exclusive use shared {users}")
    return wrong


class KubectlWatch:
    """``kubectl get <kind> -n <namespace> -w -o json --output-watch-events`` in a thread, each
    event (the event, the monotonic time it was read) to ``_on_event``; ``close`` stops it."""

    def __init__(self, cluster: Cluster, kind: str, *, namespace: str) -> None:
        argv = cluster.kubectl_argv()
        argv += ["get", kind, "-n", namespace, "-w", "-o", "json", "--output-watch-events"]
        self._proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self._thread = threading.Thread(target=self._read, daemon=True)

    def _start(self) -> None:
        """Called by the subclass once its own state is set: events may arrive at once."""
        self._thread.start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        decoder = json.JSONDecoder()
        buf = ""
        for line in self._proc.stdout:
            buf += line
            while buf.strip():
                try:
                    event, end = decoder.raw_decode(buf.lstrip())
                except json.JSONDecodeError:
                    break
                buf = buf.lstrip()[end:]
                self._on_event(event, time.monotonic())

    def _on_event(self, event: Obj, now: float) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self._proc.terminate()
        self._proc.wait(10)
        self._thread.join(10)
        if self._proc.stdout is not None:
            self._proc.stdout.close()


class PodWatch(KubectlWatch):
    """``kubectl get pods -w`` in a thread: the latest object of every pod, when each was first
    seen and first seen Running, and every overcommit seen at any change."""

    def __init__(self, cluster: Cluster, *, namespace: str, memory_mib: int, split: int) -> None:
        super().__init__(cluster, "pods", namespace=namespace)
        self._memory_mib = memory_mib
        self._split = split
        self._lock = threading.Condition()
        self.pods: dict[str, Obj] = {}
        self.first_seen: dict[str, float] = {}
        self.running_at: dict[str, float] = {}
        self.violations: list[str] = []
        self._start()

    def _on_event(self, event: Obj, now: float) -> None:
        pod = event["object"]
        name = pod["metadata"]["name"]
        with self._lock:
            if event["type"] == "DELETED":
                self.pods.pop(name, None)
            else:
                self.pods[name] = pod
                self.first_seen.setdefault(name, now)
                if phase(pod) == "Running":
                    self.running_at.setdefault(name, now)
            wrong = overcommitted(list(self.pods.values()), memory_mib=self._memory_mib, split=self._split)
            self.violations += wrong
            self._lock.notify_all()

    def wait(self, what: str, done: Callable[[dict[str, Obj]], bool], *, timeout_s: float = 240) -> None:
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while not done(self.pods):
                left = deadline - time.monotonic()
                if left <= 0:
                    summary = {n: phase(p) for n, p in self.pods.items()}
                    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}: {summary}")
                self._lock.wait(min(left, 1.0))

    def snapshot(self) -> dict[str, Obj]:
        with self._lock:
            return dict(self.pods)


class ClaimWatch(KubectlWatch):
    """``kubectl get resourceclaims -w`` in a thread, every change fed to a
    ``bench.throughput_dra.ClaimTracker``: when each pod's claim appeared and was allocated, and
    every moment a GPU's consumed memory or cores went over its capacity."""

    def __init__(self, cluster: Cluster, *, namespace: str, tracker: Any) -> None:
        super().__init__(cluster, "resourceclaims", namespace=namespace)
        self.tracker = tracker
        self.lock = threading.Lock()
        self._start()

    def _on_event(self, event: Obj, now: float) -> None:
        with self.lock:
            self.tracker.on_event(event["type"], event["object"], now)
