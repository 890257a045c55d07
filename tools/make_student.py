"""Write the student edition of every chapter: ``notebooks/NN_topic.ipynb`` -> ``student/NN_topic.ipynb``.

    python tools/make_student.py            # (re)write student/ (what `make student` runs)
    python tools/make_student.py --check    # exit 1 and name the stale files, write nothing

In the student edition

* every solution block, from a ``# BEGIN SOLUTION`` line to its ``# END SOLUTION`` line, becomes
  ``raise NotImplementedError("Exercise N.M: <what to implement>")`` at the marker's indentation.
  ``N.M`` comes from the closest ``### Exercise N.M`` heading above the cell; the text from the
  marker line (``# BEGIN SOLUTION: implement rms_norm``), else the heading's title;
* every output and execution count is removed, and so is the saved widget state (a learner
  starts clean);
* a markdown cell tagged ``after-solving`` (``AFTER_SOLVING``) is left out: it explains the answer of
  the exercise above it (the closed form a prediction should find, the rule a check measured), which the
  chapter states for readers of the book but a learner should meet only after solving it. Only markdown
  is held back (code cells after an exercise may define what later cells use);
* everything else (markdown, setup and check cells, cell ids, tags) stays as it is.

The Chinese editions, ``student/zh/NN_topic.ipynb``, are made the same way from the chapter as
``tools/i18n.py`` translates it (markdown from ``locales/zh_CN``, the setup cell selecting Chinese
check messages); their stubs say ``练习 N.M：<the text in Chinese>``: the text of a
``# BEGIN SOLUTION: ...`` marker is a message of the chapter's catalog (``tools/i18n.py`` extracts
it), the default text is the translated heading's title.

The result is a pure function of the solution notebook, so ``tests/test_student.py`` can
regenerate it in memory and fail when the committed ``student/`` copy is stale.
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import sys
from pathlib import Path
from typing import Callable, Dict, List, Optional

import nbformat

if str(Path(__file__).parent) not in sys.path:  # the tools folder: its modules import each other by name
    sys.path.insert(0, str(Path(__file__).parent))
from solution_markers import BEGIN, END, has_solution  # noqa: E402  (has_solution: also what other tools call here)

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
STUDENT = ROOT / "student"

EXERCISE_HEADING = re.compile(r"^#{2,4}\s*(?P<word>Exercise|练习)\s+(?P<number>\d+\.\d+)\s*(?:[—:.-]+\s*(?P<title>.*?))?\s*$", re.M)
CHAPTER_NUMBER = re.compile(r"^(\d+)_")

# Notebook metadata that describes a run, not the notebook.
RUN_METADATA = ("widgets", "execution")

#: The tag of a markdown cell that explains an exercise's answer: the student edition leaves it out.
AFTER_SOLVING = "after-solving"


class StudentEditionError(ValueError):
    """A solution notebook whose markers cannot be turned into stubs."""


def stub_source(source: str, label: str, default_text: str, where: str = "cell",
                translate: Optional[Callable[[str], str]] = None, separator: str = ": ") -> str:
    """Replace each ``# BEGIN SOLUTION`` ... ``# END SOLUTION`` block of ``source`` with a stub.
    ``translate`` turns a marker's text into the edition's language; ``separator`` joins the label
    and the text (a full-width colon in Chinese)."""
    out: List[str] = []
    lines = source.splitlines()
    i = 0
    while i < len(lines):
        begin = BEGIN.match(lines[i])
        if END.match(lines[i]):
            raise StudentEditionError(f"{where}: '# END SOLUTION' without '# BEGIN SOLUTION' (line {i + 1})")
        if not begin:
            out.append(lines[i])
            i += 1
            continue
        j = i + 1
        while j < len(lines) and not END.match(lines[j]):
            if BEGIN.match(lines[j]):
                raise StudentEditionError(f"{where}: nested '# BEGIN SOLUTION' (line {j + 1})")
            j += 1
        if j == len(lines):
            raise StudentEditionError(f"{where}: '# BEGIN SOLUTION' (line {i + 1}) has no '# END SOLUTION'")
        text = begin.group("text")
        if text and translate is not None:
            text = translate(text)
        text = text or default_text
        message = f"{label}{separator}{text}" if text else label
        out.append(f"{begin.group('indent')}raise NotImplementedError({json.dumps(message, ensure_ascii=False)})")
        i = j + 1
    result = "\n".join(out)
    return result + "\n" if source.endswith("\n") else result


#: How a translated edition joins the stub's label and text (``练习 1.1：实现 rms_norm``).
SEPARATORS = {"练习": "："}


def student_notebook(nb: nbformat.NotebookNode, chapter: Optional[str] = None, where: str = "notebook",
                     translate: Optional[Callable[[str], str]] = None) -> nbformat.NotebookNode:
    """The student edition of a solution notebook (a new object; ``nb`` is not modified).
    ``translate`` gives the stubs' marker texts in the edition's language."""
    nb = copy.deepcopy(nb)
    for key in RUN_METADATA:
        nb.metadata.pop(key, None)
    number: Optional[str] = None
    title = ""
    word = "Exercise"  # the translated editions' headings say 练习 (tools/i18n.py)
    count = 0
    kept = []
    for index, cell in enumerate(nb.cells):
        if AFTER_SOLVING in cell.get("metadata", {}).get("tags", []):
            if cell.cell_type != "markdown" or EXERCISE_HEADING.search(cell.source):
                raise StudentEditionError(f"{where}, cell {index}: only a markdown cell without an exercise heading "
                                          f"may be tagged {AFTER_SOLVING!r} (the student edition leaves it out)")
            continue
        kept.append(cell)
        if cell.cell_type == "markdown":
            headings = list(EXERCISE_HEADING.finditer(cell.source))
            if headings:
                number, title = headings[-1].group("number"), (headings[-1].group("title") or "").strip()
                word = headings[-1].group("word")
            continue
        if cell.cell_type != "code":
            continue
        cell.outputs = []
        cell.execution_count = None
        for key in RUN_METADATA:
            cell.metadata.pop(key, None)
        if has_solution(cell.source):
            count += 1
            label_number = number or (f"{int(chapter)}.{count}" if chapter else str(count))
            cell.source = stub_source(cell.source, f"{word} {label_number}", title, where=f"{where}, cell {index}",
                                      translate=translate, separator=SEPARATORS.get(word, ": "))
            number, title = None, ""  # a heading labels one exercise
    nb.cells = kept
    return nb


def render(path: Path, lang: Optional[str] = None) -> str:
    """The exact text of ``student/<name>`` (``student/<lang>/<name>`` for a translation) for the
    solution notebook at ``path``."""
    if lang:
        import i18n  # tools/i18n.py: the notebook with its markdown from the catalog

        nb = i18n.translated_notebook(path, lang)
        table = i18n.load_table(lang, i18n.domain_of(path))
        translate: Optional[Callable[[str], str]] = lambda text: table.get(text, text)
    else:
        nb = nbformat.read(path, as_version=4)
        translate = None
    match = CHAPTER_NUMBER.match(path.name)
    student = student_notebook(nb, chapter=match.group(1) if match else None, where=str(path.name), translate=translate)
    text = nbformat.writes(student)
    return text if text.endswith("\n") else text + "\n"


#: Translated student editions: student/<folder>/ from the catalogs in locales/<language>/.
TRANSLATIONS = {"zh": "zh_CN"}


def expected_files(notebooks: Path = NOTEBOOKS, student: Path = STUDENT) -> Dict[Path, str]:
    files = {student / path.name: render(path) for path in sorted(notebooks.glob("*.ipynb"))}
    if notebooks == NOTEBOOKS:
        for folder, lang in TRANSLATIONS.items():
            files.update({student / folder / path.name: render(path, lang) for path in sorted(notebooks.glob("*.ipynb"))})
    return files


def stale_files(notebooks: Path = NOTEBOOKS, student: Path = STUDENT) -> List[str]:
    """Student files that differ from a fresh rendering, are missing, or have no chapter any more."""
    expected = expected_files(notebooks, student)
    problems = [f"{p.relative_to(ROOT) if p.is_relative_to(ROOT) else p}: stale or missing"
                for p, text in expected.items() if not p.exists() or p.read_text(encoding="utf-8") != text]
    problems += [f"{p.relative_to(ROOT) if p.is_relative_to(ROOT) else p}: no notebooks/{p.name}"
                 for p in sorted(student.glob("*.ipynb")) + sorted(student.glob("*/*.ipynb")) if p not in expected]
    return problems


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="report stale student editions, write nothing")
    args = parser.parse_args(argv)
    if args.check:
        problems = stale_files()
        for line in problems:
            print(line)
        if problems:
            print("run `make student` to regenerate student/")
        return 1 if problems else 0
    STUDENT.mkdir(exist_ok=True)
    expected = expected_files()
    for path, text in expected.items():
        path.parent.mkdir(exist_ok=True)
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path.relative_to(ROOT)}")
    for path in sorted(STUDENT.glob("*.ipynb")) + sorted(STUDENT.glob("*/*.ipynb")):
        if path not in expected:
            path.unlink()
            print(f"removed {path.relative_to(ROOT)} (no notebooks/{path.name})")
    print(f"student editions: {len(expected)} up to date (English and {', '.join(TRANSLATIONS)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
