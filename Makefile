# placecheck: `make demo` and `make test` set up everything on a fresh machine.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.placecheck-installed
# torch comes from this machine's disk; pinning it here keeps pip from
# resolving a different (network) build through another package.
TORCH  ?= torch==2.14.1 torchvision==0.29.1

.PHONY: install demo test lint bench clean

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

test: install
	$(PY) -m pytest

# Every benchmarks/bench_*.py, each printing its table and writing benchmarks/results/.
bench: install
	$(PY) -m pip install --quiet $(TORCH) -e '.[dev,transformers,bench]'
	@set -e; for bench in benchmarks/bench_*.py; do echo "== $$bench"; $(PY) $$bench; done

lint: install
	$(VENV)/bin/ruff check placecheck tests
	$(VENV)/bin/mypy placecheck

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build *.egg-info
