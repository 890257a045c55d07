"""The chapter contract of CONTRIBUTING.md, checked on every notebook in notebooks/.

nbval (``pytest --nbval``, configured in pyproject.toml) re-runs each notebook and compares the
outputs with the stored ones; it passes trivially on cells that were never executed. These tests
make sure there is something to compare: every code cell executed, in order, with outputs, and
the structure a chapter promises (the Colab cell, exercises with checks, a widget, the closing
sections).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import make_student  # noqa: E402
import prose_numbers  # noqa: E402

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))

# A cell tagged nbval-ignore-output (or marked "# NBVAL_IGNORE_OUTPUT") must say why in a comment
# line containing one of these words (see CONTRIBUTING.md): "# timings vary from run to run",
# "# the device name varies by machine", "# the figure lives in a widget, which nbval sees differently".
REASON_WORDS = ("vary", "varies", "varying", "variable", "differ", "differs", "differently", "timing", "timings",
                "device", "hardware", "machine", "platform", "address", "widget", "nondeterministic")
IGNORE_REASON = re.compile(r"#.*\b(" + "|".join(REASON_WORDS) + r")\b", re.I)
CHECK_CALL = re.compile(r"\bcheck_\w+\s*\(")
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def colab_cell() -> str:
    """The Colab cell as tools/sync_colab_cells.py writes it from _config.yml's repository.url."""
    import sync_colab_cells

    return sync_colab_cells.colab_cell()


def code_cells(nb):
    return [cell for cell in nb.cells if cell.cell_type == "code"]


def tags(cell) -> list:
    return list(cell.get("metadata", {}).get("tags", []))


@pytest.fixture(params=NOTEBOOKS, ids=lambda p: p.name)
def nb(request):
    return nbformat.read(request.param, as_version=4)


def test_there_are_chapters():
    assert NOTEBOOKS, "notebooks/ holds no chapter notebook"


def test_executed_in_order_with_outputs(nb):
    cells = code_cells(nb)
    empty = [i for i, cell in enumerate(nb.cells) if cell.cell_type == "code" and not cell.source.strip()]
    assert not empty, f"empty code cells at {empty}: delete them"
    counts = [cell.execution_count for cell in cells]
    assert None not in counts, (
        f"{counts.count(None)} of {len(cells)} code cells were never executed (strict nbval compares nothing there): "
        "run `make execute NB=notebooks/<name>.ipynb`")
    assert counts == list(range(1, len(cells) + 1)), (
        f"execution counts are {counts}, expected 1..{len(cells)} in order: re-execute the whole notebook with make execute")
    assert sum(len(cell.outputs) for cell in cells) > 0, "no code cell has an output"


def test_outputs_hold_figures_and_no_errors(nb):
    outputs = [out for cell in code_cells(nb) for out in cell.outputs]
    assert any("image/png" in out.get("data", {}) for out in outputs), (
        "no figure in the stored outputs (the chapter needs a matplotlib figure; does the setup cell "
        "start with %matplotlib inline? then re-execute with make execute)")
    agg = [out for out in outputs if "non-interactive, and thus cannot be shown" in str(out.get("text", ""))]
    assert not agg, ("a figure was not displayed (a non-inline backend in the kernel): start the setup cell "
                     "with %matplotlib inline and re-execute with make execute")
    errors = [(i, out.get("ename")) for i, cell in enumerate(nb.cells) if cell.cell_type == "code"
              and "raises-exception" not in tags(cell) for out in cell.outputs if out.output_type == "error"]
    assert not errors, f"stored error outputs (cell index, exception): {errors}"


#: What a stored output must not show: the machine it ran on (absolute paths of a home, a worktree,
#: a temporary or installation folder), which a warning or a traceback prints with its file name.
MACHINE_PATH = re.compile(r"(?<![\w.])(/(?:home|Users|root|work|tmp|private|var/folders|opt|usr|mnt)/[\w.-]+"
                          r"|[A-Za-z]:\\[\w.-]+|site-packages|dist-packages)")


def test_stored_outputs_show_no_machine_paths(nb):
    """Published outputs show no path of the machine that executed them (issue 34: a warning printed
    the full path of a worktree). Print a warning's message, not its location."""
    found = []
    for index, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []) if cell.cell_type == "code" else []:
            texts = [str(out.get("text", ""))] + [str(v) for k, v in out.get("data", {}).items() if k.startswith("text/")]
            found += [f"cell {index}: {m.group(0)!r}" for text in texts for m in MACHINE_PATH.finditer(text)]
    assert not found, "stored outputs show machine paths: " + "; ".join(found[:5])


