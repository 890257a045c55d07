"""The language of the exercise checks' messages (English by default, or Simplified Chinese).

A kernel chooses the language once, in its first cell, with a call or an environment variable::

    import minimind_ref.i18n
    minimind_ref.i18n.set_language("zh")      # or, before starting Jupyter: export MINIMIND_LANG=zh

``get_language()`` is the explicit choice if there is one, else ``$MINIMIND_LANG``, else ``"en"``.
``minimind_ref.checks.core`` passes every text it shows through ``translate``.

How ``translate`` works. The checks build their messages with f-strings, so a message is not a fixed
string. The catalog (``locale/<lang>/LC_MESSAGES/checks.po``, made by ``tools/i18n_checks.py`` from
the check sources) holds *templates*: the literal text of each f-string with its replacement fields
written ``{0}``, ``{1}``, ... (literal braces doubled); the translation uses the same placeholders,
in any order. ``translate(text)`` returns, in this order:

1. the translation of ``text`` itself, if it is a template without placeholders;
2. else the translation of a template that matches the whole text, with every matched value
   translated in turn (a label such as ``"x of shape (4, 16)"`` inside a message is a message too).
   Each value is as short as it can be while its brackets balance (``(2, 3)`` is never cut at its
   ``", "``). When several templates match, the one that explains most of the text wins: its
   literal characters plus those of the templates matched inside its values (ties: the template
   with more literal characters). Two values side by side (``{1}{2}``) are cut where that count is
   largest. A template of punctuation alone (``"{0}: {1}"``) is used only when a value matches;
3. else, for text around whitespace, a multi-line text (line by line), or sentences joined by
   ``". "`` / ``"; "``, the translation of each part (parts that match nothing stay as they are).

Text that matches nothing is returned unchanged, so a new English message shows in English until
the catalog has it. The catalog is read with the small parser below (no dependency on ``polib``).
"""

from __future__ import annotations

import ast
import os
import re
from functools import lru_cache
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional, Tuple

__all__ = ["ENV_VAR", "available_languages", "get_language", "set_language", "translate"]

ENV_VAR = "MINIMIND_LANG"
DEFAULT = "en"
DOMAIN = "checks"
LOCALE_DIR = Path(__file__).resolve().parent / "locale"
# What set_language and $MINIMIND_LANG accept (case and "-"/"_" do not matter) -> the language.
_ALIASES = {"en": "en", "zh": "zh_CN", "zh_cn": "zh_CN"}
_ACCEPTED = "'en', 'zh' or 'zh_CN'"

_chosen: Optional[str] = None  # set_language's choice; None: the environment variable decides


def _normalize(lang: object, where: str) -> str:
    key = lang.strip().replace("-", "_").lower() if isinstance(lang, str) else None
    if key not in _ALIASES:
        raise ValueError(f"{where}: unknown language {lang!r}; the checks' messages exist in {_ACCEPTED} "
                         "(English is the default).")
    return _ALIASES[key]


def set_language(lang: Optional[str]) -> str:
    """Choose the language of this kernel's check messages: ``"en"``, ``"zh"`` or ``"zh_CN"`` (both
    Simplified Chinese). ``None`` forgets the choice (back to ``$MINIMIND_LANG``, or English).
    Returns the language now in use; anything else raises ``ValueError``."""
    global _chosen
    _chosen = None if lang is None else _normalize(lang, "set_language")
    return get_language()


def get_language() -> str:
    """``"en"`` or ``"zh_CN"``: ``set_language``'s choice, else ``$MINIMIND_LANG``, else English."""
    if _chosen is not None:
        return _chosen
    env = os.environ.get(ENV_VAR, "").strip()
    return _normalize(env, f"the environment variable {ENV_VAR}") if env else DEFAULT


def available_languages() -> Tuple[str, ...]:
    """English and every language with a catalog shipped in the package, e.g. ``("en", "zh_CN")``."""
    found = sorted(p.parent.parent.name for p in LOCALE_DIR.glob(f"*/LC_MESSAGES/{DOMAIN}.po"))
    return (DEFAULT, *found)


