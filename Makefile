# MiniMind from Zero: every target creates or reuses .venv and installs what it needs.
#   make test     - set up, then run every test (package, checks, student editions, book, browser;
#                   then nbval on every chapter in the Colab-like environment; then the package tests
#                   and every chapter with the newest releases, natively: see below)
#   make test-floors - the package tests and every chapter with the oldest releases pyproject.toml declares
#   make test-gpu - the chapters, the training tests and the DDP test on CUDA (skipped without a GPU)
#   make gpu-check - the prepared device check (tools/gpu_check.sh): suite, benchmarks, one log and one record
#   make book     - set up, then execute the notebooks and build the site into _build/html
#   make student  - regenerate the student editions (student/, student/zh/) from notebooks/ and locales/
#   make i18n     - update the translation catalogs (locales/) from the English sources; coverage
#   make publish  - make book, then push _build/html to the gh-pages branch (ghp-import)
SHELL := /bin/bash
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip
STAMP  := $(VENV)/.installed
export PIP_DISABLE_PIP_VERSION_CHECK := 1
# No MPLBACKEND here: every chapter's setup cell says `%matplotlib inline` itself, and the
# Colab-like run proves it by running the notebooks with MPLBACKEND=Agg.
export PYDEVD_DISABLE_FILE_VALIDATION := 1
# Parallel test processes (pytest-xdist workers, notebooks at a time in the Colab-like run).
WORKERS ?= $(shell nproc 2>/dev/null || echo 2)
# Chapters whose Chinese edition (student/zh/, locales/zh_CN) also runs under nbval in test-colab.
ZH_CHAPTERS ?= 01,02,03,04,05,06,07,08
# The interpreter of the Colab-like environment (.colab-venv). Empty: tools/colab_like.py finds a python3.N of
# the version Colab runs (requirements/colab-runtime.txt's `# python:` line; on PATH or in pyenv).
COLAB_PYTHON ?=

CHROMIUM := /usr/bin/chromium
APT_GET  := DEBIAN_FRONTEND=noninteractive apt-get

.PHONY: i18n venv test test-package test-colab test-current test-floors test-gpu gpu-wheels gpu-check test-fast book student execute timings report publish vendor browser clean help

help:
	@echo "make test | make test-floors | make test-gpu | make gpu-check | make book | make student | make publish | make execute NB=notebooks/01_normalization.ipynb | make timings | make report | make bench | make clean"

# torch==2.13.0 goes in first and the constraints file holds it there for everything after.
$(STAMP): pyproject.toml requirements/dev.txt requirements/constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q "torch==2.13.0"
	$(PIP) install -q -c requirements/constraints.txt -r requirements/dev.txt
	$(PIP) install -q -c requirements/constraints.txt --no-deps -e .
	$(BIN)/python -c "import torch, minimind_ref; assert torch.__version__.startswith('2.13.0'), torch.__version__"
	touch $@

venv: $(STAMP)

