# kvlab: `make report` and `make test` set everything up on a fresh machine (Python 3.11 + make).
SHELL  := /bin/bash
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.kvlab-installed
PARAMS ?= params.yaml
# One value over the parameters file, e.g. make report SET="02_batching.SEED=3"
SET    ?=

# Caches live inside the checkout, so a missing or read-only HOME cannot break a build or CI.
export MPLCONFIGDIR        := $(CURDIR)/.cache/matplotlib
export IPYTHONDIR          := $(CURDIR)/.cache/ipython
export JUPYTER_CONFIG_DIR  := $(CURDIR)/.cache/jupyter/config
export JUPYTER_DATA_DIR    := $(CURDIR)/.cache/jupyter/data
export JUPYTER_RUNTIME_DIR := $(CURDIR)/.cache/jupyter/runtime
export NUMBA_CACHE_DIR     := $(CURDIR)/.cache/numba
export PYTHONHASHSEED      := 0
export PIP_DISABLE_PIP_VERSION_CHECK := 1
export UV_CACHE_DIR        := $(CURDIR)/.cache/uv
UV_VERSION := 0.13.10
# Real request traces (not committed): a folder holding the files that data/traces.toml lists.
export TRACE_DIR ?= $(CURDIR)/../shared/traces

.PHONY: help setup report test format bench lab notebooks traces calibrate parity clean

help:
	@echo "make report   set up (first time) and build report/ (HTML, PDF, ledger.csv)"
	@echo "make test     set up (first time) and run unit, CLI and notebook (nbval) tests"
	@echo "make format   format and lint the code with ruff (make test checks both)"
	@echo "make bench    run the speed and memory benchmarks and print their figures"
	@echo "make notebooks re-execute notebooks/ in place with their defaults (the outputs nbval checks)"
	@echo "make lab      open the notebooks in JupyterLab (prints the URL to open; root is fine)"
	@echo "make calibrate measure KV bytes per token and decode/prefill times on this machine's GPU (needs torch)"
	@echo "make traces   download the public request traces into data/traces/ and check their hashes"
	@echo "make parity   run vLLM's own sizing code and scheduler (installed in .venv-vllm, CPU only) against kvlab"
	@echo "make clean    remove report/ outputs and caches (keeps .venv)"

setup: $(STAMP)

$(STAMP): requirements.lock pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null || { echo "make setup: kvlab needs \
	Python 3.11 or later as $(PYTHON) (found: $$($(PYTHON) --version 2>&1)); give one with make PYTHON=python3.11"; exit 2; }
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@# uv installs the lock in about a tenth of pip's time (compiled to bytecode, as pip does); pip where uv cannot
	$(BIN)/python -m pip install --quiet uv==$(UV_VERSION) && $(BIN)/uv pip install --quiet --compile-bytecode \
	--python $(BIN)/python -r requirements.lock || $(BIN)/python -m pip install --quiet -r requirements.lock
	$(BIN)/python -m pip install --quiet --no-deps -e .
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (kvlab)" >/dev/null
	@bash scripts/install_chromium.sh
	@echo "make setup: numba compiles kvlab's engine loops once for this machine (about a minute)"
	@$(BIN)/python -c 'from kvlab.core.engine import warm; print("\n".join("make setup: compiled the " + d for d in warm.warm()))'
	@touch $@

# The cache folders must exist before Jupyter or IPython look at them.
CACHE_DIRS := $(MPLCONFIGDIR) $(IPYTHONDIR) $(JUPYTER_CONFIG_DIR) $(JUPYTER_DATA_DIR) $(JUPYTER_RUNTIME_DIR)
$(shell mkdir -p $(CACHE_DIRS) $(IPYTHONDIR)/profile_default)
# Kernels log nothing short of a crash (not the TCP-transport warning every kernel start prints, nor
# the interrupt a kernel logs when papermill shuts it down).
$(shell echo 'c.IPKernelApp.log_level = "CRITICAL"' > $(IPYTHONDIR)/profile_default/ipython_kernel_config.py)

report: $(STAMP)
	$(BIN)/kvlab report --params $(PARAMS) $(foreach s,$(SET),--set $(s))

# A pytest-xdist worker per core (at most TEST_WORKERS_MAX), each taking whole files and notebooks in the order
# collected: the report that the last tests read builds meanwhile (conftest.py). TEST_WORKERS=0: one process.
TEST_WORKERS     ?= auto
TEST_WORKERS_MAX ?= 4
test: $(STAMP)
	$(BIN)/python -m pytest -q -rs --nbval --nbval-current-env -n $(TEST_WORKERS) --maxprocesses $(TEST_WORKERS_MAX) \
	--dist loadfile --no-loadscope-reorder tests notebooks

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench: $(STAMP)
	$(BIN)/python benchmarks/run.py

# --allow-root: containers often run as root, where Jupyter refuses to start without it; the URL (with its
# token) is printed by the server itself once it listens. LAB_PORT picks the port.
LAB_PORT ?= 8888
lab: $(STAMP)
	@echo "make lab: starting JupyterLab on the notebooks; open the http://127.0.0.1:$(LAB_PORT)/lab?token=... URL it prints"
	$(BIN)/jupyter lab --no-browser --allow-root --ip 127.0.0.1 --port $(LAB_PORT) --notebook-dir notebooks

notebooks: $(STAMP)
	$(BIN)/jupyter nbconvert --to notebook --execute --inplace --ExecutePreprocessor.kernel_name=python3 --ExecutePreprocessor.record_timing=False notebooks/*.ipynb

calibrate:
	bash scripts/gpu_calibration.sh

# vLLM itself, for make parity only (about 9 GB, a few minutes, CPU only; never part of make test).
VENV_VLLM := .venv-vllm
VLLM_VERSION := 0.33.0
# the transformers make parity's runs were proven with (vLLM 0.33.0 accepts a range; its config parsing is what parity reads)
TRANSFORMERS_VERSION := 5.20.2
$(VENV_VLLM)/.installed:
	@test -x $(VENV_VLLM)/bin/python || $(PYTHON) -m venv $(VENV_VLLM)
	$(VENV_VLLM)/bin/python -m pip install --quiet vllm==$(VLLM_VERSION) transformers==$(TRANSFORMERS_VERSION)
	@touch $@

parity: $(STAMP) $(VENV_VLLM)/.installed
	$(BIN)/python scripts/parity/compare_capacity.py --vllm-python $(VENV_VLLM)/bin/python
	$(BIN)/python scripts/parity/compare_scheduler.py --vllm-python $(VENV_VLLM)/bin/python
	$(BIN)/python scripts/parity/compare_serve_flags.py --vllm-python $(VENV_VLLM)/bin/python
	$(BIN)/python scripts/parity/compare_dp_rank.py --vllm-python $(VENV_VLLM)/bin/python

traces: $(STAMP)
	$(BIN)/kvlab traces download --dest data/traces

clean:
	find report -mindepth 1 ! -name README.md -exec rm -rf {} +
	rm -rf .cache .hypothesis
