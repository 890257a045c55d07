"""The solution markers of a chapter's exercise cells: what ``# BEGIN SOLUTION`` ... ``# END SOLUTION``
looks like, and the message a ``# BEGIN SOLUTION: <text>`` marker carries.

Two tools read them: ``tools/make_student.py`` replaces each marked block with a stub that shows the
marker's text, and ``tools/i18n.py`` extracts those texts into the chapter's translation catalog. Both
import this module, so neither imports the other for it (``tests/test_architecture.py``).
"""

from __future__ import annotations

import re
from typing import List

BEGIN = re.compile(r"^(?P<indent>[ \t]*)#\s*BEGIN SOLUTION\b[ \t]*:?[ \t]*(?P<text>.*?)\s*$")
END = re.compile(r"^[ \t]*#\s*END SOLUTION\b")


def has_solution(source: str) -> bool:
    """Whether a cell's ``source`` holds a ``# BEGIN SOLUTION`` marker."""
    return any(BEGIN.match(line) for line in source.splitlines())


def marker_texts(source: str) -> List[str]:
    """The texts of the ``# BEGIN SOLUTION: <text>`` markers of ``source`` (the stubs' messages)."""
    return [m.group("text") for m in map(BEGIN.match, source.splitlines()) if m and m.group("text")]