# `make test` is three passes, each WORKERS processes wide. All passes always run; make fails if any
# failed. The first two are pinned (requirements/dev.txt) and every process is single-threaded
# (OMP_NUM_THREADS=1: two workers fill two cores without oversubscribing them, and the run does not
# depend on the core count).
#  1. test-package: pytest on tests/ in .venv (package, exercise checks with their planted
#     mistakes, notebook structure and prose numbers, student editions, the book build from the
#     stored outputs, the browser look at a page, DDP), under pytest-xdist (`--dist loadgroup`:
#     the tests that share the built site stay in one worker; slow tests start first).
#     tests/conftest.py gives the session a private TMPDIR and fails it if anything named
#     minimind_* is left there. No chapter runs in this pass.
#  2. test-colab: Colab's runtime. tools/colab_like.py makes .colab-venv from requirements/colab-runtime.txt
#     alone (Colab's published snapshot, googlecolab/backend-info: its Python, 3.13 today, and its releases of
#     torch, transformers, tokenizers, huggingface_hub, numpy, matplotlib, ipywidgets, ipykernel and what they
#     need; the file names the snapshot's commit and date, and moving to Colab's next runtime is one edit of it),
#     proves with a pip dry run that the chapters' install cell (minimind-ref[course]) changes no package Colab
#     preloads, builds the wheel, installs it (not editable, [course] extra), copies the chapters into an empty
#     folder outside the repository and runs nbval there with kernel settings that differ from those of the
#     stored outputs: ATEN_CPU_CAPABILITY=default, OMP_NUM_THREADS=1, MPLBACKEND=Agg; in the same kernel, right
#     before each exercise cell, the check must fail on the student stub (tools/nbval_stubs.py).
#     Each chapter executes once per `make test`, and that one run proves the stored outputs, the
#     stubs, the package data and the Colab install. It fails if the chapters leave minimind_*
#     entries in their TMPDIR or files in their folder. The first run downloads Colab's torch (a CUDA
#     build, about 4.7 GB with its libraries; pip caches it), and the environment is made again only when
#     pyproject.toml, requirements/colab-runtime.txt, requirements/colab.txt or the interpreter change.
#  3. test-current: tools/current_releases.py creates .current-venv afresh with torch 2.13.0 and the
#     NEWEST release of everything else the course uses (transformers, tokenizers, huggingface_hub,
#     numpy, matplotlib, ipywidgets, ipykernel, ...: resolved at run time, never pinned; a release that
#     breaks the course is skipped only through the dated allow-list requirements/current-exceptions.txt),
#     prints the versions, proves the wheel's [course,hf,hub] extras install beside them without changing
#     any, then runs the package tests and nbval on every chapter natively: the CPU's own SIMD level and
#     thread count (no ATEN_CPU_CAPABILITY, no OMP_NUM_THREADS), so every chapter is proven both ways.
#     CONTRIBUTING.md ("How make test spends its time") has the measured budget: 35 minutes on an idle
#     2-core machine, the torch download cached.
# Not part of `make test`: `make test-floors` (the oldest releases pyproject.toml declares; see below).
# OMP_WAIT_POLICY=PASSIVE: idle OpenMP threads sleep instead of spinning, so a test process, a
# notebook kernel and the DDP workers cannot starve each other (numbers are unchanged).
test: $(STAMP) browser vendor
	@status=0; \
	$(MAKE) --no-print-directory test-package || status=1; \
	$(MAKE) --no-print-directory test-colab || status=1; \
	$(MAKE) --no-print-directory test-current || status=1; \
	if [ $$status -ne 0 ]; then echo "make test: FAILED (see the failures above)"; fi; \
	exit $$status

test-package: $(STAMP) browser vendor
	OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE $(BIN)/python -m pytest tests -m "not gpu" \
		-n $(WORKERS) --dist loadgroup --durations=10 -o addopts="--nbval-cell-timeout=600 -p no:cacheprovider"

test-colab: $(STAMP)
	$(BIN)/python tools/colab_like.py $(if $(COLAB_PYTHON),--python $(COLAB_PYTHON)) --workers $(WORKERS) $(if $(ZH_CHAPTERS),--zh $(ZH_CHAPTERS))

test-current: $(STAMP) browser vendor
	$(BIN)/python tools/current_releases.py --python $(PYTHON) --workers $(WORKERS)

# The oldest releases (not part of `make test`; run it before changing pyproject.toml's bounds or what the code needs
# of torch): tools/floors.py makes .floors-venv with the oldest Python (requires-python) and the OLDEST release
# of every dependency pyproject.toml declares (each `>=` bound: torch, numpy, tokenizers, tqdm, matplotlib,
# ipywidgets), then runs the package tests and every chapter natively under nbval, then transformers and
# huggingface_hub at their floors ([hf], [hub]) with the tests that use them. Its old torch is a CUDA build
# of some GB from the registry (pip caches it). CONTRIBUTING.md ("The oldest releases") has the last run.
test-floors: $(STAMP) browser vendor
	$(BIN)/python tools/floors.py --workers $(WORKERS)

# The GPU path (nothing in `make test` needs it): every chapter executed on CUDA (outputs not
# compared: the stored ones are CPU outputs), training with bf16 autocast and its tolerances, and
# DDP over nccl with 2+ GPUs (tests/test_gpu.py). Without CUDA every test is skipped.
test-gpu: $(STAMP)
	$(BIN)/python -m pytest tests -m gpu -o addopts="-p no:cacheprovider" -rs

