"""The webhook on a 40,000-container pod (issue 17: the quadratic JSON-patch builder).

Times the real handler path minus the socket (``parse_review``, ``Webhook.review``, the JSON
encoding of the answer) on an AdmissionReview of ``--containers`` one-GPU containers (40,000 is
about 2.4 MiB, under the API server's 3 MiB request limit):

  * with the default ``webhook.maxContainers`` (1,000): the pod is denied at once;
  * with the limit raised above the count: the whole mutation runs (one patch operation per
    container), which shows the patch building is linear.

    .venv/bin/python -m bench.wide_pod_bench [--containers 40000]
"""

from __future__ import annotations

import argparse
import json
import time

from vgpu.core import config
from vgpu_scheduler import webhook


class _View:
    def namespace_labels(self, ns: str) -> dict[str, str]:
        return {}

    def namespace_gpu_usage(self, ns: str) -> tuple[int, int]:
        return (0, 0)

    def quota_limits(self, ns: str) -> tuple[None, None]:
        return (None, None)

    def largest_gpu_memory_mib(self) -> int:
        return 0


def review_body(containers: int) -> bytes:
    pod = {
        "metadata": {"name": "wide"},
        "spec": {
            "containers": [
                {"name": f"c{i}", "resources": {"limits": {"nvidia.com/gpu": "1"}}} for i in range(containers)
            ]
        },
    }
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "operation": "CREATE",
            "namespace": "default",
            "object": pod,
        },
    }
    return json.dumps(review, separators=(",", ":")).encode()


def answer(hook: webhook.Webhook, body: bytes) -> tuple[float, float, dict[str, object]]:
    start, cpu = time.perf_counter(), time.process_time()
    api_version, req = webhook.parse_review(body)
    out = hook.review(api_version, req)
    json.dumps(out)
    return time.perf_counter() - start, time.process_time() - cpu, out["response"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--containers", type=int, default=40_000)
    opts = parser.parse_args()
    body = review_body(opts.containers)
    print(f"{opts.containers} containers, review {len(body) / 2**20:.2f} MiB")
    for label, limit in (("default limit (denied)", 1000), ("limit raised (mutated)", opts.containers)):
        hook = webhook.Webhook(config.load({"webhook": {"maxContainers": limit}}), _View())
        wall, cpu, response = answer(hook, body)
        outcome = "allowed" if response["allowed"] else f"denied: {response['status']['message']}"  # type: ignore[index]
        print(f"  {label:24s} {wall * 1000:8.1f} ms wall, {cpu * 1000:8.1f} ms CPU; {outcome[:90]}")


if __name__ == "__main__":
    main()
