"""Make every citation of upstream a link a reader can open.

    .venv/bin/python tools/link_citations.py          # rewrite the sources in place (idempotent)
    .venv/bin/python tools/link_citations.py --check  # change nothing; exit 1 while a citation is unlinked or misled

A citation in the course's form (``tools/check_upstream_citations.py``), an inline code span
```c090b69:trainer/train_grpo.py:95-156``` with an optional quoted fragment, renders on the site and in
Colab as a chip with nothing to click. This tool wraps each one in a markdown link to upstream's file at
that commit and those lines, keeping the span as the link's text, so the checker still reads it::

    [`c090b69:trainer/train_grpo.py:95-156`](https://github.com/jingyaogong/minimind/blob/<full commit>/trainer/train_grpo.py#L95-L156)

A citation already linked keeps its link when the link agrees with the text (the commit's full hash,
the path, the lines); one that disagrees is rewritten (``--check`` reports it instead).

**Where.** The book's pages (``book/*.md``), ``README.md``, the markdown cells of the chapters
(``notebooks/*.ipynb``), and the Chinese catalogs (``locales/*/LC_MESSAGES/*.po``: the English, the
translation and the previous English of each entry, so every translation stays matched to its English
and carries the same links). Not: code cells and Python files (no markdown renders there), fenced code
blocks and HTML comments, and ``CONTRIBUTING.md``, whose citations show the form itself.

**The full hash** of each cited commit comes from the checker's record (``tools/upstream_citations.json``,
its ``commit_sha``), so the tool needs no clone. After adding a citation: run the checker (it records
the new commit), then this tool, then the checker again (a link changes its paragraph, whose digest the
record holds). The student editions are made from the chapters afterwards (``make student``).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Tuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

import check_upstream_citations as cuc  # noqa: E402

#: Files whose markdown carries citations a reader sees (globs relative to the repository root).
SOURCES = ("book/*.md", "README.md", "notebooks/*.ipynb", "locales/*/LC_MESSAGES/*.po")
BLOB = "https://github.com/jingyaogong/minimind/blob/"
#: A link around a citation: ``[`...`](URL)``; the URL is read up to its closing parenthesis.
_LINK_AFTER = re.compile(r"\]\((?P<url>[^)\s]*)\)")
_FENCE = re.compile(r"^[ \t]*(```|~~~)", re.M)


def url_for(commit_sha: str, path: str, first: int, last: int) -> str:
    """The address of ``path`` at ``commit_sha`` on GitHub, lines ``first`` to ``last``."""
    lines = f"#L{first}" if first == last else f"#L{first}-L{last}"
    return f"{BLOB}{commit_sha}/{path}{lines}"


def known_commits(record: Optional[dict] = None) -> Dict[str, str]:
    """Short commit -> full hash, from the checker's record."""
    record = cuc.load_record() if record is None else record
    return {e["citation"][:7]: e["commit_sha"] for e in record["citations"] if e.get("commit_sha")}


def _skipped_ranges(text: str) -> List[Tuple[int, int]]:
    """Offsets of fenced code blocks and HTML comments: no links are made there."""
    ranges = [(m.start(), m.end()) for m in re.finditer(r"<!--.*?-->", text, re.S)]
    fences = [m.start() for m in _FENCE.finditer(text)]
    for start, end in zip(fences[::2], fences[1::2]):
        line_end = text.find("\n", end)
        ranges.append((start, len(text) if line_end < 0 else line_end))
    return ranges


