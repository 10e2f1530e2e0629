# Two commands: `make demo` and `make test`. Both create .venv and install the pinned
# dependencies first (once; again whenever setup.py changes).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint clean

$(STAMP): setup.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade "pip>=23" "setuptools>=64"
	$(BIN)/python -m pip install --quiet -e ".[dev,onnx,torch]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/paragraph models
	$(BIN)/paragraph run squeezenet1_1 --kernels vendor --schedule ios --repeat 20

# the slowest tests are listed at the end: the whole run must stay under 20 minutes on 2 cores
test: lint
	$(BIN)/python -m pytest -q --durations=15 tests

lint: $(STAMP)
	$(BIN)/ruff check paragraph tests benchmarks tutorials
	$(BIN)/mypy

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
