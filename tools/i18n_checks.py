"""The translation catalog of the exercise checks' messages (``minimind_ref.checks``).

Every message a check can show a learner is built from string literals and f-strings in
``minimind_ref/checks/*.py``. This tool reads those files with ``ast`` and turns each one into a
*template*: its literal text, with every f-string replacement field (and every non-literal operand
of a ``+`` chain of strings, as in ``name + " (gradient)"``) written as a numbered placeholder
``{0}``, ``{1}``, ... in order (literal braces are doubled, ``{{``). The templates are the msgids of
the gettext catalog ``minimind_ref/locale/<lang>/LC_MESSAGES/checks.po``, which ships in the package;
``minimind_ref.i18n.translate`` matches a message against them at run time.

    python tools/i18n_checks.py extract      # update the catalog from the check sources
    python tools/i18n_checks.py coverage     # translated / fuzzy / untranslated, per source file
    python tools/i18n_checks.py validate     # placeholders, numbers and `code` kept by every msgstr

What is not a message: docstrings, ``__all__``, format specs (``:.3g``), strings without
whitespace (dict keys, dtype/device/attribute names, short labels such as "cos") and templates whose
literal text is only whitespace (``"{0} {1}"``). Anything else is included, even when it may never
reach a learner (its translation is then the English itself); ``"{0}: {1}"`` and ``"; "`` are
included for their punctuation, which Chinese writes full-width.

``extract`` keeps existing translations. A new template that replaces one whose English changed (the
same source file, a similar text) keeps the old translation marked ``fuzzy``, with the previous
English, for a reviewer to update; ``minimind_ref.i18n`` never uses a fuzzy or empty translation.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Tuple

import polib

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ROOT / "minimind_ref" / "checks"
LOCALE = ROOT / "minimind_ref" / "locale"
LANGUAGES = ("zh_CN",)
DOMAIN = "checks"

PLACEHOLDER = re.compile(r"\{\{|\}\}|\{(\d+)\}")
CODE = re.compile(r"`[^`]+`")
NUMBER = re.compile(r"(?<![\w.])[-−]?\d[\d,]*(?:\.\d+)?")


def catalog_path(lang: str) -> Path:
    return LOCALE / lang / "LC_MESSAGES" / f"{DOMAIN}.po"


# --------------------------------------------------------------------------------------------
# Extraction
# --------------------------------------------------------------------------------------------

def _escape(text: str) -> str:
    return text.replace("{", "{{").replace("}", "}}")


def _literal_text(template: str) -> str:
    """The template without its placeholders (escaped braces count as text)."""
    return PLACEHOLDER.sub(lambda m: m.group(0)[0] if m.group(1) is None else "", template)


def is_message(template: str) -> bool:
    """Whether a template can be part of what a learner reads (see the module's docstring)."""
    return bool(re.search(r"\s", template)) and bool(_literal_text(template).strip())


def _add_chain(node: ast.AST) -> List[ast.AST]:
    """The operands of ``a + b + c`` (left-associated ``BinOp``s), in order."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _add_chain(node.left) + _add_chain(node.right)
    return [node]


def _is_str(node: ast.AST) -> bool:
    return isinstance(node, ast.JoinedStr) or (isinstance(node, ast.Constant) and isinstance(node.value, str))


class _Extractor(ast.NodeVisitor):
    def __init__(self) -> None:
        self.found: List[Tuple[str, int]] = []  # (template, line)

    # -- nodes that are never messages
    def _skip_docstring(self, body: List[ast.stmt]) -> List[ast.stmt]:
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                and isinstance(body[0].value.value, str):
            return body[1:]
        return body

    def visit_Module(self, node: ast.Module) -> None:
        for stmt in self._skip_docstring(node.body):
            self.visit(stmt)

    def _visit_def(self, node) -> None:
        for deco in node.decorator_list:
            self.visit(deco)
        if not isinstance(node, ast.ClassDef):
            self.visit(node.args)
            if node.returns is not None:
                self.visit(node.returns)
        else:
            for base in node.bases + [k.value for k in node.keywords]:
                self.visit(base)
        for stmt in self._skip_docstring(node.body):
            self.visit(stmt)

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _visit_def

    def visit_Assign(self, node: ast.Assign) -> None:
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return
        self.generic_visit(node)

    # -- messages
    def _template(self, parts: List[ast.AST]) -> Tuple[str, List[ast.AST]]:
        """(template, the expressions behind its placeholders) of a sequence of string parts."""
        text, fields = "", []
        for part in parts:
            if isinstance(part, ast.Constant) and isinstance(part.value, str):
                text += _escape(part.value)
            elif isinstance(part, ast.JoinedStr):
                for value in part.values:
                    if isinstance(value, ast.Constant):
                        text += _escape(value.value)
                    else:  # FormattedValue: its format spec is never a message
                        text += "{%d}" % len(fields)
                        fields.append(value.value)
            else:
                text += "{%d}" % len(fields)
                fields.append(part)
        return text, fields

    def _record(self, node: ast.AST, parts: List[ast.AST]) -> None:
        template, fields = self._template(parts)
        if is_message(template):
            self.found.append((template, node.lineno))
        for expr in fields:  # strings inside the replacement fields are messages of their own
            self.visit(expr)

    def visit_BinOp(self, node: ast.BinOp) -> None:
        chain = _add_chain(node)
        if isinstance(node.op, ast.Add) and any(_is_str(part) for part in chain):
            self._record(node, chain)
        else:
            self.generic_visit(node)

    def visit_JoinedStr(self, node: ast.JoinedStr) -> None:
        self._record(node, [node])

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str):
            self._record(node, [node])


def extract_file(path: Path) -> List[Tuple[str, int]]:
    """The templates of one source file, in source order, with their lines."""
    extractor = _Extractor()
    extractor.visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)))
    return sorted(extractor.found, key=lambda item: item[1])


def sources() -> List[Path]:
    """The check sources: ``core.py`` first, then the chapters in order."""
    files = sorted(p for p in SOURCES.glob("*.py") if p.name != "__init__.py")
    return sorted(files, key=lambda p: (p.name != "core.py", p.name))


def extract_all() -> List[Tuple[str, List[str]]]:
    """Every template once, in source order, with where it occurs (``path:line``)."""
    seen: Dict[str, List[str]] = {}
    for path in sources():
        where = path.relative_to(ROOT).as_posix()
        for template, line in extract_file(path):
            seen.setdefault(template, []).append(f"{where}:{line}")
    return list(seen.items())


def _file_of(entry: polib.POEntry) -> str:
    return entry.occurrences[0][0] if entry.occurrences else ""


def extract(lang: str) -> Tuple[int, int, int]:
    """Rewrite the catalog from the sources; returns (templates, kept translations, new fuzzy)."""
    path = catalog_path(lang)
    old = polib.pofile(str(path), wrapwidth=0) if path.exists() else None
    old_by_id = {e.msgid: e for e in old if not e.obsolete} if old else {}
    found = extract_all()
    current = {template for template, _ in found}
    # translated entries whose English is gone: candidates for a changed message's fuzzy translation
    gone = [e for e in old_by_id.values() if e.msgid not in current and e.msgstr]
    po = polib.POFile(wrapwidth=0)
    po.metadata = {
        "Project-Id-Version": "MiniMind from Zero (minimind_ref.checks)",
        "Language": lang,
        "MIME-Version": "1.0",
        "Content-Type": "text/plain; charset=UTF-8",
        "Content-Transfer-Encoding": "8bit",
    }
    kept = fuzzy = 0
    for template, places in found:
        entry = polib.POEntry(msgid=template, msgstr="",
                              occurrences=[tuple(place.rsplit(":", 1)) for place in places])
        if template in old_by_id:
            previous = old_by_id[template]
            entry.msgstr, entry.flags = previous.msgstr, list(previous.flags)
            entry.previous_msgid = previous.previous_msgid
            kept += bool(previous.msgstr)
        else:
            same_file = [e for e in gone if _file_of(e) == places[0].rsplit(":", 1)[0]]
            best = max(same_file, key=lambda e: difflib.SequenceMatcher(None, e.msgid, template).ratio(), default=None)
            if best is not None and difflib.SequenceMatcher(None, best.msgid, template).ratio() >= 0.6:
                entry.msgstr, entry.flags, entry.previous_msgid = best.msgstr, ["fuzzy"], best.msgid
                gone.remove(best)
                fuzzy += 1
        po.append(entry)
    path.parent.mkdir(parents=True, exist_ok=True)
    po.save(str(path))
    return len(found), kept, fuzzy


# --------------------------------------------------------------------------------------------
# Coverage and validation
# --------------------------------------------------------------------------------------------

def coverage(lang: str) -> List[Dict[str, object]]:
    """Per source file (the first place a template occurs) and in total: counts and percent."""
    path = catalog_path(lang)
    entries = [e for e in polib.pofile(str(path)) if not e.obsolete] if path.exists() else []
    rows: Dict[str, Dict[str, object]] = {}
    for e in entries:
        for key in (Path(_file_of(e)).name, "total"):
            row = rows.setdefault(key, {"file": key, "templates": 0, "translated": 0, "fuzzy": 0, "untranslated": 0})
            row["templates"] += 1
            if e.fuzzy:
                row["fuzzy"] += 1
            elif e.msgstr:
                row["translated"] += 1
            else:
                row["untranslated"] += 1
    if "total" not in rows:
        rows["total"] = {"file": "total", "templates": 0, "translated": 0, "fuzzy": 0, "untranslated": 0}
    out = sorted((r for k, r in rows.items() if k != "total"), key=lambda r: str(r["file"])) + [rows["total"]]
    for row in out:
        row["percent"] = 100.0 * row["translated"] / row["templates"] if row["templates"] else 100.0
    return out


def placeholders(text: str) -> List[int]:
    return [int(m.group(1)) for m in PLACEHOLDER.finditer(text) if m.group(1) is not None]


def adjacent_runs(text: str) -> List[Tuple[int, ...]]:
    """Runs of two or more placeholders with nothing between them (``{1}{2}``), in order. The text
    of a message cannot say where one value of a run ends and the next begins, so a translation
    must keep each run of its msgid together and in order (it may join others)."""
    runs, current, end = [], [], -1
    for m in PLACEHOLDER.finditer(text):
        if m.group(1) is None:
            continue
        if current and m.start() == end:
            current.append(int(m.group(1)))
        else:
            if len(current) > 1:
                runs.append(tuple(current))
            current = [int(m.group(1))]
        end = m.end()
    if len(current) > 1:
        runs.append(tuple(current))
    return runs


def _kept_together(run: Tuple[int, ...], msgstr: str) -> bool:
    return "".join("{%d}" % i for i in run) in msgstr


def protected(text: str) -> Dict[str, Counter]:
    """What a translation must keep: placeholders, `code` spans, and the numbers outside both."""
    code = CODE.findall(text)
    rest = PLACEHOLDER.sub(" ", CODE.sub(" ", text))
    numbers = [n.replace(",", "").replace("−", "-") for n in NUMBER.findall(rest)]
    return {"placeholders": Counter(placeholders(text)), "code": Counter(code), "numbers": Counter(numbers)}


def problems(msgid: str, msgstr: str) -> List[str]:
    """Why ``msgstr`` is not a usable translation of ``msgid`` (empty: nothing found)."""
    want, got = protected(msgid), protected(msgstr)
    out = []
    for kind in want:
        missing, extra = want[kind] - got[kind], got[kind] - want[kind]
        if missing:
            out.append(f"{kind} missing from the translation: {sorted(missing)}")
        if extra:
            out.append(f"{kind} not in the English: {sorted(extra)}")
    for run in adjacent_runs(msgid):
        if not _kept_together(run, msgstr):
            out.append(f"placeholders {''.join('{%d}' % i for i in run)} must stay together and in this order")
    for edge, test in (("leading", str.startswith), ("trailing", str.endswith)):
        if test(msgid, "\n") != test(msgstr, "\n"):
            out.append(f"a {edge} newline of the English must be kept (and none added)")
    return out


def validate(lang: str) -> List[str]:
    path = catalog_path(lang)
    if not path.exists():
        return [f"{path.relative_to(ROOT)}: missing (run `python tools/i18n_checks.py extract`)"]
    errors = []
    for e in polib.pofile(str(path)):
        if e.obsolete:
            continue
        if e.msgstr and not e.fuzzy:
            for p in problems(e.msgid, e.msgstr):
                errors.append(f"{_file_of(e)}: {e.msgid[:60]!r}: {p}")
    return errors


def main(argv: Optional[Iterable[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["extract", "coverage", "validate"])
    parser.add_argument("--lang", default="zh_CN", choices=LANGUAGES)
    args = parser.parse_args(argv)
    if args.command == "extract":
        total, kept, fuzzy = extract(args.lang)
        print(f"{catalog_path(args.lang).relative_to(ROOT)}: {total} templates, {kept} translations kept, "
              f"{fuzzy} marked fuzzy (English changed)")
    elif args.command == "coverage":
        rows = coverage(args.lang)
        for row in rows:
            print(f"{row['file']:10} {row['translated']:4}/{row['templates']:<4} {row['percent']:5.1f}%"
                  f"  fuzzy {row['fuzzy']}  untranslated {row['untranslated']}")
        return 0 if rows[-1]["translated"] == rows[-1]["templates"] else 1
    else:
        errors = validate(args.lang)
        print("\n".join(errors) or "every translation keeps its placeholders, code spans and numbers")
        return 1 if errors else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