def test_first_code_cell_is_the_colab_cell(nb):
    import sync_colab_cells

    first = code_cells(nb)[0]
    assert first.source.strip() == colab_cell(), (
        f"the first code cell must be the Colab cell that tools/sync_colab_cells.py writes (run it), got:\n{first.source}")
    assert tags(first) == [sync_colab_cells.TAG], (
        f"the Colab cell must carry exactly the tag {sync_colab_cells.TAG!r} (the website hides it; run "
        f"tools/sync_colab_cells.py), it has {tags(first)}")
    assert not first.outputs, "the Colab cell does nothing outside Colab: it has no output"


def test_setup_cell_starts_with_matplotlib_inline(nb):
    """The cell after the Colab cell sets the backend itself: a kernel whose environment says
    MPLBACKEND=Agg (a common headless default, and the Colab-like run of `make test`) would
    otherwise show no figure at all, silently."""
    setup = code_cells(nb)[1].source.lstrip()
    first = setup.splitlines()[0].strip() if setup else ""
    assert first == "%matplotlib inline", (
        "the setup cell (the first code cell after the Colab cell) must start with the line "
        f"`%matplotlib inline`; its first line is {first!r}")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_prose_numbers_are_printed_above_them(path):
    """Numbers with a decimal point or a percent sign in markdown come from an output above them
    in the same section, formatted the same way (tools/prose_numbers.py has the exact rule; the
    opt-out for numbers that are not computed here is the HTML comment it names)."""
    findings = prose_numbers.check_notebook(path)
    assert not findings, (
        f"{len(findings)} number(s) in the prose are not printed by a code cell above them in their section. "
        "Print the number in the cell that computes it (same rounding), correct the prose, or, for numbers "
        f"that are not computed in the notebook (a problem's inputs, a published figure), put "
        f"{prose_numbers.OPT_OUT} in the markdown cell and say where they come from:\n"
        + "\n".join(str(f) for f in findings))


def test_ignored_outputs_say_why(nb):
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        if "nbval-ignore-output" in tags(cell) or "# NBVAL_IGNORE_OUTPUT" in cell.source:
            assert IGNORE_REASON.search(cell.source), (
                f"cell {index} ignores its output in nbval but has no comment saying why "
                f"(a '#' comment containing one of: {', '.join(REASON_WORDS)}):\n{cell.source[:300]}")


def test_exercises_are_hidden_and_checked(nb):
    solutions = [i for i, cell in enumerate(nb.cells) if cell.cell_type == "code" and make_student.has_solution(cell.source)]
    assert len(solutions) >= 3, f"{len(solutions)} exercises (cells with '# BEGIN SOLUTION'); a chapter needs at least 3"
    for index in solutions:
        cell = nb.cells[index]
        assert "hide-input" in tags(cell), f"exercise cell {index} lacks the hide-input tag (the site folds solutions)"
        make_student.stub_source(cell.source, "Exercise", "", where=f"cell {index}")  # markers balanced
        headings = [c for c in nb.cells[:index] if c.cell_type == "markdown" and make_student.EXERCISE_HEADING.search(c.source)]
        assert headings, f"exercise cell {index} has no '### Exercise N.M — title' heading above it"
        assert index + 1 < len(nb.cells), f"exercise cell {index} is the last cell: a check cell must follow it"
        after = nb.cells[index + 1]
        assert after.cell_type == "code" and CHECK_CALL.search(after.source) and not make_student.has_solution(after.source), (
            f"the cell after exercise cell {index} must call a check from minimind_ref.checks "
            f"(e.g. ch01.check_rms_norm(rms_norm)), got:\n{after.source[:300]}")


def test_has_a_widget(nb):
    uses = [cell for cell in code_cells(nb) if "ipywidgets" in cell.source or "widgets." in cell.source or "interact(" in cell.source]
    assert uses, "no ipywidgets control in the notebook"
    views = [out for cell in code_cells(nb) for out in cell.outputs if WIDGET_VIEW in out.get("data", {})]
    assert views, "no stored widget output: the site can only show a widget the notebook displayed when executed"
    assert "application/vnd.jupyter.widget-state+json" in nb.metadata.get("widgets", {}), (
        "no widget state saved in the notebook metadata (execute with make execute, which stores it)")
    state = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"].get("state", {})
    orphans = [out["data"][WIDGET_VIEW]["model_id"] for out in views if out["data"][WIDGET_VIEW]["model_id"] not in state]
    assert not orphans, (
        f"widget views {orphans} have no model in the saved widget state: the site shows nothing there (outputs "
        "and metadata from two different executions, e.g. after a merge); re-execute with make execute")


