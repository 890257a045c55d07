"""List every citation of upstream MiniMind in the course and verify each one in upstream's git history.

    python tools/check_upstream_citations.py --upstream /path/to/minimind      # a clone with its history
    python tools/check_upstream_citations.py --upstream /path/to/minimind.git  # or a bare mirror
    python tools/check_upstream_citations.py --list                            # offline: what would be checked

Upstream (jingyaogong/minimind) is read only in git: ``git clone https://github.com/jingyaogong/minimind``
gives a clone with the whole history, in which both pinned commits (c090b69, MiniMind2; d65ef2c,
minimind-3) can be read file by file.

**The citation form.** An inline code span ``COMMIT:PATH:LINES``, optionally followed, inside the same
span and after one space, by a double-quoted fragment that must occur within those lines::

    `c090b69:model/model_minimind.py:196 "past_key_value is None"`
    `d65ef2c:dataset/lm_dataset.py:65-66`

COMMIT is a 7-hex upstream commit, PATH the file's path in upstream, LINES one line (``196``) or a
range (``52-66``). In a markdown table a ``|`` inside the span is written ``\\|``. Where a reader sees it
(the pages, the chapters' markdown, the Chinese catalogs) the span is the text of a link to that file at
that commit and those lines, ``[`d65ef2c:dataset/lm_dataset.py:65-66`](https://github.com/jingyaogong/minimind/blob/<full
commit>/dataset/lm_dataset.py#L65-L66)`` (``tools/link_citations.py`` makes the links); the link is
verified with its text: the commit's full hash, the path and the lines must be the span's. A link to a commit
of upstream on GitHub (``https://github.com/jingyaogong/minimind/tree/<sha>[/path]``) is checked the
same way (the commit, and the path when there is one). A commit named alone (``3a5aba8``) is checked
to be one of upstream's; a date written right after it (``3a5aba8 (2026-01-17)``, ``3a5aba8, dated
2026-01-17``) must be its date in git. Where a commit's author date and committer date differ, the text
says which it gives (``101d7df, authored 2026-03-24 and committed 2026-03-25``, or ``committed
2026-03-25`` alone); a bare date is then reported as ambiguous.

**Where.** The book's pages (``book/*.md``), ``README.md`` and ``CONTRIBUTING.md``, every cell of the
chapters (``notebooks/*.ipynb``: markdown, and the comments and strings of code), the Python files
of ``minimind_ref/``, ``tools/``, ``tests/`` and ``benchmarks/`` (docstrings and comments), and the
string values of the shipped training configs (``minimind_ref/configs/*.json``, read as JSON: a
recipe's ``_upstream`` notes cite the line of each hyperparameter; the place is the key's path). The
student editions and the Chinese catalogs are made from these (``tests/test_upstream_citations.py``
checks that the catalogs carry every citation through unchanged).

**Verified** means: the commit is in upstream's history (an ancestor of one of the clone's branches,
not only of a pull request's ref), the path exists at that commit, the lines exist, and the fragment,
whitespace runs counted as one space, occurs within them.

**The record** (``RECORD``, in the repository): every citation, the file and place it appears in
(heading, cell id or function), a digest of the paragraph (or table row) that holds it, its status,
and the commit of each branch of the checked clone. ``tests/test_upstream_citations.py`` (no network,
no clone) fails when the text holds a citation the record does not hold as verified, or holds it in
a paragraph that changed since the check (the record is older than the text it covers). After
editing a sentence that cites upstream, run this tool again and commit the record.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "tools" / "upstream_citations.json"

#: The two commits the course pins: named alone they need no record (no date written after them).
PINNED = {"c090b69": "c090b69", "d65ef2c": "d65ef2c"}

#: Files whose text is covered (globs relative to the repository root).
SOURCES = ("book/*.md", "README.md", "CONTRIBUTING.md", "notebooks/*.ipynb",
           "minimind_ref/**/*.py", "tools/*.py", "tests/*.py", "benchmarks/*.py", "minimind_ref/configs/*.json")
#: Files that hold citation-shaped examples on purpose (this tool, its test).
EXCLUDED = {"tools/check_upstream_citations.py", "tests/test_upstream_citations.py"}

_COMMIT = r"[0-9a-f]{7}"
#: `COMMIT:PATH:LINES` or `COMMIT:PATH:LINES "fragment"` in one or two backticks.
CITATION = re.compile(
    r"(?<!`)(?P<ticks>``?)(?P<body>(?P<commit>" + _COMMIT + r"):(?P<path>[A-Za-z0-9_][A-Za-z0-9_./-]*)"
    r":(?P<first>\d+)(?:-(?P<last>\d+))?(?: \"(?P<fragment>[^\"`]+)\")?)(?P=ticks)(?!`)")
#: The link around a citation (``[`COMMIT:PATH:LINES`](URL)``): what follows the span.
LINK_AFTER = re.compile(r"\]\((?P<url>[^)\s]*)\)")
BLOB = "https://github.com/jingyaogong/minimind/blob/"
#: A link to a commit (and maybe a file) of upstream on GitHub.
URL = re.compile(r"https://github\.com/jingyaogong/minimind/(?:tree|blob|commit)/(?P<commit>[0-9a-f]{7,40})"
                 r"(?:/(?P<path>[^\s)\]>#\"'`]+))?")
#: A commit named alone: 7 hex digits, at least one digit and one letter, not part of a longer word.
MENTION = re.compile(r"(?<![0-9A-Za-z_])(?=[0-9a-f]{0,6}[0-9])(?=[0-9a-f]{0,6}[a-f])(?P<commit>" + _COMMIT +
                     r")(?![0-9A-Za-z_])")
#: A date written right after a commit named alone: `abc1234 (2026-01-17`, `abc1234, 2026-01-17`,
#: `abc1234, dated 2026-01-17`, `abc1234, authored 2026-03-24 and committed 2026-03-25`.
DATE_AFTER = re.compile(r"\s*(?:\(|,)\s*(?:(?P<which>dated|authored|committed)\s+)?(?P<date>20\d\d-\d\d-\d\d)"
                        r"(?:,?\s+and\s+committed\s+(?P<committed>20\d\d-\d\d-\d\d))?")


@dataclass
class Occurrence:
    """One citation (or commit named alone) in one place of the course."""

    file: str
    where: str
    kind: str  # "citation", "url" or "mention"
    text: str  # the citation as written (table escapes removed), or the commit
    context: str  # digest of the paragraph or table row that holds it
    commit: str
    path: Optional[str] = None
    lines: Optional[Tuple[int, int]] = None
    fragment: Optional[str] = None
    date: Optional[str] = None
    status: str = "unchecked"
    detail: str = ""
    extra: Dict[str, str] = field(default_factory=dict)

    def key(self) -> Tuple[str, str, str, str, str]:
        return (self.file, self.where, self.kind, self.text, self.context)

    def to_json(self) -> dict:
        out = {"file": self.file, "where": self.where, "kind": self.kind, "citation": self.text,
               "context": self.context, "status": self.status}
        if self.detail:
            out["detail"] = self.detail
        if self.extra:
            out.update(self.extra)
        return out


# ----------------------------------------------------------------------------- reading the course
def _normalize(text: str) -> str:
    return " ".join(text.split())


def _digest(text: str) -> str:
    return hashlib.sha256(_normalize(text).encode("utf-8")).hexdigest()[:16]


def _context(text: str, start: int) -> str:
    """The paragraph holding offset ``start`` (a run of non-blank lines), or its line when that
    line is a row of a markdown table."""
    line_start = text.rfind("\n", 0, start) + 1
    line_end = text.find("\n", start)
    line_end = len(text) if line_end < 0 else line_end
    line = text[line_start:line_end]
    if line.lstrip().startswith("|"):
        return line
    lines = text.split("\n")
    index = text.count("\n", 0, start)
    lo = index
    while lo > 0 and lines[lo - 1].strip():
        lo -= 1
    hi = index
    while hi + 1 < len(lines) and lines[hi + 1].strip():
        hi += 1
    return "\n".join(lines[lo:hi + 1])


def _unescape_table(body: str) -> str:
    return body.replace("\\|", "|")


def find_in_text(text: str, file: str, where_at) -> List[Occurrence]:
    """Every citation, link and commit named alone in ``text``; ``where_at(offset)`` names the place."""
    found: List[Occurrence] = []
    taken = []
    for m in CITATION.finditer(text):
        body = _unescape_table(m.group("body"))
        first = int(m.group("first"))
        last = int(m.group("last") or first)
        fragment = m.group("fragment")
        occ = Occurrence(file, where_at(m.start()), "citation", body, _digest(_context(text, m.start())),
                         m.group("commit"), m.group("path"), (first, last),
                         _unescape_table(fragment) if fragment else None)
        taken.append((m.start(), m.end()))
        link = LINK_AFTER.match(text, m.end()) if m.start() > 0 and text[m.start() - 1] == "[" else None
        if link:
            occ.extra["url"] = link.group("url")
            taken.append((link.start(), link.end()))
        found.append(occ)
    for m in URL.finditer(text):
        if any(a <= m.start() < b for a, b in taken):
            continue  # the link of a citation: checked with it
        path = m.group("path")
        body = m.group("commit") + (f":{path}" if path else "")
        found.append(Occurrence(file, where_at(m.start()), "url", body, _digest(_context(text, m.start())),
                                m.group("commit"), path))
        taken.append((m.start(), m.end()))
    for m in MENTION.finditer(text):
        if any(a <= m.start() < b for a, b in taken):
            continue
        commit = m.group("commit")
        date = DATE_AFTER.match(text, m.end())
        if commit in PINNED and not date:
            continue  # the pinned commits named alone: nothing to check
        body, which = commit, None
        if date:
            which = date.group("which") if date.group("which") in ("authored", "committed") else None
            body += f" {which + ' ' if which else ''}{date.group('date')}"
            if date.group("committed"):
                body += f" committed {date.group('committed')}"
        occ = Occurrence(file, where_at(m.start()), "mention", body, _digest(_context(text, m.start())),
                         commit, date=date.group("date") if date else None)
        if which:
            occ.extra["which"] = which
        if date and date.group("committed"):
            occ.extra["committed"] = date.group("committed")
        found.append(occ)
    return found


_HEADING = re.compile(r"^#{1,6} +(.+?)\s*$", re.M)
_DEF = re.compile(r"^(?P<indent>[ \t]*)(?:async\s+)?(?:def|class)\s+(?P<name>\w+)", re.M)


def _heading_at(text: str):
    heads = [(m.start(), _normalize(m.group(1))) for m in _HEADING.finditer(text)]

    def where(offset: int) -> str:
        name = "top"
        for pos, title in heads:
            if pos <= offset:
                name = title
        return f"section: {name}"
    return where


def _qualname_at(text: str):
    defs = [(m.start(), len(m.group("indent").expandtabs()), m.group("name")) for m in _DEF.finditer(text)]

    def where(offset: int) -> str:
        stack: List[Tuple[int, str]] = []
        for pos, indent, name in defs:
            if pos > offset:
                break
            while stack and stack[-1][0] >= indent:
                stack.pop()
            stack.append((indent, name))
        return "module" if not stack else ".".join(n for _, n in stack)
    return where


def covered_files(root: Path = ROOT) -> List[Path]:
    files = set()
    for pattern in SOURCES:
        for path in root.glob(pattern):
            rel = path.relative_to(root).as_posix()
            if path.is_file() and rel not in EXCLUDED:
                files.add(path)
    return sorted(files)


def scan_file(path: Path, root: Path = ROOT) -> List[Occurrence]:
    rel = path.relative_to(root).as_posix()
    if path.suffix == ".ipynb":
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        found = []
        for index, cell in enumerate(cells):
            source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
            name = f"cell {cell.get('id', index)}"
            found += find_in_text(source, rel, lambda _offset, name=name: name)
        return found
    if path.suffix == ".json":
        return [occ for key, value in _json_strings(json.loads(path.read_text(encoding="utf-8")))
                for occ in find_in_text(value, rel, lambda _offset, key=key: f"key: {key}")]
    text = path.read_text(encoding="utf-8")
    where = _qualname_at(text) if path.suffix == ".py" else _heading_at(text)
    return find_in_text(text, rel, where)


def _json_strings(value, key: str = "") -> Iterator[Tuple[str, str]]:
    """Every string in a JSON value, with the path of keys that leads to it (``_upstream.lr``)."""
    if isinstance(value, str):
        yield key or "top", value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _json_strings(v, f"{key}.{k}" if key else str(k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _json_strings(v, f"{key}[{i}]")


def scan(root: Path = ROOT) -> List[Occurrence]:
    found: List[Occurrence] = []
    for path in covered_files(root):
        found += scan_file(path, root)
    return found


# ----------------------------------------------------------------------------- checking in git
class Upstream:
    """Upstream's git history (a clone or a bare mirror), read with git alone."""

    def __init__(self, location: Path):
        self.location = Path(location)
        self._files: Dict[Tuple[str, str], Optional[str]] = {}
        self._commits: Dict[str, Optional[str]] = {}
        self._upstream: Dict[str, bool] = {}
        self.branches = self._branches()
        if not self.branches:
            raise SystemExit(f"{location}: no branches found; give a clone of jingyaogong/minimind with its history")

    def git(self, *args: str, check: bool = True) -> str:
        done = subprocess.run(["git", "-C", str(self.location), *args], capture_output=True, text=True)
        if check and done.returncode != 0:
            raise RuntimeError(f"git {' '.join(args)}: {done.stderr.strip()}")
        return done.stdout if done.returncode == 0 else ""

    def _branches(self) -> Dict[str, str]:
        out = self.git("for-each-ref", "--format=%(refname) %(objectname)", "refs/heads", "refs/remotes/origin")
        refs = {}
        for line in out.splitlines():
            name, sha = line.split()
            if not name.endswith("/HEAD"):
                refs[name] = sha
        return refs

    def resolve(self, commit: str) -> Optional[str]:
        if commit not in self._commits:
            out = self.git("rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}", check=False).strip()
            self._commits[commit] = out or None
        return self._commits[commit]

    def in_history(self, sha: str) -> bool:
        if sha not in self._upstream:
            self._upstream[sha] = any(
                subprocess.run(["git", "-C", str(self.location), "merge-base", "--is-ancestor", sha, head],
                               capture_output=True).returncode == 0 for head in self.branches.values())
        return self._upstream[sha]

    def file(self, sha: str, path: str) -> Optional[str]:
        if (sha, path) not in self._files:
            done = subprocess.run(["git", "-C", str(self.location), "show", f"{sha}:{path}"], capture_output=True)
            self._files[(sha, path)] = done.stdout.decode("utf-8", errors="replace") if done.returncode == 0 else None
        return self._files[(sha, path)]

    def dates(self, sha: str) -> Tuple[str, str]:
        out = self.git("log", "-1", "--format=%ad %cd", "--date=short", sha).split()
        return out[0], out[1]


