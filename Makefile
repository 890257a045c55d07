# MiniMind from Zero: every target creates or reuses .venv and installs what it needs.
#   make test     - set up, then run every test (package, checks, student editions, nbval, book, browser)
#   make book     - set up, then execute the notebooks and build the site into _build/html
SHELL := /bin/bash
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip
STAMP  := $(VENV)/.installed
export PIP_DISABLE_PIP_VERSION_CHECK := 1
export MPLBACKEND := Agg
export PYDEVD_DISABLE_FILE_VALIDATION := 1

.PHONY: venv test test-fast book student execute clean help

help:
	@echo "make test | make book | make student | make execute NB=notebooks/01_normalization.ipynb | make clean"

# torch==2.13.0 goes in first and the constraints file holds it there for everything after.
$(STAMP): pyproject.toml requirements/dev.txt requirements/constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q "torch==2.13.0"
	$(PIP) install -q -c requirements/constraints.txt -r requirements/dev.txt
	$(PIP) install -q -c requirements/constraints.txt --no-deps -e .
	$(BIN)/python -c "import torch, minimind_ref; assert torch.__version__.startswith('2.13.0'), torch.__version__"
	touch $@

venv: $(STAMP)

test: $(STAMP)
	$(BIN)/python -m pytest

# Package tests only (no notebooks, no book): the quick loop while editing minimind_ref.
test-fast: $(STAMP)
	$(BIN)/python -m pytest tests -m "not slow" -o addopts=""

student: $(STAMP)
	$(BIN)/python tools/make_student.py

# Re-execute one notebook in place (stored outputs are what nbval compares against).
execute: $(STAMP)
	$(BIN)/python tools/execute_notebook.py $(NB)

clean:
	rm -rf _build .pytest_cache
