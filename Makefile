# The two set-up commands (see README): `make demo` and `make test`. Each bootstraps .venv.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint types unit test-gpu test-realk8s cluster cluster-down cluster-install test-cluster proto bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/vgpu demo $(ARGS)

test: $(STAMP) lint types unit

lint: $(STAMP)
	$(BIN)/python scripts/gen_proto.py --check
	$(BIN)/ruff check .
	$(BIN)/ruff format --check libs services tests scripts bench
	$(BIN)/lint-imports

types: $(STAMP)
	$(BIN)/mypy libs services bench

unit: $(STAMP)
	$(BIN)/pytest -q $(PYTEST_ARGS)

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
cluster: $(STAMP)
	K8S_BIN=$(abspath $(CLUSTER_K8S_BIN)) scripts/cluster/cluster.sh up
	K8S_BIN=$(abspath $(CLUSTER_K8S_BIN)) PYTHON=$(abspath $(BIN))/python scripts/cluster/images.sh load

cluster-install: $(STAMP)
	$(BIN)/python scripts/cluster/install.py $(ARGS)

cluster-down:
	scripts/cluster/cluster.sh down

# brings up its own cluster, installs the chart, runs GPU pods and faults, takes it all down
test-cluster: $(STAMP)
	VGPU_K8S_BIN=$(abspath $(CLUSTER_K8S_BIN)) $(BIN)/pytest -m realcluster tests/realcluster -v -s -rs -p no:cacheprovider

proto: $(STAMP)
	$(BIN)/python scripts/gen_proto.py

bench: $(STAMP)
	$(BIN)/python -m bench.run_all

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
