"""pytest plugin for the Colab-like run: every exercise check fails on its student stub, proven in
the same kernel that nbval runs the chapter in (so each chapter executes once, not twice).

``tools/colab_like.py`` copies this file as ``conftest.py`` beside the folder of copied chapters,
and stores in each copied exercise cell (``metadata.minimind_stub``) the stub that
``tools/make_student.py`` writes for the student edition and the source of the check cell after it.
For each such cell this plugin inserts one test right **before** the exercise cell's own nbval
item, ``NN_topic.ipynb::Cell K stub``, which does what a learner does before solving the exercise:

1. saves the random number generators' state (Python, NumPy, torch) in the kernel;
2. runs the stub; if it raises at once (a top-level stub), that error must be
   ``NotImplementedError``, ``AssertionError`` or an ``ExerciseError``;
3. otherwise runs the check cell, which must raise one of those: a check that passes on the stub
   cannot tell a solved exercise from an unsolved one;
4. restores the generators, so the solution cell that nbval runs next, and every later output,
   are exactly what they would be without this test.

A failure names the notebook, the exercise's code cell (nbval's numbering: code cells from 0) and
what happened.
"""

from __future__ import annotations

from queue import Empty
from typing import Optional, Tuple

import pytest

STUB_ERRORS = {"AssertionError", "ExerciseError", "NotImplementedError"}
KEY = "minimind_stub"

SAVE_RNG = """\
import random as __mm_random
__mm_rng = {"random": __mm_random.getstate()}
try:
    import numpy as __mm_np
    __mm_rng["numpy"] = __mm_np.random.get_state()
except ImportError:
    pass
try:
    import torch as __mm_torch
    __mm_rng["torch"] = __mm_torch.get_rng_state()
    if __mm_torch.cuda.is_available():
        __mm_rng["cuda"] = __mm_torch.cuda.get_rng_state_all()
except ImportError:
    pass
"""
RESTORE_RNG = """\
__mm_random.setstate(__mm_rng["random"])
if "numpy" in __mm_rng:
    __mm_np.random.set_state(__mm_rng["numpy"])
if "torch" in __mm_rng:
    __mm_torch.set_rng_state(__mm_rng["torch"])
if "cuda" in __mm_rng:
    __mm_torch.cuda.set_rng_state_all(__mm_rng["cuda"])
del __mm_rng
"""


class StubCheck(pytest.Item):
    """The check of one exercise fails on the exercise's stub."""

    def __init__(self, *, cell_num: int, stub: str, check: str, timeout: float, **kwargs) -> None:
        super().__init__(**kwargs)
        self.cell_num = cell_num
        self.stub = stub
        self.check = check
        self.timeout = timeout

    def _execute(self, source: str) -> Tuple[Optional[str], str]:
        """Run ``source`` in the notebook's kernel; return (exception name or None, its message)."""
        file_node = self.parent
        kernel = file_node.kernel
        if not kernel.is_alive():
            raise RuntimeError("the kernel died before the stub check")
        msg_id = kernel.execute_cell_input(source, allow_stdin=False)
        try:
            kernel.await_reply(msg_id, timeout=self.timeout)
        except Empty:
            kernel.interrupt()
            raise AssertionError(f"code cell {self.cell_num}: the stub check timed out after {self.timeout:.0f} s")
        error: Tuple[Optional[str], str] = (None, "")
        while True:
            msg = file_node.get_kernel_message(timeout=30)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "error":
                error = (msg["content"]["ename"], msg["content"]["evalue"])
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                return error

    def runtest(self) -> None:
        name = self.parent.name
        saved = self._execute(SAVE_RNG)
        assert saved[0] is None, f"{name}: saving the random state failed: {saved}"
        try:
            error, message = self._execute(self.stub)
            ran = "the stub"
            if error is None:  # the stub only defines something: the check must notice
                error, message = self._execute(self.check)
                ran = "the check cell after it"
                assert error is not None, (
                    f"{name}, exercise in code cell {self.cell_num}: its check passed on the student stub "
                    f"(a check that passes unsolved cannot tell a solved exercise from an unsolved one)")
            assert error in STUB_ERRORS, (
                f"{name}, exercise in code cell {self.cell_num}: on the student stub, {ran} raised "
                f"{error}: {message[:300]}; expected one of {sorted(STUB_ERRORS)} (a check reports an "
                "unsolved exercise as such, it does not crash)")
        finally:
            restored = self._execute(RESTORE_RNG)
            assert restored[0] is None, f"{name}: restoring the random state failed: {restored}"

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, AssertionError):
            return str(excinfo.value)
        return super().repr_failure(excinfo)

    def reportinfo(self):
        return self.path, 0, f"{self.parent.name}::Cell {self.cell_num} stub"


HINTS = {
    "Missing output fields": "An output is missing: with MPLBACKEND=Agg a figure shows only if the chapter's setup "
                             "cell starts with %matplotlib inline.",
    "Cell outputs differ": "The output differs under these kernel settings (ATEN_CPU_CAPABILITY=default, "
                           "OMP_NUM_THREADS=1): if it is float noise, print a bound the cell asserts, or round to "
                           "what is stable (CONTRIBUTING.md, 'Same output on every machine').",
}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed and call.when == "call" and not isinstance(item, StubCheck):
        text = str(report.longrepr)
        for needle, hint in HINTS.items():
            if needle in text:
                report.sections.append(("hint", hint))


def pytest_collection_modifyitems(session, config, items):
    timeout = float(config.getoption("nbval_cell_timeout", 2000) or 2000)
    out = []
    for item in items:
        cell = getattr(item, "cell", None)
        meta = cell.get("metadata", {}).get(KEY) if cell is not None else None
        if meta:
            out.append(StubCheck.from_parent(item.parent, name=f"{item.name} stub", cell_num=item.cell_num,
                                             stub=meta["stub"], check=meta["check"], timeout=timeout))
        out.append(item)
    items[:] = out
