# Two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-dev
DEMOSTAMP := $(VENV)/.installed-demo
DOCSTAMP := $(VENV)/.installed-docs
export MPLBACKEND := Agg

.PHONY: demo test lint docs lab bench clean venv record parity gpu-check

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# After installing, compile the common kernels into Numba's cache (about 2.5
# minutes on two cores, one process per core): a new user's first cells then load them.
# make test installs the dev extra (the test tools, Triton, the peers the tests
# check against); make demo only the demo extra (matplotlib, tqdm, PyTorch CPU),
# which the dev extra includes.
$(STAMP): $(BIN)/python setup.cfg pyproject.toml
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	$(BIN)/fpemu warmup
	touch $@ $(DEMOSTAMP)

$(DEMOSTAMP): $(BIN)/python setup.cfg pyproject.toml
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[demo]"
	$(BIN)/fpemu warmup
	touch $@

venv: $(STAMP)

demo: $(DEMOSTAMP)
	$(BIN)/fpemu demo --out out

# Two pytest workers (pytest-xdist); PYTEST_WORKERS=0 runs one. With --dist
# loadgroup, conftest.py sends each of the files whose tests compile the same
# kernels or start the same processes to one worker whole, and deals the
# other tests one at a time. (Whole files for every file, --dist loadfile,
# measured no faster.)
PYTEST_WORKERS ?= 2
test: $(STAMP)
	$(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --dist loadgroup --nbmake \
		--nbmake-timeout=1200 notebooks tests fpemu

# flake8 over the package, the tests, the benchmarks and the scripts (setup.cfg).
lint: $(STAMP)
	$(BIN)/python -m flake8 fpemu tests bench scripts conftest.py

# The documentation site: docs/_build/html/index.html. Warnings are errors; the
# lesson notebooks are executed and the gallery is drawn during the build.
docs: $(STAMP) $(DOCSTAMP)
	$(BIN)/sphinx-build -W --keep-going -q -b html docs docs/_build/html
	@echo "open docs/_build/html/index.html"

$(DOCSTAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet -e ".[dev,docs]"
	touch $@

# The lessons in JupyterLab, with live widgets.
lab: $(STAMP)
	$(BIN)/python -m pip install --quiet -e ".[lessons]"
	$(BIN)/jupyter lab notebooks

bench: $(STAMP)
	$(BIN)/python -m pip install --quiet -e ".[bench]"
	$(BIN)/python bench/bench_quantize.py
	$(BIN)/python bench/first_touch.py
	$(BIN)/python bench/bench_startup.py
	$(BIN)/python bench/bench_arith.py
	$(BIN)/python bench/bench_autograd.py
	$(BIN)/python bench/profile_step.py
	$(BIN)/python bench/profile_step.py --matmul-model sequential
	$(BIN)/python bench/bench_collectives.py
	$(BIN)/python bench/bench_monitor.py
	$(BIN)/python bench/bench_torch_quantize.py
	$(BIN)/python bench/bench_emulate.py
	$(BIN)/python bench/bench_block.py
	$(BIN)/python bench/block_memory.py

# Everything fpemu wants from a GPU, in priority order inside a time budget
# (bench/gpu_check.py); HOST=1: the dry run on the CPU, CPU torch standing in.
gpu-check: $(STAMP)
	$(BIN)/python bench/gpu_check.py $(if $(HOST),--host --small)

record: $(STAMP)
	$(BIN)/fpemu record --device cpu

parity: $(STAMP)
	$(BIN)/fpemu parity

clean:
	rm -rf $(VENV) build *.egg-info .hypothesis out docs/_build docs/_generated
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