# The prepared device check (issue 36). Here, with a network: `make gpu-wheels` puts into .gpu/ (ignored)
# the wheels a bare GPU image lacks, transformers 4.57.6 for the second pass, and upstream d65ef2c's model
# file. On the GPU machine (no network, no .venv: its python3), from the repository root with .gpu/ beside
# it: `make gpu-check` runs tools/gpu_check.sh (under 8 minutes on one H100-class GPU) and writes
# gpu_check.log and gpu_record.json into GPU_OUT. Without CUDA it is a dry run (everything skips or runs
# tiny on the CPU, and the record says so). A record from a GPU goes to
# minimind_ref/reference_outputs/gpu_record.json; `python -m benchmarks.gpu_check report` then renders the
# Performance page's GPU table from it.
GPU_PYTHON = $(if $(wildcard $(BIN)/python),$(BIN)/python,python3)
GPU_OUT ?= $(if $(OUT),$(OUT),_build/gpu_check)
gpu-wheels:
	PYTHON=$(GPU_PYTHON) tools/gpu_wheels.sh
gpu-check:
	PYTHON=$(GPU_PYTHON) tools/gpu_check.sh $(GPU_OUT)

# Package tests only (no notebooks, no book): the quick loop while editing minimind_ref.
test-fast: $(STAMP)
	$(BIN)/python -m pytest tests -m "not slow" -o addopts=""

student: $(STAMP)
	$(BIN)/python tools/make_student.py

# After editing English text: new messages enter the catalogs (a changed one keeps its old
# translation, marked fuzzy and not used until reviewed); then the coverage per chapter.
i18n: $(STAMP)
	$(BIN)/python tools/i18n.py extract
	$(BIN)/python tools/i18n.py coverage

# Re-execute one notebook in place (stored outputs are what nbval compares against).
execute: $(STAMP)
	$(BIN)/python tools/execute_notebook.py $(NB)

# Time "Restart & Run All" of every chapter (or NB=...) on this machine and write
# book/notebook_timings.md, the table the welcome, setup and README pages quote. Run it on an idle machine.
timings: $(STAMP)
	$(BIN)/python tools/time_notebooks.py $(NB)

# The website. Executes every notebook whose code changed since the last build (the cache is in
# _build/.jupyter_cache), warnings are errors. The test build renders the stored outputs instead.
# Then the Chinese edition into _build/html/zh (tools/build_zh.py: sources translated from
# locales/zh_CN, the stored outputs, nothing executed).
book: $(STAMP) vendor
	$(BIN)/jupyter-book build . -W -n --keep-going
	$(BIN)/python tools/build_zh.py

# Build, then push _build/html to the gh-pages branch of origin (what .github/workflows/publish.yml
# does on GitHub through Pages' own deployment).
publish: book
	$(BIN)/ghp-import -n -p -f _build/html

# MathJax 3, RequireJS and the ipywidgets embed manager from the npm registry into _vendor/
# (gitignored; served by the site, no CDN at view time). A no-op when _vendor/ is current.
vendor: $(STAMP)
	@command -v npm >/dev/null || { $(APT_GET) update && $(APT_GET) install -y npm; }
	$(BIN)/python tools/vendor_assets.py

# Headless Chromium for the browser test: Debian's package (apt-get needs root); and a font with
# Chinese glyphs, so the Chinese page renders text, not empty boxes (fonts-wqy-zenhei, about 10 MB).
browser:
	@test -x $(CHROMIUM) || { $(APT_GET) update && $(APT_GET) install -y chromium; }
	@fc-list :lang=zh 2>/dev/null | grep -q . || { $(APT_GET) install -y --no-install-recommends fonts-wqy-zenhei \
		|| { $(APT_GET) update && $(APT_GET) install -y --no-install-recommends fonts-wqy-zenhei; }; }

clean:
	rm -rf _build .pytest_cache _vendor .colab-venv .current-venv .floors-venv

# The stage report (book/performance.md includes it): mean and range over the seeds and float paths of
# every stage's held-out evaluation, from the record the seeded rebuild wrote
# (minimind_ref/checkpoints/stage_seeds.json; `$(BIN)/python -m minimind_ref.stages rebuild --seeds
# 0,1,2,3,4 --paths native,default --jobs 2` re-trains every post-training stage with five seeds on the
# CPU's own kernels and under ATEN_CPU_CAPABILITY=default, two lineages at a time, one thread each; the
# time it took is in the record; not part of make test). tests/test_stage_report.py checks the
# committed table and figure against that record.
report: $(STAMP)
	$(BIN)/python -m minimind_ref.stages report --out benchmarks/results/stage_report.md \
		--figure benchmarks/results/figures/stage_report.png

# Benchmarks (not part of `make test`): writes benchmarks/results/{results.json,performance_table.md}.
bench: $(STAMP)
	$(BIN)/python -m benchmarks.run $(BENCH_ARGS)
