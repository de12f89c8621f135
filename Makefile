# Two entry points on a fresh machine: `make demo` (the default training job) and `make test`.
PYTHON ?= python3
VENV ?= .venv
# The pinned torch is a local CPU wheel on the project's machines; override with TORCH=torch for your own build.
TORCH ?= torch==2.13.0
PY := $(VENV)/bin/python

.PHONY: demo test bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)" -e ".[all,test]"
	touch $@

demo: $(VENV)/.installed
	$(VENV)/bin/nesgpu train

test: $(VENV)/.installed
	$(PY) -m pytest

bench: $(VENV)/.installed
	$(VENV)/bin/nesgpu bench layers

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
