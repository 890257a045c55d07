"""Student editions (student/NN_topic.ipynb, written by `make student` = tools/make_student.py).

* the committed student/ folder equals a fresh rendering of notebooks/ (else: run make student);
* every solution is a stub, every output is gone, everything else is unchanged.

That every check **fails on its stub** is proven in the Colab-like run of ``make test``
(``tools/colab_like.py`` with the plugin ``tools/nbval_stubs.py``): in the kernel where nbval runs
the chapter, right before each exercise cell, the stub of the committed student edition and the
check after it run and must raise (AssertionError / ExerciseError or NotImplementedError). The
chapter executes once for nbval and for the stubs; ``tests/test_colab_like.py`` tests the plugin.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import make_student  # noqa: E402

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


# --- the transformation itself, on a synthetic notebook --------------------------------------

def synthetic() -> nbformat.NotebookNode:
    nb = new_notebook(cells=[
        new_markdown_cell("# 01 · Demo"),
        new_code_cell("print('setup')", execution_count=1, outputs=[nbformat.v4.new_output("stream", text="setup\n")]),
        new_markdown_cell("### Exercise 1.1 — Root mean square\n\nImplement it."),
        new_code_cell("def rms(x):\n    # BEGIN SOLUTION: compute sqrt(mean(x**2))\n    return (x ** 2).mean() ** 0.5\n    # END SOLUTION\n",
                      metadata={"tags": ["hide-input"]}, execution_count=2),
        new_code_cell("check_rms(rms)", execution_count=3),
        new_markdown_cell("### Exercise 1.2 — Two blocks"),
        new_code_cell("class A:\n    def f(self):\n        # BEGIN SOLUTION\n        return 1\n        # END SOLUTION\n\n"
                      "    def g(self):\n        # BEGIN SOLUTION\n        return 2\n        # END SOLUTION", execution_count=4),
        new_code_cell("check_a(A)", execution_count=5),
        new_code_cell("# BEGIN SOLUTION\nanswer = 42\n# END SOLUTION", execution_count=6),
    ], metadata={"widgets": {"application/vnd.jupyter.widget-state+json": {}}, "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})
    return nb


def test_stubs_keep_indentation_and_name_the_exercise():
    student = make_student.student_notebook(synthetic(), chapter="01")
    assert student.cells[3].source == 'def rms(x):\n    raise NotImplementedError("Exercise 1.1: compute sqrt(mean(x**2))")\n'
    assert student.cells[6].source == (
        'class A:\n    def f(self):\n        raise NotImplementedError("Exercise 1.2: Two blocks")\n\n'
        '    def g(self):\n        raise NotImplementedError("Exercise 1.2: Two blocks")')
    # no heading: numbered by its position among the chapter's exercises
    assert student.cells[8].source == 'raise NotImplementedError("Exercise 1.3")'
    compile(student.cells[6].source, "stub", "exec")


def test_outputs_and_run_state_are_stripped_but_the_rest_is_kept():
    original = synthetic()
    student = make_student.student_notebook(original, chapter="01")
    assert all(not c.outputs and c.execution_count is None for c in student.cells if c.cell_type == "code")
    assert "widgets" not in student.metadata and student.metadata["kernelspec"]["name"] == "python3"
    assert [c.source for c in student.cells if c.cell_type == "markdown"] == [c.source for c in original.cells if c.cell_type == "markdown"]
    assert student.cells[3].metadata["tags"] == ["hide-input"]
    assert student.cells[4].source == "check_rms(rms)"
    assert original.cells[1].outputs, "the solution notebook must not be modified"


def test_after_solving_markdown_is_left_out_of_the_student_edition():
    """A markdown cell that explains an exercise's answer (tag ``after-solving``) is in the chapter, not in the
    student edition; only markdown may carry the tag."""
    nb = synthetic()
    reveal = new_markdown_cell("The answer, explained.", metadata={"tags": [make_student.AFTER_SOLVING]})
    nb.cells.insert(5, reveal)
    student = make_student.student_notebook(nb, chapter="01")
    assert "The answer, explained." not in [c.source for c in student.cells]
    assert len(student.cells) == len(nb.cells) - 1
    assert student.cells[3].source.startswith("def rms(x):\n    raise NotImplementedError")
    for bad in (new_code_cell("x = 1", metadata={"tags": [make_student.AFTER_SOLVING]}),
                new_markdown_cell("### Exercise 1.4 — hidden", metadata={"tags": [make_student.AFTER_SOLVING]})):
        nb = synthetic()
        nb.cells.append(bad)
        with pytest.raises(make_student.StudentEditionError, match="after-solving"):
            make_student.student_notebook(nb, chapter="01")


@pytest.mark.parametrize("source", [
    "# BEGIN SOLUTION\nx = 1\n",
    "x = 1\n# END SOLUTION\n",
    "# BEGIN SOLUTION\n# BEGIN SOLUTION\nx = 1\n# END SOLUTION\n",
])
def test_unbalanced_markers_are_errors(source):
    with pytest.raises(make_student.StudentEditionError):
        make_student.stub_source(source, "Exercise 1.1", "")


# --- the committed student/ folder --------------------------------------------------------------

def test_student_editions_are_fresh():
    stale = make_student.stale_files()
    assert not stale, "student/ is stale; run `make student`:\n" + "\n".join(stale)


@pytest.fixture(params=NOTEBOOKS, ids=lambda p: p.name)
def pair(request):
    solution = nbformat.read(request.param, as_version=4)
    student_path = ROOT / "student" / request.param.name
    assert student_path.exists(), f"{student_path.relative_to(ROOT)} is missing; run `make student`"
    return solution, nbformat.read(student_path, as_version=4)


def test_student_edition_has_stubs_and_no_outputs(pair):
    solution, student = pair
    held_back = [c for c in solution.cells if make_student.AFTER_SOLVING in c.metadata.get("tags", [])]
    assert all(c.cell_type == "markdown" for c in held_back)
    shown = [c for c in solution.cells if c not in held_back]
    assert len(student.cells) == len(shown)
    assert not any(make_student.AFTER_SOLVING in c.metadata.get("tags", []) for c in student.cells)
    n_solutions = 0
    for sol, stu in zip(shown, student.cells):
        assert sol.cell_type == stu.cell_type
        if sol.cell_type != "code":
            assert stu.source == sol.source
            continue
        assert not stu.outputs and stu.execution_count is None
        if make_student.has_solution(sol.source):
            n_solutions += 1
            assert "# BEGIN SOLUTION" not in stu.source and "NotImplementedError(\"Exercise " in stu.source
        else:
            assert stu.source == sol.source
    assert n_solutions >= 1


@pytest.mark.parametrize("folder", ["student", "student/zh"])
def test_student_editions_keep_the_colab_cell(folder):
    """The website hides the Colab install cell (tag remove-cell); the student editions, English and Chinese,
    which the site's Colab buttons open, keep it as the chapters have it, tag included."""
    import sync_colab_cells

    expected = sync_colab_cells.colab_cell()
    for path in NOTEBOOKS:
        student = nbformat.read(ROOT / folder / path.name, as_version=4)
        first = next(c for c in student.cells if c.cell_type == "code")
        assert first.source == expected, f"{folder}/{path.name}: the first code cell is not the Colab cell; run `make student`"
        assert sync_colab_cells.TAG in first.metadata.get("tags", []), f"{folder}/{path.name}: the Colab cell lost its tag"


def test_chinese_site_sources_keep_the_colab_cell_hidden():
    """tools/build_zh.py builds the Chinese site from tools/i18n.py's translation of each chapter: the cell is
    there, with the tag that hides it on the page."""
    import i18n
    import sync_colab_cells

    nb = i18n.translated_notebook(NOTEBOOKS[0], "zh_CN")
    first = next(c for c in nb.cells if c.cell_type == "code")
    assert first.source == sync_colab_cells.colab_cell() and sync_colab_cells.TAG in first.metadata.get("tags", [])
