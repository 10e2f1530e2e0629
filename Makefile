# Two commands: `make demo` and `make test`. Both create .venv and install the pinned
# dependencies first (once; again whenever setup.py changes). `make corpus` adds the corpus's
# packages (torchvision, timm, transformers, OpenVINO) and runs the public-model benchmark
# (about two hours on 2 cores; CORPUS_ARGS passes options, e.g. CORPUS_ARGS=--no-search).
# `make fuzz` runs the differential fuzzer (docs/fuzzing.md): CASES random graphs from seed SEED
# through every search, schedule and kernel form against the numpy reference, at low priority;
# FUZZ_ARGS passes more options (e.g. FUZZ_ARGS=--every), the report is
# benchmarks/results/fuzz-cpu.json.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint clean corpus fuzz

$(STAMP): setup.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade "pip>=23" "setuptools>=64"
	$(BIN)/python -m pip install --quiet -e ".[dev,onnx,torch]"
	touch $(STAMP)

CORPUS_STAMP := $(VENV)/.installed-corpus

$(CORPUS_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet -e ".[dev,onnx,torch,corpus]"
	touch $(CORPUS_STAMP)

demo: $(STAMP)
	$(BIN)/paragraph models
	$(BIN)/paragraph run squeezenet1_1 --kernels vendor --schedule ios --repeat 20

# the slowest tests are listed at the end: the whole run must stay under 20 minutes on 2 cores.
# Two workers: most tests compile or run on one thread (the suite took 30 minutes on 2 cores
# run one test at a time); a test whose check compares timings takes turns, not a core alone
test: lint
	$(BIN)/python -m pytest -q -n 2 --dist worksteal --durations=15 tests

lint: $(STAMP)
	$(BIN)/ruff check paragraph tests benchmarks tutorials
	$(BIN)/mypy

corpus: $(CORPUS_STAMP)
	PYTHONPATH=.:benchmarks $(BIN)/python benchmarks/corpus.py $(CORPUS_ARGS)

CASES ?= 1000
SEED ?= 0

fuzz: $(STAMP)
	nice -n 10 $(BIN)/python benchmarks/fuzz.py --cases $(CASES) --seed $(SEED) $(FUZZ_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