def translate(text: str, lang: Optional[str] = None) -> str:
    """``text`` in ``lang`` (default: ``get_language()``); unchanged in English or when no
    template of the catalog matches it."""
    lang = get_language() if lang is None else _normalize(lang, "translate")
    if lang == DEFAULT or not isinstance(text, str) or not text:
        return text
    return _catalog(lang).translate(text)


# --------------------------------------------------------------------------------------------
# Reading a .po catalog (the subset gettext tools write: comments, flags, msgid/msgstr strings)
# --------------------------------------------------------------------------------------------

def parse_po(source: str) -> List[Tuple[str, str, bool]]:
    """(msgid, msgstr, fuzzy) of every entry but the header and obsolete (``#~``) ones."""
    entries: List[Tuple[str, str, bool]] = []
    fields: Dict[str, str] = {}
    flags: List[str] = []
    key: Optional[str] = None

    def flush() -> None:
        nonlocal fields, flags, key
        if "msgid" in fields and fields["msgid"] and "msgctxt" not in fields:
            entries.append((fields["msgid"], fields.get("msgstr", ""), "fuzzy" in flags))
        fields, flags, key = {}, [], None

    for number, raw in enumerate(source.splitlines(), 1):
        line = raw.strip()
        if not line:
            flush()
        elif line.startswith("#"):
            if key is not None and key != "comment":
                flush()
            key = key or "comment"
            if line.startswith("#,"):
                flags += [f.strip() for f in line[2:].split(",")]
        elif line.startswith('"'):
            if key is None or key == "comment":
                raise ValueError(f"line {number}: a string outside an entry")
            fields[key] += _unquote(line, number)
        else:
            word, _, rest = line.partition(" ")
            if word not in ("msgid", "msgstr", "msgctxt", "msgid_plural") and not word.startswith("msgstr["):
                raise ValueError(f"line {number}: unexpected {word!r}")
            if word == "msgid" and "msgid" in fields:
                flush()
            key = "msgstr" if word == "msgstr[0]" else word
            fields[key] = _unquote(rest.strip(), number)
    flush()
    return entries


def _unquote(token: str, number: int) -> str:
    if len(token) < 2 or not (token.startswith('"') and token.endswith('"')):
        raise ValueError(f"line {number}: expected a quoted string, got {token!r}")
    return ast.literal_eval(token)  # PO escapes (\n \t \" \\) are Python's


# --------------------------------------------------------------------------------------------
# Matching messages against the templates
# --------------------------------------------------------------------------------------------

_FIELD = re.compile(r"\{\{|\}\}|\{(\d+)\}")
_SENTENCE_END = re.compile(r"(?<=[.;!?])\s+(?=\S)")
_OPEN, _CLOSE = "([{（", ")]}）"
_CUT_BEFORE = set(" ,;:.(（")  # where two adjacent values may meet (besides after a space)
_LETTER = re.compile(r"[A-Za-z]")
_BUDGET = 4000  # steps of the bracket-balanced matcher before it gives up on a template
_LONG = 2000    # longer texts (a learner's huge list in "got [...]") skip the searches below


class _Template(NamedTuple):
    literal: int               # how many literal characters
    anchor: str                # its longest literal run: a quick test before the regular expression
    pattern: "re.Pattern[str]"
    parts: Tuple[object, ...]  # literal strings and placeholder numbers (ints), in order
    runs: Tuple[Tuple[int, ...], ...]  # the placeholders, grouped into runs of adjacent ones ({1}{2})
    punctuation: bool          # no letter in its literal text ("{0}: {1}")
    msgstr: str


def _runs(parts: List[object]) -> Tuple[Tuple[int, ...], ...]:
    runs: List[List[int]] = []
    for i, p in enumerate(parts):
        if isinstance(p, int):
            if i and isinstance(parts[i - 1], int):
                runs[-1].append(p)
            else:
                runs.append([p])
    return tuple(tuple(r) for r in runs)


