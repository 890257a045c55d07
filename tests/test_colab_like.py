"""tools/colab_like.py and its nbval plugin tools/nbval_stubs.py (the Colab-like run of `make test`).

The run itself is `make test-colab`; these tests check its parts: the wheel must hold every file of
the package, the chapter copies carry their student stubs, and the plugin fails an exercise whose
check passes on the stub, while leaving the random state (hence later outputs) as it was.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import colab_like  # noqa: E402
import make_student  # noqa: E402
import nbval_stubs  # noqa: E402

NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def test_package_files_are_what_the_wheel_must_hold():
    files = colab_like.package_files()
    assert "minimind_ref/__init__.py" in files and "minimind_ref/checks/core.py" in files
    assert not [f for f in files if "__pycache__" in f or f.endswith(".pyc")]


def test_a_wheel_without_a_package_file_is_reported(tmp_path):
    wheel = tmp_path / "minimind_ref-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("minimind_ref/__init__.py", "")
    assert colab_like.missing_from_wheel(wheel, ["minimind_ref/__init__.py", "minimind_ref/data/ckpt.pt"]) == [
        "minimind_ref/data/ckpt.pt"]


def test_chapter_selection():
    assert colab_like.select([]) == NOTEBOOKS
    assert colab_like.select(["01"]) == [NOTEBOOKS[0]]
    assert colab_like.select([f"notebooks/{NOTEBOOKS[0].name}"]) == [NOTEBOOKS[0]]
    with pytest.raises(colab_like.ColabLikeError, match="no chapter notebook matches"):
        colab_like.select(["99_nothing"])


def test_kernel_settings_differ_from_the_stored_ones():
    env = colab_like.clean_env(Path("/tmp/x"))
    assert env["ATEN_CPU_CAPABILITY"] == "default" and env["OMP_NUM_THREADS"] == "1" and env["MPLBACKEND"] == "Agg"
    assert env["TMPDIR"] == "/tmp/x" and "PYTHONPATH" not in env


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_copies_carry_the_student_stubs(path, tmp_path):
    n = colab_like.copy_with_stubs(path, tmp_path / path.name)
    copy = nbformat.read(tmp_path / path.name, as_version=4)
    marked = [c for c in copy.cells if "minimind_stub" in c.metadata]
    solutions = [c for c in copy.cells if c.cell_type == "code" and make_student.has_solution(c.source)]
    assert n == len(marked) == len(solutions) >= 3
    for cell in marked:
        assert 'NotImplementedError("Exercise ' in cell.metadata["minimind_stub"]["stub"]
        assert re.search(r"\bcheck_\w+\s*\(", cell.metadata["minimind_stub"]["check"])


@pytest.mark.parametrize("path", NOTEBOOKS[:2], ids=lambda p: p.name)
def test_chinese_copies_carry_the_chinese_stubs(path, tmp_path):
    """``--zh``: the chapter as tools/i18n.py translates it, with student/zh/'s stubs."""
    import i18n

    n = colab_like.copy_with_stubs(path, tmp_path / colab_like.translated_name(path), lang="zh_CN")
    copy = nbformat.read(tmp_path / colab_like.translated_name(path), as_version=4)
    marked = [c for c in copy.cells if "minimind_stub" in c.metadata]
    assert n == len(marked) >= 3
    assert all('raise NotImplementedError("练习 ' in c.metadata["minimind_stub"]["stub"] for c in marked)
    assert i18n.LANGUAGE_LINE["zh_CN"] in "".join(c.source for c in copy.cells if c.cell_type == "code")
    assert colab_like.translated_name(path) == f"zh_{path.name}"


# --- the plugin, on synthetic notebooks in this environment's kernel ------------------------

SEEDED = "import torch\n_ = torch.manual_seed(0)"
RANDOM_PRINT = "print(f'{torch.rand(1).item():.6f}')"


