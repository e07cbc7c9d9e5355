# `make demo` and `make test` work on a fresh clone: they create .venv, install torch (CPU build
# 2.13.0, only when no torch is importable) and the package, then run.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.grpo-installed

.PHONY: setup demo test test-slow bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

demo: setup
	$(PY) -m grpo demo $(ARGS)

test: setup
	$(PY) -m pytest -q -m "not slow" $(ARGS)

test-slow: setup
	$(PY) -m pytest -q -m slow $(ARGS)

clean:
	rm -rf runs .pytest_cache