def _parts(template: str) -> List[object]:
    """Literal strings and placeholder numbers (ints), in order."""
    out: List[object] = []
    pos = 0
    for m in _FIELD.finditer(template):
        out.append(template[pos:m.start()])
        out.append(m.group(0)[0] if m.group(1) is None else int(m.group(1)))
        pos = m.end()
    out.append(template[pos:])
    merged: List[object] = []
    for part in out:
        if isinstance(part, str) and merged and isinstance(merged[-1], str):
            merged[-1] += part
        elif part != "":
            merged.append(part)
    return merged


def _fill(msgstr: str, values: Dict[int, str]) -> str:
    return "".join(values.get(p, "{%d}" % p) if isinstance(p, int) else p for p in _parts(msgstr))


def _balanced(text: str) -> bool:
    """Brackets close in order: a value such as ``(2, 3)`` is never cut at its inner ``", "``."""
    stack: List[str] = []
    for ch in text:
        if ch in _OPEN:
            stack.append(_CLOSE[_OPEN.index(ch)])
        elif ch in _CLOSE:
            if not stack or stack.pop() != ch:
                return False
    return not stack


def _values(parts: Tuple[object, ...], text: str) -> Optional[List[Tuple[int, ...]]]:
    """Where the placeholders of a template lie in ``text``: the first assignment (each value as
    short as it can be) in which every value is bracket-balanced, as ``(start, end)`` per run of
    adjacent placeholders, or None (no such assignment, or too many steps)."""
    spans: List[Tuple[int, ...]] = []
    steps = [0]

    def match(i: int, pos: int) -> bool:
        steps[0] += 1
        if steps[0] > _BUDGET:
            return False
        if i == len(parts):
            return pos == len(text)
        part = parts[i]
        if isinstance(part, str):
            return text.startswith(part, pos) and match(i + 1, pos + len(part))
        j = i
        while j < len(parts) and isinstance(parts[j], int):
            j += 1
        ends = [len(text)] if j == len(parts) else []
        if j < len(parts):
            k = text.find(parts[j], pos)  # type: ignore[arg-type]
            while k >= 0:
                ends.append(k)
                k = text.find(parts[j], k + 1)  # type: ignore[arg-type]
        for end in ends:
            if _balanced(text[pos:end]):
                spans.append((pos, end))
                if match(j, end):
                    return True
                spans.pop()
        return False

    return spans if match(0, 0) else None


