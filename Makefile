# placecheck: `make demo` and `make test` set up everything on a fresh machine.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.placecheck-installed
# torch comes from this machine's disk: constraints.txt pins its builds for every pip install of
# the main venv, so that pip never resolves a different (network) build through another package.
# pyproject.toml's published ranges stay open for users.
TORCH  ?= -c constraints.txt

.PHONY: install demo test test-cpu-build test-compat test-corpus lint bench fidelity clean wheel-check

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet $(TORCH) torch torchvision
	$(PY) -m pip install --quiet $(TORCH) -e '.[dev,transformers,fix,zoo,accelerate,vision,safetensors,frameworks]'
	touch $(STAMP)

demo: install
	@echo '$$ placecheck audit placecheck/examples/buggy.py:BuggyNet --device cuda'
	@$(VENV)/bin/placecheck audit placecheck/examples/buggy.py:BuggyNet --device cuda; \
	  rc=$$?; echo "(exit code $$rc: 1 means placement problems were found)"; [ $$rc -le 1 ]

# CI runs both: the whole suite on the main torch build, then on the CPU-only build the
# tests marked cpu_build (see test-cpu-build). -n: one pytest-xdist worker per core; worksteal
# keeps both busy to the end, since a few zoo models take far longer than the rest. Each worker runs
# torch with its share of the cores (tests/conftest.py), so the workers' threads do not compete.
# benchmarks/bench_suite.py times it on a clean clone (issue 41: at most 5 minutes, scaled to the machine). Any
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

# The CPU-only torch build (torch 2.13.0+cpu: this machine's wheel store, /opt/wheels, or the PyTorch
# CPU wheel index named by TORCH_CPU_INDEX), where .to("cuda") under fake tensors fails ("not linked
# with support for cuda devices"): the engines must work there too. Nothing else torch-related is
# installed (torchvision does not import beside this torch); the tests that
# need torchvision or transformers skip themselves with pytest.importorskip.
# Only the tests marked cpu_build run there (pytest -m cpu_build): those that reach code which
# branches on the build (placecheck/engines/engine.py's _CPU_ONLY_BUILD: moves to and indexing of fake
# CUDA tensors, autocast, the fake engine's fallbacks; a build-dependent engine name). The rest
# need not run twice: the report, formats, rules, config, baseline, CLI options, the runner's
# process handling and checkpoint parsing read findings, files and options, never the torch
# build's CUDA support, so they pass or fail alike on both builds.
# The requirement names the local version +cpu, so pip never takes a CUDA build for it. On a machine
# without the wheel, pass the index: make test TORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu
# When no CPU-only build can be had, the leg is skipped with a line saying so (never failed, never
# passed silently); rm -r $(CPU_VENV) to try again.
CPU_VENV  ?= .venv-cpu
CPU_PY    := $(CPU_VENV)/bin/python
CPU_STAMP := $(CPU_VENV)/.placecheck-installed
CPU_NONE  := $(CPU_VENV)/.no-cpu-only-build
CPU_TORCH ?= torch==2.13.0+cpu
TORCH_CPU_INDEX ?=
# pyproject's dependencies, dev and accelerate extras but torch and torchvision (the package itself
# goes in with --no-deps), plus numpy, which torch uses when present. accelerate: --device-map
# dispatches on simulated GPUs there too (moves to CUDA take another path on that build).
CPU_REQS  := $(CPU_VENV)/requirements.txt

$(CPU_STAMP): pyproject.toml
	test -x $(CPU_PY) || $(PYTHON) -m venv $(CPU_VENV)
	$(CPU_PY) -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; \
	  extras = p["optional-dependencies"]; \
	  wanted = p["dependencies"] + [d for e in ("dev", "accelerate", "safetensors") for d in extras.get(e, [])]; \
	  print(*[d for d in wanted + ["numpy"] if not d.startswith("torch")], sep="\n")' > $(CPU_REQS)
	if $(CPU_PY) -m pip install --quiet $(if $(TORCH_CPU_INDEX),--extra-index-url $(TORCH_CPU_INDEX)) \
	    '$(CPU_TORCH)'; then rm -f $(CPU_NONE); else touch $(CPU_NONE); fi
	test -f $(CPU_NONE) || $(CPU_PY) -m pip install --quiet -r $(CPU_REQS)
	test -f $(CPU_NONE) || $(CPU_PY) -m pip install --quiet --no-deps -e .
	touch $(CPU_STAMP)

test-cpu-build: $(CPU_STAMP)
	@if [ -f $(CPU_NONE) ]; then echo "test-cpu-build: SKIPPED: no CPU-only build of torch could be had \
	($(CPU_TORCH)); set TORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu (or another index with it)"; \
	exit 0; fi; \
	$(CPU_PY) -c 'import torch, sys; sys.exit(0 if torch.version.cuda is None else "$(CPU_VENV) has a CUDA build of torch: rm -r $(CPU_VENV)")' && \
	$(CPU_PY) -m pytest $(PYTEST_PARALLEL) -m cpu_build