@pytest.mark.parametrize("heading", ["Summary", "Self-check questions"])
def test_closing_sections(nb, heading):
    pattern = re.compile(rf"^##\s+{re.escape(heading)}\s*$", re.M | re.I)
    assert any(cell.cell_type == "markdown" and pattern.search(cell.source) for cell in nb.cells), f"no '## {heading}' heading"


def _exercise_numbers(cells) -> list:
    """(heading number, index of the markdown cell) of every ``### Exercise N.M`` heading, in order."""
    return [(tuple(int(p) for p in m.group("number").split(".")), index)
            for index, cell in enumerate(cells) if cell.cell_type == "markdown"
            for m in make_student.EXERCISE_HEADING.finditer(cell.source)]


def test_exercises_appear_in_numeric_order(nb):
    """A learner meets Exercise N.1, N.2, N.3, ... in that order, numbered from 1 without gaps, in the
    chapter's own number; the check after each solution cell is the one of that exercise (its ``✓``
    line names the same number), so the labels, the checks and the catalogs agree."""
    found = _exercise_numbers(nb.cells)
    numbers = [n for n, _ in found]
    chapter = {n[0] for n in numbers}
    assert len(chapter) == 1, f"exercise headings of several chapters: {sorted(chapter)}"
    assert [n[1] for n in numbers] == list(range(1, len(numbers) + 1)), (
        "the exercises must appear in numeric order, from 1, without gaps; found "
        + ", ".join(f"{a}.{b}" for a, b in numbers))
    solutions = [i for i, cell in enumerate(nb.cells) if cell.cell_type == "code" and make_student.has_solution(cell.source)]
    for index in solutions:
        heading = max((n for n, at in found if at < index), key=lambda n: n[1])
        printed = "".join(out.get("text", "") for out in nb.cells[index + 1].get("outputs", [])
                          if out.get("output_type") == "stream")
        label = f"✓ Exercise {heading[0]}.{heading[1]} "
        assert label in printed, (f"the check after exercise cell {index} (under the heading of Exercise "
                                  f"{heading[0]}.{heading[1]}) printed {printed.strip()!r}, not a line starting {label!r}")


def test_every_exercise_has_a_worked_solution_to_ask_for(nb, capsys):
    """Each exercise of the chapter has a solution registered by its checks module, which
    ``minimind_ref.checks.show_solution("N.M")`` prints (a failing check says so in its last line)."""
    from minimind_ref.checks import show_solution

    for (chapter, number), _ in _exercise_numbers(nb.cells):
        show_solution(f"{chapter}.{number}")
        out = capsys.readouterr().out
        assert out.startswith(f"Exercise {chapter}.{number}, one way to write it:\n    ") and len(out) > 40, out


#: Chapters whose exercises follow issue 44's pattern (every exercise says what the learner decides).
#: The other chapters join the set as their exercises are reworked.
DECIDE_CHAPTERS = tuple(f"{n:02d}" for n in range(1, 13))
YOU_DECIDE = re.compile(r"^\*\*You decide:\*\* \S", re.M)


@pytest.mark.parametrize("chapter", DECIDE_CHAPTERS)
def test_every_exercise_says_what_the_learner_decides(chapter):
    """Under every ``### Exercise N.M`` heading, before its solution cell, one paragraph starts with
    ``**You decide:**`` and says what the learner derives, decides, predicts or debugs (issue 44); the
    Chinese edition translates it (``**由你决定**：``)."""
    import i18n

    path = next(p for p in NOTEBOOKS if p.name.startswith(chapter))
    nb = nbformat.read(path, as_version=4)
    found = _exercise_numbers(nb.cells)
    table = i18n.load_table("zh_CN", path.stem)
    for position, (number, start) in enumerate(found):
        end = found[position + 1][1] if position + 1 < len(found) else len(nb.cells)
        solution = next(i for i in range(start, end) if nb.cells[i].cell_type == "code"
                        and make_student.has_solution(nb.cells[i].source))
        lines = [m for cell in nb.cells[start:solution] if cell.cell_type == "markdown"
                 for m in re.findall(r"^\*\*You decide:\*\*.*(?:\n(?!\n).*)*", cell.source, re.M)]
        assert len(lines) == 1, f"Exercise {number[0]}.{number[1]}: {len(lines)} '**You decide:**' paragraphs"
        assert YOU_DECIDE.match(lines[0])
        assert table.get(lines[0], "").startswith("**由你决定**："), (
            f"Exercise {number[0]}.{number[1]}: the '**You decide:**' paragraph has no Chinese translation "
            "starting with '**由你决定**：'")
