"""Shared set-up for the test suite.

* **Leave nothing behind.** The controlling pytest process (the only one without pytest-xdist)
  points ``TMPDIR`` at a private empty folder before any worker, kernel or subprocess starts, so
  everything they create with ``tempfile`` lands there. When the session ends it fails the run if
  any ``minimind_*`` entry is left in that folder (chapter 08's ``minimind_ch08_*`` run folder, a
  test's scratch directory), naming each one, and then removes the folder (``tools/tempdir_guard.py``).
* **Slow tests first.** Tests marked ``slow`` (notebook kernels, the book build, subprocesses) are
  moved to the front, keeping their order, so under ``pytest -n 2`` (``make test``) the long ones
  start early instead of leaving one worker busy at the end. Tests that share a module fixture
  that must not run twice at once (the built site) carry ``xdist_group`` marks and run with
  ``--dist loadgroup`` in one worker.
* **No backend for matplotlib here.** Kernels started by the tests inherit this environment as it
  is: each chapter's setup cell says ``%matplotlib inline`` itself (tests/test_notebooks.py checks
  it, and the Colab-like run of ``tools/colab_like.py`` runs the notebooks with ``MPLBACKEND=Agg``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

import tempdir_guard  # noqa: E402

# debugpy inside ipykernel warns on stderr about frozen modules on Python 3.11+; a kernel's stderr
# is part of what nbval compares.
os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")

_TMP_KEY = pytest.StashKey[Path]()
_LEFT_KEY = pytest.StashKey[list]()


def _is_controller(config) -> bool:
    return not hasattr(config, "workerinput")


def pytest_configure(config):
    if _is_controller(config) and os.environ.get(tempdir_guard.ENV) is None:
        folder = tempdir_guard.make_private_tempdir("pytest-private-tmp")
        tempdir_guard.use_tempdir(folder)
        config.stash[_TMP_KEY] = folder


def pytest_collection_modifyitems(config, items):
    items[:] = [item for item in items if item.get_closest_marker("slow")] + [
        item for item in items if not item.get_closest_marker("slow")]


def pytest_sessionfinish(session, exitstatus):
    folder = session.config.stash.get(_TMP_KEY, None)
    if folder is None:
        return
    names = tempdir_guard.leftovers(folder)
    session.config.stash[_LEFT_KEY] = names
    tempdir_guard.remove(folder)
    if names and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    names = config.stash.get(_LEFT_KEY, [])
    if names:
        terminalreporter.section("temporary files left behind", red=True)
        terminalreporter.write_line(tempdir_guard.leftover_message(names, "this test session"), red=True)


@pytest.fixture(autouse=True)
def _check_failures_never_show_the_answer(request, monkeypatch):
    """In the tests of the exercise checks, every failure a check raises is inspected as it is
    raised (``tests/_helpers.answer_shown``): it must not contain the exercise's worked solution nor a
    piece of its code (an operator with its operands, a call, a keyword argument, a subscript, as
    derived from the registered solution), nor, for an exercise that hides the reference's values
    (``expected_values(..., shown=False)``), the value the failing comparison expected; and it must end
    with the line that says how to ask for the solution. So every planted mistake of every chapter's
    tests also proves that the message does not give the answer away."""
    if not request.module.__name__.split(".")[-1].startswith(("test_checks", "test_i18n_checks")):
        yield
        return
    from _helpers import answer_shown
    from minimind_ref.checks import core

    original = core._fail
    seen = []

    def inspected(name, what, hint):
        expected = list(core._last_expected)
        try:
            original(name, what, hint)
        except core.ExerciseError as err:
            seen.extend(answer_shown(str(err), expected))
            raise

    monkeypatch.setattr(core, "_fail", inspected)
    yield
    assert not seen, "a check's failure gives the answer away:\n" + "\n".join(seen)