# ---- the real-code gate (issue 33): make test-corpus ----------------------------------------------
# Every program of ../shared/corpus (correct training code from public projects, beside the clone,
# read-only; CORPUS=DIR names another) runs under placecheck run with no error or warning, under both
# engines (tagged and fake; the mutants split between them in turn, to stay under 5 minutes), and mutants
# generated from each (a batch element's .to(device) removed, device= removed from a factory, a
# register_buffer made a plain attribute, a CPU loss weight, an optimizer of a re-created model) are
# each found at their line: tests/corpus_gate.py says how; it prints "programs clean N/N, mutants found
# M/M" per engine and in all, and fails on any miss. Without the corpus it prints a SKIPPED line and passes.
# time_sequence_prediction plots with matplotlib: the bench extra brings it.
CORPUS ?= ../shared/corpus
test-corpus: install
	$(PY) -m pip install --quiet $(TORCH) -e '.[bench]'
	$(PY) tests/corpus_gate.py --corpus $(CORPUS) --workers 2

# ---- the version matrix (issue 22): make test-compat ----------------------------------------------
# The tests marked compat (engines, the device-error classifier, run mode, checkpoint reading, fix,
# CLI parsing) on every torch of the matrix, each in its own venv: the declared floor (pyproject's
# torch>=X.Y, read from it), what GPU images ship (2.11), the pinned build (the main venv) and the
# newest release. Then the tests marked transformers under transformers 4.57.x and the newest 5.x
# (each in a venv of its own with the pinned torch), and those marked cli under typer's declared
# floor, 0.27.2 and the newest: those legs install only typer and its dependencies into a folder put
# first on PYTHONPATH (pip --target), in front of the main venv's, which is never changed. A venv (or
# folder) is reused while its stamp is newer than pyproject.toml; `rm -r .venv-torch-2.15` (or make
# clean) builds it again. Any non-zero pytest exit fails the target, 5 (a marker selecting nothing)
# included.
# PIP_CONSTRAINT=/dev/null: this machine's global pip constraint caps torch at the pinned build; the
# compat venvs lift it for themselves only (an empty PIP_CONSTRAINT does not: pip then keeps its
# config file's value).
TOML_FLOOR = $(shell $(PYTHON) -c 'import re, tomllib; \
  deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]; \
  print(next(re.search(r">=\s*([0-9.]+)", d).group(1) for d in deps if re.match(r"$(1)\b", d)))')
TORCH_FLOOR  := $(call TOML_FLOOR,torch)
TYPER_FLOOR  := $(call TOML_FLOOR,typer)
COMPAT_TORCH ?= $(TORCH_FLOOR) 2.11 2.15
COMPAT_TRANSFORMERS ?= 4.57 5
COMPAT_TYPER ?= $(TYPER_FLOOR) 0.27.2 newest
COMPAT_PYTEST := -p no:cacheprovider $(PYTEST_PARALLEL)

# pyproject's dependencies and its dev, accelerate, fix and safetensors extras, but torch and
# torchvision (the package goes in with --no-deps), plus numpy, which torch uses when present
COMPAT_REQS = $(1)/bin/python -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; \
  extras = p["optional-dependencies"]; \
  wanted = p["dependencies"] + [d for e in ("dev", "accelerate", "fix", "safetensors") for d in extras.get(e, [])]; \
  print(*[d for d in wanted + ["numpy"] if not d.startswith(("torch", "transformers"))], sep="\n")' \
  > $(1)/requirements.txt

# torch==X.Y is X.Y.0
.venv-torch-%/.placecheck-installed: pyproject.toml
	test -x $(@D)/bin/python || $(PYTHON) -m venv $(@D)
	$(call COMPAT_REQS,$(@D))
	PIP_CONSTRAINT=/dev/null $(@D)/bin/python -m pip install --quiet torch==$* -r $(@D)/requirements.txt
	$(@D)/bin/python -m pip install --quiet --no-deps -e .
	touch $@

# A venv of its own beside the pinned torch: placecheck tells installed packages (site-packages) from
# the user's code, so transformers must be installed, not put on PYTHONPATH. The main venv's packages
# (the pinned torch among them, 6 GB) are hard-linked into it, which costs no disk: pip only adds and
# removes files, never rewrites one in place, so the main venv is never changed. Where hard links
# cannot be made (another file system), the venv installs them instead (constraints.txt's torch
# lines: its other pins would fix transformers). transformers X.Y is its newest X.Y.*, transformers 5
# its newest 5.*.
SITE_OF = $(1) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'
.venv-transformers-%/.placecheck-installed: pyproject.toml constraints.txt | install
	rm -rf $(@D)
	$(PYTHON) -m venv --without-pip $(@D)
	$(call COMPAT_REQS,$(@D))
	grep -E '^torch' constraints.txt > $(@D)/constraints.txt
	cp -al "$$($(call SITE_OF,$(PY)))/." "$$($(call SITE_OF,$(@D)/bin/python))/" 2>/dev/null || \
	  { echo "no hard links from $(VENV): $(@D) installs its own torch"; $(@D)/bin/python -m ensurepip --quiet; }
	$(@D)/bin/python -m pip install --quiet -c $(@D)/constraints.txt torch 'transformers~=$*.0' \
	  -r $(@D)/requirements.txt
	$(@D)/bin/python -m pip install --quiet --no-deps -e .
	touch $@

