"""Run every benchmark in turn and print their figures (``make bench`` / ``tox -e bench``).

    .venv/bin/python -m bench.run_all [--quick]

Each benchmark is its own module and process (``python -m bench.<name>``), so one's memory (RSS)
is not charged to another. ``--quick`` runs smaller sizes for a smoke check; the figures recorded
in docs/benchmarks.md come from the full runs.
"""

import argparse
import subprocess
import sys

FULL: dict[str, list[str]] = {
    "filter_bench": [],
    "webhook_bench": [],
    "allocate_bench": [],
    "throughput_bench": [],
    "event_storm_bench": [],
    "wide_pod_bench": [],
    "preempt_bench": [],
    "dashboard_bench": [],
    "idle_streams_bench": [],
    "handshake_flood_bench": ["--rounds", "24"],
    "reregister_bench": ["--rounds", "50"],
    "metrics_bench": [],
    "gc_bench": [],
    "http_floor_bench": ["--clients", "aiohttp", "offloaded"],
    "retries_bench": [],
    "churn_bench": ["--repeat", "2"],
}
QUICK: dict[str, list[str]] = {
    "filter_bench": ["--nodes", "100", "--filters", "50", "--binds", "50"],
    "webhook_bench": ["--seconds", "1"],
    "allocate_bench": ["--iterations", "100", "--warmup", "10"],
    "throughput_bench": ["--quick"],
    "event_storm_bench": ["--nodes", "20", "--filters", "50", "--failed", "300"],
    "wide_pod_bench": ["--containers", "5000"],
    "preempt_bench": ["--nodes", "100", "--candidates", "50", "--requests", "20"],
    "dashboard_bench": ["--nodes", "100", "--repeat", "2"],
    "idle_streams_bench": ["--max-stream-s", "1", "--give-up-s", "10"],
    "handshake_flood_bench": ["--rounds", "2", "--nodes", "20", "--baseline-s", "1"],
    "reregister_bench": ["--rounds", "5"],
    "metrics_bench": ["--nodes", "100", "--scrapes", "5"],
    "gc_bench": ["--nodes", "100"],
    "http_floor_bench": ["--requests", "300", "--clients", "aiohttp", "offloaded"],
    "retries_bench": ["--nodes", "100", "--pending", "500", "--releases", "200"],
    "churn_bench": ["--nodes", "2", "--gpus", "1", "--rounds", "2"],
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke check")
    opts = parser.parse_args()
    failed = []
    for name, args in (QUICK if opts.quick else FULL).items():
        print(f"== bench.{name} {' '.join(args)}", flush=True)
        if subprocess.run([sys.executable, "-m", f"bench.{name}", *args], check=False).returncode != 0:
            failed.append(name)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