def citation_url(commit_sha: str, path: str, lines: Tuple[int, int]) -> str:
    """Where a citation's link must point: ``path`` at the full ``commit_sha``, its lines."""
    first, last = lines
    return f"{BLOB}{commit_sha}/{_unescape_table(path)}" + (f"#L{first}" if first == last else f"#L{first}-L{last}")


def link_problem(occ: Occurrence, commit_sha: Optional[str]) -> Optional[str]:
    """Why a linked citation's URL disagrees with its text (None when it agrees or is not linked)."""
    url = occ.extra.get("url")
    if url is None or occ.path is None or occ.lines is None:
        return None
    if not commit_sha:
        return f"`{occ.text}`: the full hash of {occ.commit} is unknown, so its link cannot be checked"
    wanted = citation_url(commit_sha, occ.path, occ.lines)
    return None if url == wanted else f"`{occ.text}` links to {url}, not to {wanted}"


def verify(occ: Occurrence, upstream: Upstream) -> Occurrence:
    sha = upstream.resolve(occ.commit)
    if sha is None:
        occ.status, occ.detail = "unknown commit", f"{occ.commit} is not a commit of the checked clone"
        return occ
    occ.extra["commit_sha"] = sha
    if not upstream.in_history(sha):
        occ.status, occ.detail = "not upstream", (f"{occ.commit} is not in the history of upstream's branches "
                                                  f"(a fork's or a pull request's commit)")
        return occ
    if occ.kind == "mention":
        author, committer = upstream.dates(sha)
        occ.extra["date_in_git"] = author if author == committer else f"{author} (committed {committer})"
        which = occ.extra.get("which")
        if occ.date:
            wanted = {"authored": (author,), "committed": (committer,)}.get(which, (author, committer))
            if occ.date not in wanted or occ.extra.get("committed", committer) != committer:
                occ.status, occ.detail = "wrong date", (f"{occ.commit} is authored {author} and committed {committer} in "
                                                        f"git; the text says {occ.text[len(occ.commit) + 1:]}")
                return occ
            if author != committer and not which:
                occ.status, occ.detail = "ambiguous date", (f"{occ.commit} was authored {author} and committed {committer}: "
                                                            f"say which (`{occ.commit}, authored {author} and committed "
                                                            f"{committer}`)")
                return occ
        occ.status = "verified"
        return occ
    if occ.path is None:
        occ.status = "verified"
        return occ
    content = upstream.file(sha, occ.path.rstrip("/"))
    if content is None:
        tree = upstream.git("ls-tree", sha, occ.path.rstrip("/"), check=False)
        occ.status = "verified" if (occ.kind == "url" and tree.strip()) else "missing path"
        if occ.status != "verified":
            occ.detail = f"{occ.path} does not exist at {occ.commit}"
        return occ
    if occ.lines is None:
        occ.status = "verified"
        return occ
    lines = content.split("\n")
    if content.endswith("\n"):
        lines = lines[:-1]
    first, last = occ.lines
    if not (1 <= first <= last <= len(lines)):
        occ.status, occ.detail = "missing lines", f"{occ.path} has {len(lines)} lines at {occ.commit}, not {first}-{last}"
        return occ
    if occ.fragment and _normalize(occ.fragment) not in _normalize("\n".join(lines[first - 1:last])):
        occ.status, occ.detail = "fragment not found", (f"{occ.fragment!r} does not occur in lines {first}-{last} of "
                                                        f"{occ.path} at {occ.commit}")
        return occ
    problem = link_problem(occ, sha)
    if problem:
        occ.status, occ.detail = "wrong link", problem
        return occ
    occ.status = "verified"
    return occ


