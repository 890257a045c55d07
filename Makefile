# MiniMind from Zero: every target creates or reuses .venv and installs what it needs.
#   make test     - set up, then run every test (package, checks, student editions, nbval, book, browser)
#   make book     - set up, then execute the notebooks and build the site into _build/html
#   make student  - regenerate the student editions (student/) from notebooks/
#   make publish  - make book, then push _build/html to the gh-pages branch (ghp-import)
SHELL := /bin/bash
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip
STAMP  := $(VENV)/.installed
export PIP_DISABLE_PIP_VERSION_CHECK := 1
# Kernels (nbval, `make execute`, the book build) inherit this: the inline backend is what puts
# figures into notebook outputs (with Agg, plt.show() displays nothing). It needs no display.
export MPLBACKEND := module://matplotlib_inline.backend_inline
export PYDEVD_DISABLE_FILE_VALIDATION := 1

CHROMIUM := /usr/bin/chromium
APT_GET  := DEBIAN_FRONTEND=noninteractive apt-get

.PHONY: venv test test-fast book student execute publish vendor browser clean help

help:
	@echo "make test | make book | make student | make publish | make execute NB=notebooks/01_normalization.ipynb | make clean"

# torch==2.13.0 goes in first and the constraints file holds it there for everything after.
$(STAMP): pyproject.toml requirements/dev.txt requirements/constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q "torch==2.13.0"
	$(PIP) install -q -c requirements/constraints.txt -r requirements/dev.txt
	$(PIP) install -q -c requirements/constraints.txt --no-deps -e .
	$(BIN)/python -c "import torch, minimind_ref; assert torch.__version__.startswith('2.13.0'), torch.__version__"
	touch $@

venv: $(STAMP)

# OMP_WAIT_POLICY=PASSIVE: idle OpenMP threads sleep instead of spinning, so the test process, a
# notebook kernel and the DDP workers cannot starve each other on 2 cores (numbers are unchanged;
# single-sequence decoding gets slower, which is why `make bench` does not set it).
test: $(STAMP) browser vendor
	OMP_WAIT_POLICY=PASSIVE $(BIN)/python -m pytest

# Package tests only (no notebooks, no book): the quick loop while editing minimind_ref.
test-fast: $(STAMP)
	$(BIN)/python -m pytest tests -m "not slow" -o addopts=""

student: $(STAMP)
	$(BIN)/python tools/make_student.py

# Re-execute one notebook in place (stored outputs are what nbval compares against).
execute: $(STAMP)
	$(BIN)/python tools/execute_notebook.py $(NB)

# The website. Executes every notebook whose code changed since the last build (the cache is in
# _build/.jupyter_cache), warnings are errors. The test build renders the stored outputs instead.
book: $(STAMP) vendor
	$(BIN)/jupyter-book build . -W -n --keep-going

# Build, then push _build/html to the gh-pages branch of origin (what .github/workflows/publish.yml
# does on GitHub through Pages' own deployment).
publish: book
	$(BIN)/ghp-import -n -p -f _build/html

# MathJax 3, RequireJS and the ipywidgets embed manager from the npm registry into _vendor/
# (gitignored; served by the site, no CDN at view time). A no-op when _vendor/ is current.
vendor: $(STAMP)
	@command -v npm >/dev/null || { $(APT_GET) update && $(APT_GET) install -y npm; }
	$(BIN)/python tools/vendor_assets.py

# Headless Chromium for the browser test: Debian's package (apt-get needs root).
browser:
	@test -x $(CHROMIUM) || { $(APT_GET) update && $(APT_GET) install -y chromium; }

clean:
	rm -rf _build .pytest_cache _vendor

# Benchmarks (not part of `make test`): writes benchmarks/results/{results.json,performance_table.md}.
bench: $(STAMP)
	$(BIN)/python -m benchmarks.run $(BENCH_ARGS)
