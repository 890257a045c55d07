"""tools/prose_numbers.py: what counts as a number in prose, and what has to print it."""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

import prose_numbers  # noqa: E402


def numbers(markdown: str) -> list:
    return [written for written, _, _ in prose_numbers.numbers_in_prose(markdown)]


@pytest.mark.parametrize("markdown, expected", [
    ("The loss falls to 0.131 after 40 steps.", ["0.131"]),
    ("GQA keeps 25% of the cache and 4.5 % of the FFN.", ["25", "4.5"]),  # the % is not compared
    ("The first layer's gradient is 3.8× the last one's; at most 1.8e-06 apart.", ["3.8", "1.8e-06"]),
    ("A score of −1.72 here.", ["−1.72"]),
    ("It has 25,829,888 parameters in 8 layers.", []),  # integers without % are not checked
])
def test_numbers_that_are_checked(markdown, expected):
    assert numbers(markdown) == expected


@pytest.mark.parametrize("markdown", [
    "Inline math $x = 0.5 \\cdot y$ and $\\ln 512 \\approx 6.24$ are formulas.",
    "Display math:\n$$\\mathrm{lr} \\cdot (0.1 + 0.45 (1 + \\cos \\pi t / T))$$\n",
    "Parenthesised math \\(0.25\\) too.",
    "Code spans like `top_p=0.9` and ``x = 1.5`` are code.",
    "```python\nprint(0.131)\n```\n",
    "<!-- a comment with 0.5 -->",
    "See [the paper](https://arxiv.org/abs/2104.09864v5) and https://example.org/1.2.3.",
    "### Exercise 4.1 — SiLU\n\nExercises 4.1 and 4.2 build on section 3.2 and §2.1.",
    "Tested with Python 3.12, torch 2.13.0 and PyTorch 2.1 or newer.",
    "Version strings such as 1.0.4.post1 are not numbers.",
])
def test_no_false_positives(markdown):
    assert numbers(markdown) == []


def notebook(*cells):
    return new_notebook(cells=list(cells))


def printed_cell(text: str):
    return new_code_cell("print(...)", outputs=[new_output("stream", name="stdout", text=text)])


def findings(nb, tmp_path):
    path = tmp_path / "01_demo.ipynb"
    nbformat.write(nb, path)
    return prose_numbers.check_notebook(path)


def test_a_number_printed_above_in_the_section_passes(tmp_path):
    nb = notebook(new_markdown_cell("## 1. Run"), printed_cell("loss 0.131, GQA 25.0%\n"),
                  new_markdown_cell("The loss is 0.131 and the cache 25.0 % of MHA's."))
    assert findings(nb, tmp_path) == []


def test_different_rounding_is_a_finding(tmp_path):
    nb = notebook(new_markdown_cell("## 1. Run"), printed_cell("loss 0.132\n"),
                  new_markdown_cell("The loss is 0.131."), new_markdown_cell("Or 0.13."))
    found = findings(nb, tmp_path)
    assert [(f.cell, f.number) for f in found] == [(2, "0.131"), (3, "0.13")]
    assert "markdown cell 2: '0.131' is not printed" in str(found[0])


def test_a_number_printed_in_another_section_or_below_is_a_finding(tmp_path):
    nb = notebook(printed_cell("ratio 3.8\n"), new_markdown_cell("## 2. Next\n\nThe ratio was 3.8."),
                  new_markdown_cell("## 3. Later\n\nIt will be 6.44."), printed_cell("loss 6.44\n"))
    found = findings(nb, tmp_path)
    assert [(f.cell, f.number, f.elsewhere) for f in found] == [(1, "3.8", 0), (2, "6.44", 3)]
    assert "printed by cell 3, which is not above it" in str(found[1])


def test_rich_outputs_count_and_the_opt_out_marker_silences(tmp_path):
    shown = new_code_cell("x", outputs=[new_output("execute_result", data={"text/plain": "tensor(0.7530)"},
                                                   execution_count=1)])
    nb = notebook(shown, new_markdown_cell("It gets 0.7530."),
                  new_markdown_cell(f"{prose_numbers.OPT_OUT}\nMixtral reports 46.7B total parameters."))
    assert findings(nb, tmp_path) == []


def test_the_opt_out_marker_is_spelled_as_documented():
    assert prose_numbers.OPT_OUT_RE.search(prose_numbers.OPT_OUT)
    assert prose_numbers.OPT_OUT in (Path(__file__).resolve().parents[1] / "CONTRIBUTING.md").read_text(encoding="utf-8")
