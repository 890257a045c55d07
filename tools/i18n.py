"""Translations of the course from one source: the English notebooks and pages.

The English text is split into messages (a paragraph, a heading, a list item, a table row); code
cells, outputs, code blocks, display math and HTML comments are never messages and are copied by
this tool, never by hand. Translations live in gettext catalogs,
``locales/<lang>/LC_MESSAGES/<domain>.po``, one domain per chapter (``01_normalization``), per book
page (``book-welcome``) and one for the table of contents and the site's own strings (``site``).

    python tools/i18n.py extract              # update every catalog from the English sources
    python tools/i18n.py coverage             # translated / fuzzy / untranslated per domain
    python tools/i18n.py validate             # every translation keeps the code, math, links, numbers
    python tools/i18n.py build-source OUT     # the Chinese book's sources in OUT (tools/build_zh.py)

``extract`` keeps existing translations; a message whose English changed keeps its old
translation marked ``fuzzy`` (with the previous English), so the reviewer sees what to update;
fuzzy and empty translations are never used: the English text shows instead.
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Tuple

import polib

ROOT = Path(__file__).resolve().parents[1]
LOCALES = ROOT / "locales"
LANGUAGES = ("zh_CN",)
NOTEBOOKS = ROOT / "notebooks"
BOOK = ROOT / "book"
CHAPTER = re.compile(r"^\d\d_.*\.ipynb$")


# --------------------------------------------------------------------------------------------
# Splitting Markdown into messages
# --------------------------------------------------------------------------------------------

@dataclass
class Chunk:
    text: str
    message: bool  # True: translatable text; False: copied as it is


FENCE = re.compile(r"^(\s*)(`{3,}|~{3,}|:{3,})(.*)$")
LIST_ITEM = re.compile(r"^(\s*)([-*+]|\d+[.)])(\s+)")
HEADING = re.compile(r"^(#{1,6}\s+)(.*)$")
TABLE_RULE = re.compile(r"^\s*\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?\s*$")
DIRECTIVE_OPTION = re.compile(r"^\s*:[\w-]+:")


WORD = re.compile(r"(?<![\w.-])[A-Za-z][A-Za-z'’-]*[A-Za-z](?![\w.-])")


def translatable(text: str) -> bool:
    """Whether ``text`` has a word to translate once code, math, links and identifiers (names with a
    digit, an underscore or a dot, like ``12_grpo`` or ``config.json``) are set aside. A table row of
    chapter names and seconds is copied as it is, so re-measuring it never needs a translator."""
    rest = URL.sub(" ", LINK_TARGET.sub(" ", MATH.sub(" ", CODE.sub(" ", text))))
    return bool(WORD.search(rest))


def _split_paragraph(lines: List[str]) -> List[Chunk]:
    """One paragraph (no blank lines, no fences) -> chunks. Headings, list items and table rows are
    messages of their own; their markers (``## ``, ``- ``, ``| --- |``) are not translated."""
    out: List[Chunk] = []
    current: List[str] = []
    prefix = ""

    def flush() -> None:
        nonlocal current, prefix
        if current:
            if prefix:
                out.append(Chunk(prefix, False))
            out.append(Chunk("\n".join(current), True))
            out.append(Chunk("\n", False))
        current, prefix = [], ""

    for line in lines:
        heading = HEADING.match(line)
        item = LIST_ITEM.match(line)
        if heading:
            flush()
            out += [Chunk(heading.group(1), False), Chunk(heading.group(2), True), Chunk("\n", False)]
        elif line.lstrip().startswith("|"):
            flush()
            if TABLE_RULE.match(line) or not line.strip("| \t"):
                out.append(Chunk(line + "\n", False))
            else:
                out += [Chunk(line, True), Chunk("\n", False)]
        elif DIRECTIVE_OPTION.match(line) or line.strip() == "$$" or line.lstrip().startswith("<!--"):
            flush()
            out.append(Chunk(line + "\n", False))
        elif item and (not current or len(item.group(1)) <= len(prefix) - len(prefix.lstrip())):
            flush()
            prefix = item.group(0)
            current = [line[len(item.group(0)):]]
        else:
            current.append(line)
    flush()
    # a message never carries surrounding blanks, and text with nothing to translate is copied
    fixed: List[Chunk] = []
    for chunk in out:
        if chunk.message and not translatable(chunk.text):
            fixed.append(Chunk(chunk.text, False))
        else:
            fixed.append(chunk)
    return fixed


def split_markdown(text: str) -> List[Chunk]:
    """Chunks whose texts, joined, give back ``text`` exactly."""
    chunks: List[Chunk] = []
    lines = text.split("\n")
    paragraph: List[str] = []

    def flush() -> None:
        nonlocal paragraph
        if paragraph:
            chunks.extend(_split_paragraph(paragraph))
            paragraph = []

    directives: List[str] = []  # the fences of the directives open at this line
    i = 0
    while i < len(lines):
        line = lines[i]
        fence = FENCE.match(line)
        if fence:
            flush()
            marker, info = fence.group(2), fence.group(3).strip()
            if marker.startswith(":") or info.startswith("{") or (not info and directives and marker == directives[-1]):
                # a directive: its opening and closing lines are markup, its body is text
                if info.startswith("{") or (marker.startswith(":") and info):
                    directives.append(marker)
                elif directives and marker == directives[-1]:
                    directives.pop()
                chunks.append(Chunk(line + "\n", False))
                i += 1
                continue
            # a code block: copied up to its closing fence
            block = [line]
            i += 1
            while i < len(lines):
                block.append(lines[i])
                if lines[i].strip().startswith(marker[0] * len(marker)) and not lines[i].strip(marker[0] + " "):
                    break
                i += 1
            chunks.append(Chunk("\n".join(block) + "\n", False))
            i += 1
            continue
        if line.strip() == "$$" or (line.strip().startswith("$$") and not line.strip().endswith("$$")) \
                or (line.strip().startswith("$$") and line.strip() == "$$"):
            flush()
            block = [line]
            i += 1
            while i < len(lines):
                block.append(lines[i])
                if lines[i].strip().endswith("$$"):
                    break
                i += 1
            chunks.append(Chunk("\n".join(block) + "\n", False))
            i += 1
            continue
        if line.strip().startswith("$$") and line.strip().endswith("$$") and len(line.strip()) > 4:
            flush()
            chunks.append(Chunk(line + "\n", False))
            i += 1
            continue
        if line.lstrip().startswith("<!--"):
            flush()
            block = [line]
            while "-->" not in lines[i] and i + 1 < len(lines):
                i += 1
                block.append(lines[i])
            chunks.append(Chunk("\n".join(block) + "\n", False))
            i += 1
            continue
        if not line.strip():
            flush()
            chunks.append(Chunk(line + "\n", False))
            i += 1
            continue
        paragraph.append(line)
        i += 1
    flush()
    # every line was given a newline, the last one too: take that one back
    while chunks and not chunks[-1].text:
        chunks.pop()
    if chunks:
        last = chunks[-1]
        assert last.text.endswith("\n")
        chunks[-1] = Chunk(last.text[:-1], last.message)
        if not chunks[-1].text:
            chunks.pop()
    joined = "".join(c.text for c in chunks)
    assert joined == text, "split_markdown must give back its input"
    return chunks


def messages(text: str) -> List[str]:
    return [c.text for c in split_markdown(text) if c.message]


def translate_markdown(text: str, table: Dict[str, str]) -> str:
    return "".join(table.get(c.text, c.text) if c.message else c.text for c in split_markdown(text))


# --------------------------------------------------------------------------------------------
# Sources and domains
# --------------------------------------------------------------------------------------------

def chapters() -> List[Path]:
    return sorted(p for p in NOTEBOOKS.iterdir() if CHAPTER.match(p.name))


def pages() -> List[Path]:
    return sorted(BOOK.glob("*.md"))


def domain_of(path: Path) -> str:
    return path.stem if path.suffix == ".ipynb" else f"book-{path.stem}"


def site_messages() -> List[Tuple[str, str]]:
    """(message, where) for the table of contents' captions and titles and the book's title."""
    import yaml

    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    out = [(config["title"], "_config.yml")]
    for part in toc.get("parts", []):
        out.append((part["caption"], "_toc.yml"))
        for entry in part.get("chapters", []):
            if "title" in entry:
                out.append((entry["title"], "_toc.yml"))
    return out


def source_messages(path: Path) -> List[Tuple[str, str]]:
    """(message, where) in the order they appear: a notebook's markdown messages, and the texts of
    its ``# BEGIN SOLUTION: <text>`` markers, which the student editions' stubs show
    (``tools/make_student.py``; the marker syntax is ``tools/solution_markers.py``'s)."""
    out: List[Tuple[str, str]] = []
    if path.suffix == ".ipynb":
        if str(Path(__file__).parent) not in sys.path:
            sys.path.insert(0, str(Path(__file__).parent))
        import solution_markers  # tools/solution_markers.py: what a solution marker is

        nb = json.loads(path.read_text())
        for index, cell in enumerate(nb["cells"]):
            source = "".join(cell["source"])
            if cell["cell_type"] == "markdown":
                out += [(m, f"{path.name}:{index}") for m in messages(source)]  # file:cell
            elif cell["cell_type"] == "code":
                out += [(m, f"{path.name}:{index}") for m in solution_markers.marker_texts(source)]
    else:
        out += [(m, f"book/{path.name}") for m in messages(path.read_text())]
    return out


def all_sources() -> Dict[str, List[Tuple[str, str]]]:
    sources = {domain_of(p): source_messages(p) for p in chapters() + pages()}
    sources["site"] = site_messages()
    return sources


def catalog_path(lang: str, domain: str) -> Path:
    return LOCALES / lang / "LC_MESSAGES" / f"{domain}.po"


_CJK = "\u3000-\u303f\u4e00-\u9fff\uff00-\uffef"
#: A line break between two Chinese characters, with the indentation of the next line (a list
#: item's continuation lines are indented) and an emphasis marker on either side (``**``, ``*``,
#: ``_``): browsers render it as a space, which Chinese text does not have, so it is joined.
CJK_BREAK = re.compile(rf"(?<=[{_CJK}])(\*\*|\*|_)?\n[ \t]*(\*\*|\*|_)?(?=[{_CJK}])")


def join_cjk_lines(text: str) -> str:
    """``text`` with every line break between two Chinese characters removed (see ``CJK_BREAK``)."""
    return CJK_BREAK.sub(lambda m: (m.group(1) or "") + (m.group(2) or ""), text)


def load_table(lang: str, domain: str) -> Dict[str, str]:
    """msgid -> msgstr for the usable (translated, not fuzzy) entries of one catalog."""
    path = catalog_path(lang, domain)
    if not path.exists():
        return {}
    return {e.msgid: join_cjk_lines(e.msgstr) for e in polib.pofile(str(path))
            if e.msgstr and not e.fuzzy and not e.obsolete}


# --------------------------------------------------------------------------------------------
# Translated copies (the Chinese site's sources, the Chinese student editions)
# --------------------------------------------------------------------------------------------

#: The line the translated notebooks add to their setup cell: exercise checks answer in that language.
LANGUAGE_LINE = {"zh_CN": 'import minimind_ref.i18n; minimind_ref.i18n.set_language("zh_CN")  # 练习检查的提示使用中文'}
#: The word the translated exercise headings start with (tools/make_student.py reads it).
EXERCISE_WORD = {"zh_CN": "练习"}


def _translate_outputs(cell, lang: str) -> None:
    """Translate the check lines (``✓ ...``) of a code cell's printed output, as the kernel prints
    them when the checks speak ``lang`` (``minimind_ref.i18n``)."""
    try:
        from minimind_ref import i18n as package_i18n
    except ImportError:  # a package without translations: outputs stay as they are
        return
    previous = package_i18n.get_language()
    package_i18n.set_language(lang)
    try:
        for output in cell.get("outputs", []):
            if output.get("output_type") == "stream" and output.get("name") == "stdout":
                text = "".join(output["text"]) if isinstance(output["text"], list) else output["text"]
                lines = text.split("\n")
                lines = [package_i18n.translate(line) if line.startswith("✓") else line for line in lines]
                output["text"] = "\n".join(lines)
    finally:
        package_i18n.set_language(previous)


def translated_notebook(path: Path, lang: str = "zh_CN"):
    """The notebook at ``path`` in ``lang``: markdown from the catalog, code cells as they are (the
    setup cell also selects the checks' language), the check lines of the outputs translated."""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    table = load_table(lang, domain_of(path))
    language_set = False
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            cell.source = translate_markdown(cell.source, table)
        elif cell.cell_type == "code":
            lines = cell.source.split("\n")
            if not language_set and lines and lines[0].strip() == "%matplotlib inline":
                cell.source = "\n".join([lines[0], LANGUAGE_LINE[lang]] + lines[1:])
                language_set = True
            _translate_outputs(cell, lang)
    nb.metadata["minimind_language"] = lang
    return nb


def translated_page(path: Path, lang: str = "zh_CN") -> str:
    return translate_markdown(path.read_text(encoding="utf-8"), load_table(lang, domain_of(path)))


def translated_site_text(text: str, lang: str = "zh_CN") -> str:
    return load_table(lang, "site").get(text, text)


# --------------------------------------------------------------------------------------------
# Commands
# --------------------------------------------------------------------------------------------

def extract(lang: str, only: Optional[List[str]] = None) -> None:
    for domain, found in all_sources().items():
        if only and domain not in only:
            continue
        path = catalog_path(lang, domain)
        old = polib.pofile(str(path)) if path.exists() else None
        old_by_id = {e.msgid: e for e in old} if old else {}
        wanted = {message for message, _ in found}
        # translations whose English is gone, by the cell (or page) they came from: a changed
        # message at the same place takes the most similar one, marked fuzzy
        vanished: Dict[str, List[polib.POEntry]] = {}
        if old:
            for e in old:
                if e.msgid not in wanted and e.msgstr:
                    for place, line in e.occurrences:
                        vanished.setdefault(f"{place}:{line}" if line else place, []).append(e)
        po = polib.POFile(wrapwidth=0)
        po.metadata = {
            "Project-Id-Version": "MiniMind from Zero",
            "Language": lang,
            "MIME-Version": "1.0",
            "Content-Type": "text/plain; charset=UTF-8",
            "Content-Transfer-Encoding": "8bit",
        }
        seen: Dict[str, polib.POEntry] = {}
        for message, where in found:
            occurrence = tuple(where.split(":", 1)) if ":" in where else (where, "")
            if message in seen:
                seen[message].occurrences.append(occurrence)
                continue
            entry = polib.POEntry(msgid=message, msgstr="", occurrences=[occurrence])
            if message in old_by_id:
                previous = old_by_id[message]
                entry.msgstr = previous.msgstr
                entry.flags = list(previous.flags)
                entry.previous_msgid = previous.previous_msgid
            elif vanished.get(where):
                best = max(vanished[where], key=lambda e: difflib.SequenceMatcher(None, e.msgid, message).ratio())
                if difflib.SequenceMatcher(None, best.msgid, message).ratio() >= 0.5:
                    vanished[where].remove(best)
                    entry.msgstr = best.msgstr
                    entry.flags = ["fuzzy"]
                    entry.previous_msgid = best.msgid
            seen[message] = entry
            po.append(entry)
        path.parent.mkdir(parents=True, exist_ok=True)
        po.save(str(path))


def coverage(lang: str) -> List[Dict[str, object]]:
    rows = []
    for domain in all_sources():
        path = catalog_path(lang, domain)
        entries = [e for e in polib.pofile(str(path)) if not e.obsolete] if path.exists() else []
        translated = sum(1 for e in entries if e.msgstr and not e.fuzzy)
        fuzzy = sum(1 for e in entries if e.fuzzy)
        rows.append({"domain": domain, "messages": len(entries), "translated": translated, "fuzzy": fuzzy,
                     "untranslated": len(entries) - translated - fuzzy,
                     "percent": 100.0 * translated / len(entries) if entries else 100.0})
    return rows


CODE = re.compile(r"(`+)(.+?)\1", re.S)
MATH = re.compile(r"\$\$.+?\$\$|\$[^$]+?\$", re.S)
LINK_TARGET = re.compile(r"\]\(([^)\s]+)\)|<(https?://[^>]+)>|\{[\w:-]+\}`[^`]*`")
URL = re.compile(r"https?://[^\s)>\]]+")
NUMBER = re.compile(r"(?<![\w.])[-−]?\d[\d,]*(?:\.\d+)?")


def protected(text: str) -> Dict[str, Counter]:
    """What a translation must keep: inline code, math, link targets, URLs and the numbers of the prose."""
    def squeeze(span: str) -> str:  # a translation may re-flow the lines a span was broken across
        return " ".join(span.split())

    code = [squeeze(m.group(0)) for m in CODE.finditer(text)]
    rest = CODE.sub(" ", text)
    math = [squeeze(m.group(0)) for m in MATH.finditer(rest)]
    rest = MATH.sub(" ", rest)
    links = [m.group(0) for m in LINK_TARGET.finditer(rest)]
    urls = URL.findall(rest)
    rest = URL.sub(" ", LINK_TARGET.sub(" ", rest))
    numbers = [n.replace(",", "").replace("−", "-") for n in NUMBER.findall(rest)]
    return {"code": Counter(code), "math": Counter(math), "links": Counter(links), "urls": Counter(urls),
            "numbers": Counter(numbers)}


def problems(msgid: str, msgstr: str) -> List[str]:
    """Why ``msgstr`` is not a faithful translation of ``msgid`` (empty list: nothing found)."""
    want, got = protected(msgid), protected(msgstr)
    out = []
    for kind in want:
        missing = want[kind] - got[kind]
        extra = got[kind] - want[kind]
        if missing:
            out.append(f"{kind} missing from the translation: {sorted(missing)}")
        if extra:
            out.append(f"{kind} not in the English: {sorted(extra)}")
    if msgid.count("**") != msgstr.count("**"):
        out.append("bold markers (**) differ in number")
    return out


def validate(lang: str) -> List[str]:
    errors = []
    for domain in all_sources():
        path = catalog_path(lang, domain)
        if not path.exists():
            continue
        for e in polib.pofile(str(path)):
            if e.msgstr and not e.fuzzy:
                for p in problems(e.msgid, e.msgstr):
                    errors.append(f"{path.relative_to(ROOT)}: {e.msgid[:60]!r}: {p}")
    return errors


def main(argv: Optional[Iterable[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["extract", "coverage", "validate"])
    parser.add_argument("--lang", default="zh_CN", choices=LANGUAGES)
    parser.add_argument("--domain", action="append", help="extract: only this catalog (repeatable)")
    args = parser.parse_args(argv)
    if args.command == "extract":
        extract(args.lang, args.domain)
        print(f"updated {LOCALES / args.lang / 'LC_MESSAGES'}")
    elif args.command == "coverage":
        for row in coverage(args.lang):
            print(f"{row['domain']:24} {row['translated']:4}/{row['messages']:<4} {row['percent']:5.1f}%"
                  f"  fuzzy {row['fuzzy']}  untranslated {row['untranslated']}")
    else:
        errors = validate(args.lang)
        print("\n".join(errors) or "every translation keeps its code, math, links and numbers")
        return 1 if errors else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