# ----------------------------------------------------------------------------- the record
def load_record(path: Path = RECORD) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def record_keys(record: dict) -> Dict[Tuple[str, str, str, str, str], dict]:
    return {(e["file"], e["where"], e["kind"], e["citation"], e["context"]): e for e in record["citations"]}


def compare_with_record(found: List[Occurrence], record: dict) -> List[str]:
    """What the text holds that the record does not hold as verified (empty: the record covers it)."""
    keys = record_keys(record)
    problems = []
    recorded_places = {(e["file"], e["kind"], e["citation"]) for e in record["citations"]}
    for occ in found:
        entry = keys.get(occ.key())
        if entry is None:
            if (occ.file, occ.kind, occ.text) in recorded_places:
                problems.append(f"{occ.file} ({occ.where}): `{occ.text}`: the text around it changed since the "
                                "check (the record is older than the text it covers)")
            else:
                problems.append(f"{occ.file} ({occ.where}): `{occ.text}` is not in the record")
        elif entry["status"] != "verified":
            problems.append(f"{occ.file} ({occ.where}): `{occ.text}`: {entry['status']}: {entry.get('detail', '')}")
    shas = {e["citation"][:7]: e["commit_sha"] for e in record["citations"] if e.get("commit_sha")}
    for occ in found:
        problem = link_problem(occ, shas.get(occ.commit))
        if problem:
            problems.append(f"{occ.file} ({occ.where}): {problem}")
    current = {occ.key() for occ in found}
    for key, entry in keys.items():
        if key not in current:
            problems.append(f"{entry['file']} ({entry['where']}): the record holds `{entry['citation']}`, which the text "
                            "no longer has there")
    return problems