# typer (and its click) only, put first on PYTHONPATH in front of the main venv's, which is not changed
.venv-typer-%/.stamp: pyproject.toml | install
	rm -rf $(@D)
	$(PY) -m pip install --quiet --target $(@D) '$(if $(filter newest,$*),typer,typer==$*)'
	touch $@

# Each venv is built just before its leg; COMPAT_KEEP=0 (.ci/run: a clean clone that is thrown away)
# removes it after its leg, so that the matrix needs the disk of one venv at a time, not of five.
COMPAT_KEEP ?= 1
# COMPAT_MAIN=0 (.ci/run, right after make test): what the main venv has is not tested again, neither
# the compat tests on its torch nor the cli tests under a typer of the matrix that is its own (typer
# "newest" is, on a fresh venv, with the same click); the line of each leg left out says so.
COMPAT_MAIN ?= 1
TYPER_CLICK := 'import importlib.metadata as m; print(m.version("typer"), "with click", \
  *[d.version for d in m.distributions(name="click")][:1] or ["(its own)"])'
COMPAT_DONE = $(if $(filter 0,$(COMPAT_KEEP)),rm -rf $(1),true)
test-compat: install
	@set -e; for v in $(COMPAT_TORCH); do \
	  $(MAKE) --no-print-directory .venv-torch-$$v/.placecheck-installed; \
	  echo "== test-compat: torch $$(.venv-torch-$$v/bin/python -c 'import torch; print(torch.__version__)')"; \
	  .venv-torch-$$v/bin/python -m pytest $(COMPAT_PYTEST) -m compat; \
	  $(call COMPAT_DONE,.venv-torch-$$v); done
	@set -e; main="torch $$($(PY) -c 'import torch; print(torch.__version__)') (the main venv)"; \
	if [ "$(COMPAT_MAIN)" = 0 ]; then echo "== test-compat: $$main: not run again, make test ran the whole suite on it"; \
	else echo "== test-compat: $$main"; $(PY) -m pytest $(COMPAT_PYTEST) -m compat; fi
	@set -e; for v in $(COMPAT_TRANSFORMERS); do \
	  $(MAKE) --no-print-directory .venv-transformers-$$v/.placecheck-installed; \
	  echo "== test-compat: transformers $$(.venv-transformers-$$v/bin/python -c \
	    'import transformers; print(transformers.__version__)')"; \
	  .venv-transformers-$$v/bin/python -m pytest $(COMPAT_PYTEST) -m transformers; \
	  $(call COMPAT_DONE,.venv-transformers-$$v); done
	@set -e; main=$$($(PY) -c $(TYPER_CLICK)); \
	for v in $(COMPAT_TYPER); do \
	  $(MAKE) --no-print-directory .venv-typer-$$v/.stamp; \
	  got=$$(PYTHONPATH=$(CURDIR)/.venv-typer-$$v $(PY) -c $(TYPER_CLICK)); \
	  if [ "$(COMPAT_MAIN)" = 0 ] && [ "$$got" = "$$main" ]; then \
	    echo "== test-compat: typer $$got ($$v): not run again, the main venv's, on which make test ran"; \
	    continue; fi; \
	  echo "== test-compat: typer $$got"; \
	  PYTHONPATH=$(CURDIR)/.venv-typer-$$v $(PY) -m pytest $(COMPAT_PYTEST) -m cli; done

# Every benchmarks/bench_*.py, each printing its table and writing benchmarks/results/.
bench: install
	$(PY) -m pip install --quiet $(TORCH) -e '.[dev,transformers,bench,vision]'
	@set -e; for bench in benchmarks/bench_*.py; do echo "== $$bench"; $(PY) $$bench; done

# Real-GPU fidelity: first the truth table (benchmarks/mix_table.py: PyTorch's verdict per op and CPU
# argument, regenerated into tests/data/mix-table.json on a GPU, which the CPU tests replay; then
# --replay prints the engines' agreement with it), then benchmarks/fidelity.py: every fixture,
# example (training examples run as scripts) and torchvision zoo model audited with --engine real on
# the GPU and with --engine fake (tagged where fake tensors stop), findings compared; writes
# benchmarks/results/fidelity.json and prints docs/engines.md's table. Without a CUDA GPU each says
# so and exits 0, writing nothing; the committed table stands.
fidelity: install
	$(PY) benchmarks/mix_table.py
	$(PY) benchmarks/mix_table.py --replay
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
	rm -rf $(VENV) $(CPU_VENV) .venv-torch-* .venv-transformers-* .venv-typer-* .pytest_cache .mypy_cache \
	  .ruff_cache build *.egg-info
