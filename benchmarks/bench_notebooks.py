"""Benchmark 6: the chapters' "Restart & Run All" times, as ``make timings`` measured them.

Running every chapter five times would take most of an hour, so the Performance page shows the
single timed run per chapter that ``make timings`` (``tools/time_notebooks.py``) records in
``book/notebook_timings.json`` on an idle machine, with that machine's description. These are
not ratios and no target depends on them; they tell a learner what to expect.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict

ROOT = Path(__file__).resolve().parent.parent
TIMINGS = ROOT / "book" / "notebook_timings.json"


def notebook_times(path: Path = TIMINGS) -> Dict[str, object]:
    data = json.loads(path.read_text(encoding="utf-8"))
    return {"machine": data["machine"]["device"], "date": data["machine"]["date"],
            "rows": [{"notebook": name, "seconds": seconds} for name, seconds in data["seconds"].items()]}