class Catalog:
    """The usable (translated, not fuzzy) entries of one language, ready to match messages.

    Internally every translation comes with its *coverage*: how many characters of the English
    were matched by literal text of the catalog (a template's own text plus the coverage of its
    values). Between templates that match a text, and between the ways to cut two adjacent values
    apart, the one with the larger coverage wins (ties: the template with more literal characters;
    the first cut)."""

    def __init__(self, entries: List[Tuple[str, str, bool]]) -> None:
        self.exact: Dict[str, str] = {}
        templates: List[_Template] = []
        for msgid, msgstr, fuzzy in entries:
            if fuzzy or not msgstr:
                continue
            parts = _parts(msgid)
            literals = [p for p in parts if isinstance(p, str)]
            if all(isinstance(p, str) for p in parts):
                self.exact["".join(literals)] = _fill(msgstr, {})
            elif literals:  # a template of placeholders alone would match anything
                regex = "".join(re.escape(p) if isinstance(p, str) else "(.*?)" for p in parts)
                templates.append(_Template(sum(map(len, literals)), max(literals, key=len),
                                           re.compile(regex, re.S), tuple(parts), _runs(parts),
                                           not any(_LETTER.search(p) for p in literals), msgstr))
        self.templates = sorted(templates, key=lambda t: -t.literal)
        self._tr = lru_cache(maxsize=8192)(self._translate)
        self._whole = lru_cache(maxsize=8192)(self._match)

    def translate(self, text: str) -> str:
        return self._tr(text)[0]

    # -- one message
    def _match(self, text: str) -> Optional[Tuple[str, int]]:
        """Steps 1 and 2 of the module's docstring: (translation, coverage) of ``text`` as one
        message, or None."""
        if text in self.exact:
            return self.exact[text], len(text)
        best: Optional[Tuple[str, int]] = None
        for t in self.templates:
            if best is not None and best[1] == len(text):
                break
            if t.anchor not in text or not t.pattern.fullmatch(text):
                continue
            spans = _values(t.parts, text) if len(text) <= _LONG else None
            if spans is not None:
                run_texts = [text[a:b] for a, b in spans]
            else:  # no bracket-balanced reading: the regular expression's (each value as short as it can be)
                groups = iter(t.pattern.fullmatch(text).groups())  # type: ignore[union-attr]
                run_texts = ["".join(next(groups) for _ in run) for run in t.runs]
            out: Dict[int, str] = {}
            inner = 0
            for run, value in zip(t.runs, run_texts):
                for field, piece in zip(run, self._cut(value, len(run))):
                    out[field], c = self._tr(piece)
                    inner += c
            if not inner and t.punctuation:
                continue  # punctuation alone ("{0}: {1}") is no reason to take a text apart
            covered = t.literal + inner
            candidate = (_fill(t.msgstr, out), covered)
            if best is None or candidate[1] > best[1]:
                best = candidate
        return best

    def _cut(self, text: str, n: int) -> List[str]:
        """``text`` cut into the values of ``n`` adjacent placeholders (``{1}{2}``): the cut with the
        largest coverage (``"2" + ", one expert unused"``, ``"this looks like ...: " + "merge_pair(...)"``),
        both sides bracket-balanced when possible; a run of three or more is cut pair by pair."""
        if n == 1:
            return [text]
        if len(text) > _LONG:  # as the regular expression reads it: the first values empty
            return [""] * (n - 1) + [text]
        cuts = [c for c in range(len(text) + 1)
                if c in (0, len(text)) or text[c - 1].isspace() or text[c] in _CUT_BEFORE]
        balanced = [c for c in cuts if _balanced(text[:c]) and _balanced(text[c:])] or cuts
        best_cut, best_cov = 0, -1
        for c in balanced:
            cov = (self._tr(text[:c])[1] if c else 0) + (self._tr(text[c:])[1] if c < len(text) else 0)
            if cov > best_cov:
                best_cut, best_cov = c, cov
        return [text[:best_cut]] + self._cut(text[best_cut:], n - 1)

    # -- anything
    def _translate(self, text: str) -> Tuple[str, int]:
        whole = self._whole(text)
        if whole is not None:
            return whole
        core = text.strip()
        if core != text:
            if not core:
                return text, 0
            start = text.index(core)
            inner, covered = self._tr(core)
            return text[:start] + inner + text[start + len(core):], covered
        if "\n" in text:
            lines = [self._tr(line) for line in text.split("\n")]
            return "\n".join(line for line, _ in lines), sum(c for _, c in lines)
        return self._sentences(text)

    def _sentences(self, text: str) -> Tuple[str, int]:
        """Sentences joined by ". " or "; " (``hint_a + " " + hint_b``): the longest runs of them
        that match, from the left; a sentence that matches nothing stays as it is."""
        cuts = [m.span() for m in _SENTENCE_END.finditer(text)]
        if not cuts or len(text) > _LONG or len(cuts) > 40:
            return text, 0
        starts = [0] + [end for _, end in cuts]
        ends = [start for start, _ in cuts] + [len(text)]
        out, covered, i = [], 0, 0
        while i < len(starts):
            for j in range(len(starts) - 1, i - 1, -1):
                if i == 0 and j == len(starts) - 1:
                    continue  # the whole text: already tried
                piece = text[starts[i]:ends[j]]
                found = self._whole(piece)
                if found is not None or j == i:
                    out.append(found[0] if found is not None else piece)
                    covered += found[1] if found is not None else 0
                    if j + 1 < len(starts):
                        out.append(text[ends[j]:starts[j + 1]])
                    i = j + 1
                    break
        return "".join(out), covered


@lru_cache(maxsize=None)
def _catalog(lang: str) -> Catalog:
    path = LOCALE_DIR / lang / "LC_MESSAGES" / f"{DOMAIN}.po"
    if not path.exists():
        return Catalog([])
    return Catalog(parse_po(path.read_text(encoding="utf-8")))