def chapter(check: str, draws: int = 0) -> nbformat.NotebookNode:
    """A seeded chapter with one exercise whose check draws ``draws`` random numbers, then a random print."""
    import torch

    torch.manual_seed(0)
    torch.rand(draws)  # what the check cell draws in an ordinary run
    expected = f"{torch.rand(1).item():.6f}\n"
    exercise = new_code_cell("def f(x):\n    # BEGIN SOLUTION\n    return x + 1\n    # END SOLUTION")
    stub = make_student.student_notebook(new_notebook(cells=[exercise]), chapter="1").cells[0].source
    exercise.metadata["minimind_stub"] = {"stub": stub, "check": check}
    nb = new_notebook(cells=[
        new_code_cell(SEEDED), new_markdown_cell("## Exercises\n\n### Exercise 1.1 — f"), exercise,
        new_code_cell(check, outputs=[new_output("stream", name="stdout", text="ok\n")]),
        new_code_cell(RANDOM_PRINT, outputs=[new_output("stream", name="stdout", text=expected)]),
    ], metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})
    for count, cell in enumerate((c for c in nb.cells if c.cell_type == "code"), 1):
        cell.execution_count = count  # executed, so nbval compares the stored outputs
    return nb


@pytest.mark.slow
def test_stub_plugin_fails_a_check_that_passes_on_the_stub(tmp_path):
    chapters = tmp_path / "chapters"
    chapters.mkdir()
    # a good check: calls f, so the stub's NotImplementedError reaches it; it also draws random numbers
    nbformat.write(chapter("_ = torch.rand(7)\nassert f(1) == 2\nprint('ok')", draws=7), chapters / "01_good.ipynb")
    # a useless check: passes whatever f does
    nbformat.write(chapter("assert callable(f)\nprint('ok')"), chapters / "02_useless.ipynb")
    (tmp_path / "pytest.ini").write_text("[pytest]\naddopts =\n", encoding="utf-8")
    shutil.copy2(ROOT / "tools" / "nbval_stubs.py", tmp_path / "conftest.py")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-c", "pytest.ini", "--rootdir", str(tmp_path), "-p", "no:xdist",
                           "-p", "no:cacheprovider", "--nbval", "--nbval-current-env", "-rA", "chapters"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert "PASSED chapters/01_good.ipynb::Cell 1 stub" in out, out[-3000:]
    # the random print after the exercise still matches: the plugin restored the generator's state
    assert "PASSED chapters/01_good.ipynb::Cell 3" in out, out[-3000:]
    assert "FAILED chapters/02_useless.ipynb::Cell 1 stub" in out, out[-3000:]
    assert "its check passed on the student stub" in out
    assert proc.returncode == 1 and out.count("FAILED") == 1, out[-3000:]


def test_stub_errors_match_the_checks_contract():
    assert nbval_stubs.STUB_ERRORS == {"AssertionError", "ExerciseError", "NotImplementedError"}


def test_only_a_notebook_whose_kernel_never_started_runs_again(tmp_path):
    """ipykernel 7 sometimes hangs at start-up: that notebook (no cell of it ran) runs once more; a report with
    any other failure re-runs nothing."""
    def report(*cases):
        body = "".join(f'<testcase classname="chapters.{nb}" name="Cell {i}">{inner}</testcase>' for i, (nb, inner) in enumerate(cases))
        path = tmp_path / "junit.xml"
        path.write_text(f'<?xml version="1.0"?><testsuites><testsuite>{body}</testsuite></testsuites>', encoding="utf-8")
        return path

    hang = '<error message="failed on setup with &quot;RuntimeError: Kernel didn\'t respond in 120 seconds&quot;">x</error>'
    died = '<error message="failed on setup">RuntimeError: Kernel died before replying to kernel_info</error>'
    wrong = '<failure message="Notebook cell execution failed">AssertionError</failure>'
    assert colab_like.kernel_never_started(report(("11_dpo.ipynb", hang), ("11_dpo.ipynb", died), ("02_rope.ipynb", "")),
                                           "chapters") == ["11_dpo.ipynb"]
    assert colab_like.kernel_never_started(report(("11_dpo.ipynb", hang), ("02_rope.ipynb", wrong)), "chapters") == []
    assert colab_like.kernel_never_started(report(("02_rope.ipynb", wrong)), "chapters") == []
    assert colab_like.kernel_never_started(tmp_path / "absent.xml", "chapters") == []