def link_text(text: str, commits: Dict[str, str], problems: Optional[List[str]] = None, where: str = "") -> str:
    """``text`` with every citation linked (and every disagreeing link corrected). ``problems``, when
    given, receives one line per citation that was unlinked or whose link disagreed."""
    skipped = _skipped_ranges(text)
    out, pos = [], 0
    for m in cuc.CITATION.finditer(text):
        if any(a <= m.start() < b for a, b in skipped):
            continue
        commit, path = m.group("commit"), cuc._unescape_table(m.group("path"))
        first, last = int(m.group("first")), int(m.group("last") or m.group("first"))
        if commit not in commits:
            raise SystemExit(f"{where}: `{m.group('body')}`: commit {commit} is not in tools/upstream_citations.json; "
                             "run tools/check_upstream_citations.py --upstream <clone> first")
        url = url_for(commits[commit], path, first, last)
        linked = m.start() > 0 and text[m.start() - 1] == "[" and _LINK_AFTER.match(text, m.end())
        if linked:
            after = _LINK_AFTER.match(text, m.end())
            if after.group("url") == url:
                continue
            if problems is not None:
                problems.append(f"{where}: `{m.group('body')}` links to {after.group('url')}, not {url}")
            out.append(text[pos:after.start("url")])
            out.append(url)
            pos = after.end("url")
            continue
        if problems is not None:
            problems.append(f"{where}: `{m.group('body')}` is not a link")
        out.append(text[pos:m.start()])
        out.append(f"[{m.group(0)}]({url})")
        pos = m.end()
    out.append(text[pos:])
    return "".join(out)


def _notebook(path: Path, change: Callable[[str, str], str]) -> bool:
    nb = json.loads(path.read_text(encoding="utf-8"))
    changed = False
    for index, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "markdown":
            continue
        source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        new = change(source, f"{path.name} cell {index}")
        if new != source:
            lines = new.split("\n")
            cell["source"] = [line + "\n" for line in lines[:-1]] + ([lines[-1]] if lines[-1] else [])
            changed = True
    if changed:
        path.write_text(json.dumps(nb, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    return changed


def _catalog(path: Path, change: Callable[[str, str], str]) -> bool:
    import polib

    po = polib.pofile(str(path), wrapwidth=0)
    changed = False
    for entry in po:
        for attr in ("msgid", "msgstr", "previous_msgid"):
            value = getattr(entry, attr, None)
            if value:
                new = change(value, f"{path.name}: {entry.msgid[:50]!r}")
                if new != value:
                    setattr(entry, attr, new)
                    changed = True
    if changed:
        po.save(str(path))
    return changed


def source_files(root: Path = ROOT) -> List[Path]:
    return sorted({p for pattern in SOURCES for p in root.glob(pattern) if p.is_file()})


def run(files: Iterable[Path], commits: Dict[str, str], write: bool) -> List[str]:
    """Link every citation of ``files`` (in place when ``write``); returns what was unlinked or misled."""
    problems: List[str] = []

    def change(text: str, where: str) -> str:
        return link_text(text, commits, problems, where)

    for path in files:
        if path.suffix == ".ipynb":
            changed = _notebook(path, change) if write else _check(path, change)
        elif path.suffix == ".po":
            changed = _catalog(path, change) if write else _check(path, change)
        else:
            text = path.read_text(encoding="utf-8")
            new = change(text, path.name)
            changed = new != text
            if changed and write:
                path.write_text(new, encoding="utf-8")
        if changed and write:
            print(f"linked: {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    return problems


def _check(path: Path, change: Callable[[str, str], str]) -> bool:
    """Run ``change`` over a notebook's or catalog's texts without writing anything."""
    if path.suffix == ".ipynb":
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        texts = [("".join(c["source"]) if isinstance(c["source"], list) else c["source"], f"{path.name} cell {i}")
                 for i, c in enumerate(cells) if c["cell_type"] == "markdown"]
    else:
        import polib

        texts = [(getattr(e, a), f"{path.name}: {e.msgid[:50]!r}") for e in polib.pofile(str(path))
                 for a in ("msgid", "msgstr", "previous_msgid") if getattr(e, a, None)]
    return any(change(text, where) != text for text, where in texts)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 while a citation is unlinked")
    args = parser.parse_args(argv)
    problems = run(source_files(), known_commits(), write=not args.check)
    if args.check:
        for p in problems:
            print(p)
        print(f"{len(problems)} citations unlinked or linked elsewhere than their text says")
        return 1 if problems else 0
    print(f"{len(problems)} citations linked or corrected")
    return 0


if __name__ == "__main__":
    sys.exit(main())
