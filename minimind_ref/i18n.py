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
2. else the translation of the template that matches the whole text (each placeholder matching as
   little as it can), preferring templates with more literal characters, with every matched value
   translated in turn (a label such as ``"x of shape (4, 16)"`` inside a message is a message too);
3. else, for text around whitespace, a multi-line text, or sentences joined by ``". "`` / ``"; "``,
   the translation of each part (the spaces, lines and sentences that do not match stay as they are).

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


class _Template(NamedTuple):
    literal: int           # how many literal characters (the preference between matching templates)
    anchor: str            # its longest literal run: a quick test before the regular expression
    pattern: "re.Pattern[str]"
    fields: Tuple[int, ...]  # the placeholder number of each group, in order
    msgstr: str


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


class Catalog:
    """The usable (translated, not fuzzy) entries of one language, ready to match messages."""

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
                                           re.compile(regex, re.S), tuple(p for p in parts if isinstance(p, int)),
                                           msgstr))
        self.templates = sorted(templates, key=lambda t: -t.literal)
        self.translate = lru_cache(maxsize=4096)(self._translate)  # type: ignore[method-assign]

    def _whole(self, text: str) -> Optional[str]:
        """Steps 1 and 2 of the module's docstring: ``text`` as one message, or None."""
        if text in self.exact:
            return self.exact[text]
        for t in self.templates:
            if t.anchor in text:
                m = t.pattern.fullmatch(text)
                if m:
                    return _fill(t.msgstr, {f: self.translate(v) for f, v in zip(t.fields, m.groups())})
        return None

    def _translate(self, text: str) -> str:
        whole = self._whole(text)
        if whole is not None:
            return whole
        core = text.strip()
        if core != text:
            if not core:
                return text
            start = text.index(core)
            return text[:start] + self.translate(core) + text[start + len(core):]
        if "\n" in text:
            return "\n".join(self.translate(line) for line in text.split("\n"))
        return self._sentences(text)

    def _sentences(self, text: str) -> str:
        """Sentences joined by ". " or "; " (``hint_a + " " + hint_b``): the longest runs of them
        that match, from the left; a sentence that matches nothing stays as it is."""
        cuts = [m.span() for m in _SENTENCE_END.finditer(text)]
        if not cuts:
            return text
        starts = [0] + [end for _, end in cuts]
        ends = [start for start, _ in cuts] + [len(text)]
        out, i = [], 0
        while i < len(starts):
            for j in range(len(starts) - 1, i - 1, -1):
                if i == 0 and j == len(starts) - 1:
                    continue  # the whole text: already tried
                piece = text[starts[i]:ends[j]]
                found = self._whole(piece)
                if found is not None or j == i:
                    out.append(found if found is not None else piece)
                    if j + 1 < len(starts):
                        out.append(text[ends[j]:starts[j + 1]])
                    i = j + 1
                    break
        return "".join(out)


@lru_cache(maxsize=None)
def _catalog(lang: str) -> Catalog:
    path = LOCALE_DIR / lang / "LC_MESSAGES" / f"{DOMAIN}.po"
    if not path.exists():
        return Catalog([])
    return Catalog(parse_po(path.read_text(encoding="utf-8")))
