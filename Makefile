# The two set-up commands (see README): `make demo` and `make test`. Each bootstraps .venv.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint types unit test-gpu test-realk8s cluster cluster-down cluster-install test-cluster proto bench clean

# setuptools warns on every editable install of a multi-root layout (libs/, services/) that a folder
# named like a package could shadow it; ours cannot, so the first `make demo` stays quiet.
# --no-compile: pip would byte-compile every module of every dependency (the kubernetes client alone
# has hundreds), about 20 s of CPU; Python compiles what is imported, once, on first use.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	PYTHONWARNINGS='ignore:Editable installation' $(BIN)/python -m pip install --quiet --no-compile -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/vgpu demo $(ARGS)

# lint (seconds), then mypy in the background while pytest runs the suite in PYTEST_WORKERS processes;
# prints how long it took (scripts/make_test.sh)
test: $(STAMP)
	@PYTEST_WORKERS=$(PYTEST_WORKERS) scripts/make_test.sh $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/python scripts/gen_proto.py --check
	$(BIN)/ruff check .
	$(BIN)/ruff format --check libs services tests scripts bench
	$(BIN)/lint-imports

types: $(STAMP)
	$(BIN)/mypy libs services bench

# The tests are independent (ports 0, tmp_path, their own child processes) and most of their time is
# spent waiting on sockets and child processes, so twice as many workers as cores pay off.
PYTEST_WORKERS ?= 4
unit: $(STAMP)
	$(BIN)/pytest -q -n $(PYTEST_WORKERS) --dist worksteal $(PYTEST_ARGS)

# on a machine with an NVIDIA driver: the NVML backend and the plugin binary on the real GPUs
test-gpu: $(STAMP)
	$(BIN)/pytest -m gpu tests/gpu -v -s -rs

# a real etcd, kube-apiserver and kube-scheduler (v1.20.2), built from Debian's source package
# (needs root for apt; about 5 minutes the first time): docs/benchmarks.md
K8S_BIN ?= .k8s/bin
$(K8S_BIN)/kube-scheduler:
	scripts/build-kubernetes.sh $(K8S_BIN)

test-realk8s: $(STAMP) $(K8S_BIN)/kube-scheduler
	VGPU_K8S_BIN=$(abspath $(K8S_BIN)) $(BIN)/pytest -m realk8s tests/realk8s -v -rs

# a real single-node cluster on this host (root; docs/install.md, "Try it on a real single-node
# cluster"): CLUSTER_K8S_BIN is a directory of Kubernetes v1.36 binaries (kube-apiserver,
# kube-controller-manager, kube-scheduler, kubelet, kubectl: the official release's, say)
CLUSTER_K8S_BIN ?= $(K8S_BIN)
# CLUSTER_CONTAINERD_BIN: another containerd's directory, e.g. the CDI-capable 1.7 that
# scripts/cluster/containerd-cdi.sh unpacks (/opt/containerd-1.7/usr/bin; the DRA mode needs it)
CLUSTER_CONTAINERD_BIN ?=
cluster: $(STAMP)
	CONTAINERD_BIN=$(CLUSTER_CONTAINERD_BIN) K8S_BIN=$(abspath $(CLUSTER_K8S_BIN)) scripts/cluster/cluster.sh up
	K8S_BIN=$(abspath $(CLUSTER_K8S_BIN)) PYTHON=$(abspath $(BIN))/python scripts/cluster/images.sh load

cluster-install: $(STAMP)
	$(BIN)/python scripts/cluster/install.py $(ARGS)

cluster-down:
	scripts/cluster/cluster.sh down

# brings up its own cluster, installs the chart, runs GPU pods and faults, takes it all down
test-cluster: $(STAMP)
	VGPU_K8S_BIN=$(abspath $(CLUSTER_K8S_BIN)) VGPU_CONTAINERD_BIN=$(CLUSTER_CONTAINERD_BIN) $(BIN)/pytest -m realcluster tests/realcluster -v -s -rs -p no:cacheprovider

proto: $(STAMP)
	$(BIN)/python scripts/gen_proto.py

bench: $(STAMP)
	$(BIN)/python -m bench.run_all

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
