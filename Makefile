# Developer entry points. `make demo` and `make test` create the virtual environment on first use.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# Device plugins installed (editable) into the development environment, next to the core.
PLUGINS := plugins/runtime_cpu
# Reinstall when any packaging file changes; the stamp lives inside the venv, so deleting .venv resets it.
STAMP := $(VENV)/.installed.stamp
PACKAGING := setup.cfg pyproject.toml $(foreach p,$(PLUGINS),$(p)/setup.cfg $(p)/pyproject.toml)
TEST_PATHS := tests $(wildcard $(addsuffix /tests,$(PLUGINS)))

.PHONY: venv demo test lint bench clean

venv: $(STAMP)

$(STAMP): $(PACKAGING)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# one pip command: pip resolves the local editable plugins only when their paths are named together
	$(PY) -m pip install -e ".[test]" $(addprefix -e ./,$(PLUGINS))
	touch $(STAMP)

demo: venv
	@if [ -f examples/train_digits.py ]; then $(PY) examples/train_digits.py; \
	else $(PY) examples/quickstart.py; fi

test: venv
	$(PY) -m pytest -n 2 $(TEST_PATHS) -q

lint: venv
	$(PY) -m ruff check .

bench: venv
	@files="$(wildcard bench/bench_*.py)"; \
	if [ -z "$$files" ]; then echo "no benchmarks found (bench/bench_*.py)"; exit 1; fi; \
	for f in $$files; do echo "== $$f"; $(PY) $$f || exit 1; done

clean:
	rm -rf $(VENV) build .pytest_cache .ruff_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
	find . -name '*.egg-info' -type d -prune -exec rm -rf {} +
