# Two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-dev
export MPLBACKEND := Agg

.PHONY: demo test bench clean venv record parity

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(BIN)/python setup.cfg pyproject.toml
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $@

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/fpemu demo --out out

test: $(STAMP)
	$(BIN)/python -m pytest -q --nbmake notebooks tests fpemu

bench: $(STAMP)
	$(BIN)/python -m pip install --quiet -e ".[bench]"
	$(BIN)/python bench/bench_quantize.py
	$(BIN)/python bench/bench_startup.py
	$(BIN)/python bench/bench_arith.py
	$(BIN)/python bench/bench_autograd.py

record: $(STAMP)
	$(BIN)/fpemu record --device cpu

parity: $(STAMP)
	$(BIN)/fpemu parity

clean:
	rm -rf $(VENV) build *.egg-info .hypothesis out
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
