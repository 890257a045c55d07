"""Numbers in a chapter's prose must be the numbers its code printed.

    python tools/prose_numbers.py                       # list every finding in notebooks/*.ipynb
    python tools/prose_numbers.py notebooks/05_architecture.ipynb

The rule (CONTRIBUTING.md, "Prose truth"): a number with a decimal point or a percent sign in a
markdown cell (``0.131``, ``1.8e-06``, ``4.5 %``, ``3.2x``) must appear, formatted the same way, in
the text output of a code cell **above it in the same section** (a section starts at a ``#`` or
``##`` heading). The comparison is on the digits as written: prose ``0.13`` does not match an
output ``0.131``, and prose ``−1.72`` (typographic minus) matches an output ``-1.72``. A trailing
``%`` or ``x`` is not part of the comparison, so ``4.5 %`` in prose matches ``4.5%`` printed.

Not checked: math (``$...$``, ``$$...$$``, ``\\(...\\)``), code (backtick spans and fenced blocks),
HTML comments, link targets, heading lines, exercise and section references (``Exercise 4.1``,
``section 3.2``, ``§3.2``) and version numbers (``Python 3.12``, ``torch 2.13.0``). A markdown cell
whose numbers do not come from an output of the notebook (a published figure, a paper's result,
a parameter quoted from the code) carries the opt-out marker ``<!-- prose-numbers: not computed here -->``,
which is better still followed by a word on where they come from.

The check is cheap (it reads the stored outputs; nothing runs) and it errs on the side of
silence: anything that is not plainly a decimal or percentage in running text is skipped.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, List, Optional, Sequence

import nbformat

OPT_OUT = "<!-- prose-numbers: not computed here -->"
OPT_OUT_RE = re.compile(r"<!--\s*prose-numbers\s*:\s*not computed here\s*-->", re.I)

_FENCE = re.compile(r"(^|\n)(```|~~~).*?(\n\2[^\n]*|\Z)", re.S)
_DISPLAY_MATH = re.compile(r"\$\$.*?\$\$", re.S)
_INLINE_MATH = re.compile(r"(?<![\\$])\$(?!\s)[^$\n]+?(?<![\s\\])\$")
_PAREN_MATH = re.compile(r"\\\(.*?\\\)|\\\[.*?\\\]", re.S)
_CODE_SPAN = re.compile(r"(`+)(?!`).*?(?<!`)\1(?!`)", re.S)
_COMMENT = re.compile(r"<!--.*?-->", re.S)
_LINK_TARGET = re.compile(r"\]\([^)]*\)")
_URL = re.compile(r"https?://\S+")
_HTML_TAG = re.compile(r"<[^>\n]+>")
_HEADING_LINE = re.compile(r"^\s{0,3}#{1,6}\s.*$", re.M)
_SECTION = re.compile(r"^\s{0,3}#{1,2}\s", re.M)

# A decimal number (optionally in scientific notation) or an integer followed by a percent sign.
_NUMBER = re.compile(
    r"(?<![\w.\-−+])(?P<sign>[-−+])?(?P<num>\d+(?:,\d{3})*\.\d+(?:[eE][-+−]?\d+)?|\d+(?:,\d{3})*(?=\s?%))"
    r"(?![\w.]\d|\.\d|\d)")
# Words after which a number is a name, not a measurement: "Exercise 4.1", "section 3.2", "Python 3.12".
_NAME_BEFORE = re.compile(
    r"(?:exercises?|sections?|chapters?|cells?|questions?|answers?|self-checks?|steps?|§|python|pytorch|torch|"
    r"numpy|cuda|version|versions|v|jupyter[- ]book|minimind|nbval|ipywidgets|matplotlib)\s*$", re.I)
# ...and "4.1 and 4.2", "4.1, 4.2" after such a word
_NAME_LIST_BEFORE = re.compile(
    r"(?:exercises?|sections?|chapters?|questions?|answers?|§)\s*\d+\.\d+(?:\s*(?:,|and|or|to|–|-)\s*\d+\.\d+)*\s*(?:,|and|or|to|–|-)\s*$", re.I)


@dataclass
class Finding:
    notebook: str
    cell: int  # index in nb.cells
    number: str  # as written in the prose
    context: str
    elsewhere: Optional[int] = None  # a cell (index) whose output has it, outside the section or below

    def __str__(self) -> str:
        where = (f"; it is printed by cell {self.elsewhere}, which is not above it in its section"
                 if self.elsewhere is not None else "")
        return (f"{self.notebook} markdown cell {self.cell}: {self.number!r} is not printed by any code cell above it "
                f"in its section{where} … {self.context} …")


def prose_text(source: str) -> str:
    """The running text of a markdown cell: math, code, comments, link targets and headings removed."""
    text = _FENCE.sub("\n", source)
    text = _COMMENT.sub(" ", text)
    text = _DISPLAY_MATH.sub(" ", text)
    text = _PAREN_MATH.sub(" ", text)
    text = _CODE_SPAN.sub(" ", text)
    text = _INLINE_MATH.sub(" ", text)
    text = _LINK_TARGET.sub("]", text)
    text = _URL.sub(" ", text)
    text = _HTML_TAG.sub(" ", text)
    text = _HEADING_LINE.sub(" ", text)
    return text


def numbers_in_prose(source: str) -> List[tuple]:
    """(number as written, normalised digits, context) for each checked number of a markdown cell."""
    text = prose_text(source)
    found = []
    for m in _NUMBER.finditer(text):
        before = text[max(0, m.start() - 60):m.start()]
        if _NAME_BEFORE.search(before) or _NAME_LIST_BEFORE.search(before):
            continue
        written = m.group(0)
        digits = normalise(m.group("num"))
        context = " ".join(text[max(0, m.start() - 40):m.end() + 30].split())
        found.append((written, digits, context))
    return found


def normalise(number: str) -> str:
    return number.replace("−", "-").replace(",", "")


def output_text(cell) -> str:
    parts = []
    for out in cell.get("outputs", []):
        if out.get("output_type") == "stream":
            parts.append(out.get("text", ""))
        for mime in ("text/plain", "text/markdown", "text/html", "text/latex"):
            value = out.get("data", {}).get(mime)
            if value:
                parts.append(value if isinstance(value, str) else "".join(value))
    return normalise("\n".join(parts))


def printed(digits: str, text: str) -> bool:
    """``digits`` occurs in ``text`` as a whole number (not inside a longer one)."""
    return re.search(rf"(?<![\d.]){re.escape(digits)}(?![\d]|\.\d)", text) is not None


def check_notebook(path: Path) -> List[Finding]:
    nb = nbformat.read(path, as_version=4)
    findings: List[Finding] = []
    section_outputs: List[tuple] = []  # (cell index, output text) of code cells above, this section
    all_outputs = [(i, output_text(c)) for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            section_outputs.append((index, output_text(cell)))
            continue
        if cell.cell_type != "markdown":
            continue
        if _SECTION.search(cell.source):
            section_outputs = []
        if OPT_OUT_RE.search(cell.source):
            continue
        for written, digits, context in numbers_in_prose(cell.source):
            if any(printed(digits, text) for _, text in section_outputs):
                continue
            elsewhere = next((i for i, text in all_outputs if printed(digits, text)), None)
            findings.append(Finding(path.name, index, written, context, elsewhere))
    return findings


def main(argv: Optional[Sequence[str]] = None) -> int:
    paths = [Path(p) for p in (argv if argv else sys.argv[1:])] or sorted(
        (Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))
    total = 0
    for path in paths:
        for finding in check_notebook(path):
            print(finding)
            total += 1
    print(f"{total} number(s) in prose not printed above them in their section")
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
