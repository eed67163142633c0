# placecheck: `make demo` and `make test` set up everything on a fresh machine.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.placecheck-installed
# torch comes from this machine's disk; pinning it here keeps pip from
# resolving a different (network) build through another package.
TORCH  ?= torch==2.14.1 torchvision==0.29.1

.PHONY: install demo test test-cpu-build lint bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet $(TORCH)
	$(PY) -m pip install --quiet $(TORCH) -e '.[dev,transformers]'
	touch $(STAMP)

demo: install
	@echo '$$ placecheck audit placecheck/examples/buggy.py:BuggyNet --device cuda'
	@$(VENV)/bin/placecheck audit placecheck/examples/buggy.py:BuggyNet --device cuda; \
	  rc=$$?; echo "(exit code $$rc: 1 means placement problems were found)"; [ $$rc -le 1 ]

# CI runs both: the main suite, then the same tests on the CPU-only torch build.
test: install
	$(PY) -m pytest
	$(MAKE) test-cpu-build

# The CPU-only torch build (torch 2.13.0+cpu from this machine's disk), where
# .to("cuda") under fake tensors fails ("not linked with support for cuda
# devices"): the engines must work there too. Nothing else torch-related is
# installed (torchvision does not import beside this torch); the tests that
# need torchvision or transformers skip themselves with pytest.importorskip.
CPU_VENV  ?= .venv-cpu
CPU_PY    := $(CPU_VENV)/bin/python
CPU_STAMP := $(CPU_VENV)/.placecheck-installed
CPU_TORCH ?= torch==2.13.0
# pyproject's dependencies and dev extra but torch and torchvision (the package itself goes
# in with --no-deps), plus numpy, which torch uses when present.
CPU_REQS  := $(CPU_VENV)/requirements.txt

$(CPU_STAMP): pyproject.toml
	test -x $(CPU_PY) || $(PYTHON) -m venv $(CPU_VENV)
	$(CPU_PY) -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; \
	  print(*[d for d in p["dependencies"] + p["optional-dependencies"]["dev"] + ["numpy"] \
	          if not d.startswith("torch")], sep="\n")' > $(CPU_REQS)
	$(CPU_PY) -m pip install --quiet $(CPU_TORCH) -r $(CPU_REQS)
	$(CPU_PY) -m pip install --quiet --no-deps -e .
	touch $(CPU_STAMP)

test-cpu-build: $(CPU_STAMP)
	$(CPU_PY) -c 'import torch, sys; sys.exit(0 if torch.version.cuda is None else "$(CPU_VENV) has a CUDA build of torch: rm -r $(CPU_VENV)")'
	$(CPU_PY) -m pytest

# Every benchmarks/bench_*.py, each printing its table and writing benchmarks/results/.
bench: install
	$(PY) -m pip install --quiet $(TORCH) -e '.[dev,transformers,bench]'
	@set -e; for bench in benchmarks/bench_*.py; do echo "== $$bench"; $(PY) $$bench; done

lint: install
	$(VENV)/bin/ruff check placecheck tests
	$(VENV)/bin/mypy placecheck

clean:
	rm -rf $(VENV) $(CPU_VENV) .pytest_cache .mypy_cache .ruff_cache build *.egg-info
