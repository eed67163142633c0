# placecheck: `make demo` and `make test` set up everything on a fresh machine.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.placecheck-installed
# torch comes from this machine's disk: constraints.txt pins its builds for every pip install of
# the main venv, so that pip never resolves a different (network) build through another package.
# pyproject.toml's published ranges stay open for users.
TORCH  ?= -c constraints.txt

.PHONY: install demo test test-cpu-build lint bench fidelity clean wheel-check

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet $(TORCH) torch torchvision
	$(PY) -m pip install --quiet $(TORCH) -e '.[dev,transformers,fix,zoo,accelerate,vision,safetensors]'
	touch $(STAMP)

demo: install
	@echo '$$ placecheck audit placecheck/examples/buggy.py:BuggyNet --device cuda'
	@$(VENV)/bin/placecheck audit placecheck/examples/buggy.py:BuggyNet --device cuda; \
	  rc=$$?; echo "(exit code $$rc: 1 means placement problems were found)"; [ $$rc -le 1 ]

# CI runs both: the whole suite on the main torch build, then on the CPU-only build the
# tests marked cpu_build (see test-cpu-build). -n: one pytest-xdist worker per core; worksteal
# keeps both busy to the end, since a few zoo models take far longer than the rest. Each worker runs
# torch with its share of the cores (tests/conftest.py), so the workers' threads do not compete.
# benchmarks/bench_suite.py times this target on a clean clone (issue 14: at most 7 minutes). Any
# non-zero pytest exit fails the target, 5 (no test collected, a -m matching nothing) included.
# Both venvs are installed first, side by side (two pip installs, mostly unpacking wheels from
# this machine's disk, take one core each): on a clean clone that saves the CPU-only build's install
# after the suite.
TEST_WORKERS ?= auto
PYTEST_PARALLEL := -n $(TEST_WORKERS) --dist worksteal
test:
	$(MAKE) -j2 install $(CPU_STAMP)
	$(PY) -m pytest $(PYTEST_PARALLEL)
	$(MAKE) test-cpu-build

# The CPU-only torch build (torch 2.13.0+cpu from this machine's disk), where
# .to("cuda") under fake tensors fails ("not linked with support for cuda
# devices"): the engines must work there too. Nothing else torch-related is
# installed (torchvision does not import beside this torch); the tests that
# need torchvision or transformers skip themselves with pytest.importorskip.
# Only the tests marked cpu_build run there (pytest -m cpu_build): those that reach code which
# branches on the build (placecheck/engine.py's _CPU_ONLY_BUILD: moves to and indexing of fake
# CUDA tensors, autocast, the fake engine's fallbacks; a build-dependent engine name). The rest
# need not run twice: the report, formats, rules, config, baseline, CLI options, the runner's
# process handling and checkpoint parsing read findings, files and options, never the torch
# build's CUDA support, so they pass or fail alike on both builds.
CPU_VENV  ?= .venv-cpu
CPU_PY    := $(CPU_VENV)/bin/python
CPU_STAMP := $(CPU_VENV)/.placecheck-installed
CPU_TORCH ?= torch==2.13.0
# pyproject's dependencies, dev and accelerate extras but torch and torchvision (the package itself
# goes in with --no-deps), plus numpy, which torch uses when present. accelerate: --device-map
# dispatches on simulated GPUs there too (moves to CUDA take another path on that build).
CPU_REQS  := $(CPU_VENV)/requirements.txt

$(CPU_STAMP): pyproject.toml
	test -x $(CPU_PY) || $(PYTHON) -m venv $(CPU_VENV)
	$(CPU_PY) -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; \
	  extras = p["optional-dependencies"]; \
	  print(*[d for d in p["dependencies"] + extras["dev"] + extras["accelerate"] + ["numpy"] \
	          if not d.startswith("torch")], sep="\n")' > $(CPU_REQS)
	$(CPU_PY) -m pip install --quiet $(CPU_TORCH) -r $(CPU_REQS)
	$(CPU_PY) -m pip install --quiet --no-deps -e .
	touch $(CPU_STAMP)

test-cpu-build: $(CPU_STAMP)
	$(CPU_PY) -c 'import torch, sys; sys.exit(0 if torch.version.cuda is None else "$(CPU_VENV) has a CUDA build of torch: rm -r $(CPU_VENV)")'
	$(CPU_PY) -m pytest $(PYTEST_PARALLEL) -m cpu_build

# Every benchmarks/bench_*.py, each printing its table and writing benchmarks/results/.
bench: install
	$(PY) -m pip install --quiet $(TORCH) -e '.[dev,transformers,bench,vision]'
	@set -e; for bench in benchmarks/bench_*.py; do echo "== $$bench"; $(PY) $$bench; done

# Real-GPU fidelity (benchmarks/fidelity.py): every fixture, example and torchvision zoo model audited
# with --engine real on the GPU and with --engine fake (tagged where fake tensors stop), findings
# compared; writes benchmarks/results/fidelity.json and prints the README's table. Without a CUDA GPU
# it says so and exits 0, writing nothing.
fidelity: install
	$(PY) benchmarks/fidelity.py

# The wheel a user installs: built as a release is (python -m build), installed with its declared
# dependencies into a fresh venv that sees the main venv's packages through a .pth file (torch is
# already there, nothing is downloaded: --no-index), then run from outside the source tree.
WHEEL_DIR := build/wheel-check
wheel-check: install
	rm -rf $(WHEEL_DIR) build/lib build/bdist.*
	mkdir -p $(WHEEL_DIR)
	$(PY) -m build --wheel --no-isolation --outdir $(WHEEL_DIR)/dist . > $(WHEEL_DIR).log
	$(PYTHON) -m venv $(WHEEL_DIR)/venv
	$(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' > \
	  "$$($(WHEEL_DIR)/venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/main-venv.pth"
	@# the fresh venv's own old setuptools would hide the one torch requires
	$(WHEEL_DIR)/venv/bin/python -m pip uninstall --quiet --yes setuptools
	$(WHEEL_DIR)/venv/bin/python -m pip install --quiet --no-index $(WHEEL_DIR)/dist/placecheck-*.whl
	cd $(WHEEL_DIR) && venv/bin/python -c 'import placecheck, sys; \
	  sys.exit(0 if "/venv/" in placecheck.__file__ else f"imported {placecheck.__file__}, not the wheel")'
	cd $(WHEEL_DIR) && venv/bin/placecheck example-config | grep -q '^\[\[models\]\]'
	cd $(WHEEL_DIR) && venv/bin/placecheck audit torchvision.models:resnet18
	@echo "wheel-check: the wheel installs beside the present torch and audits resnet18"

lint: install
	$(VENV)/bin/ruff check placecheck tests benchmarks
	$(VENV)/bin/mypy placecheck

clean:
	rm -rf $(VENV) $(CPU_VENV) .pytest_cache .mypy_cache .ruff_cache build *.egg-info
