# The two set-up commands (see README): `make demo` and `make test`. Each bootstraps .venv.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint types unit test-gpu proto bench clean

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

proto: $(STAMP)
	$(BIN)/python scripts/gen_proto.py

bench: $(STAMP)
	$(BIN)/python -m bench.run_all

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