def write_record(found: List[Occurrence], upstream: Upstream, path: Path = RECORD) -> dict:
    counts: Dict[str, int] = {}
    for occ in found:
        counts[occ.status] = counts.get(occ.status, 0) + 1
    record = {
        "about": "Citations of upstream MiniMind (jingyaogong/minimind) in the course, each verified in upstream's "
                 "git history by tools/check_upstream_citations.py; tests/test_upstream_citations.py compares "
                 "the course's text with this record.",
        "upstream_branches": dict(sorted(upstream.branches.items())),
        "counts": dict(sorted(counts.items())),
        "citations": sorted((occ.to_json() for occ in found),
                            key=lambda e: (e["file"], e["where"], e["kind"], e["citation"], e["context"])),
    }
    path.write_text(json.dumps(record, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    return record


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--upstream", type=Path, help="a clone of jingyaogong/minimind with its history (or a bare mirror)")
    parser.add_argument("--list", action="store_true", help="list what would be checked, offline, and compare with the record")
    parser.add_argument("--record", type=Path, default=RECORD, help=f"where the record goes (default {RECORD.relative_to(ROOT)})")
    args = parser.parse_args(argv)
    found = scan()
    if args.list or args.upstream is None:
        for occ in found:
            print(f"{occ.file} | {occ.where} | {occ.kind} | {occ.text}")
        problems = compare_with_record(found, load_record(args.record)) if args.record.exists() else ["no record"]
        print(f"{len(found)} citations; against the record: {len(problems)} problems")
        for p in problems:
            print("  " + p)
        return 1 if problems else 0
    upstream = Upstream(args.upstream)
    for occ in found:
        verify(occ, upstream)
    record = write_record(found, upstream, args.record)
    bad = [occ for occ in found if occ.status != "verified"]
    for occ in bad:
        print(f"{occ.file} ({occ.where}): `{occ.text}`: {occ.status}: {occ.detail}")
    kinds = {k: sum(o.kind == k for o in found) for k in ("citation", "url", "mention")}
    print(f"{len(found)} found ({kinds['citation']} citations, {kinds['url']} links, {kinds['mention']} commits "
          f"named alone with a date or outside the pinned two); {len(found) - len(bad)} verified "
          f"({100.0 * (len(found) - len(bad)) / max(len(found), 1):.1f} %); record: {args.record}; "
          f"checked clone: {', '.join(f'{k} {v[:7]}' for k, v in record['upstream_branches'].items())}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
