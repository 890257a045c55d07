"""Benchmark 6: wall time of each chapter notebook under nbval (kernel start included)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

ROOT = Path(__file__).resolve().parent.parent


def notebook_times() -> List[Dict[str, object]]:
    rows = []
    for nb in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        start = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(nb.relative_to(ROOT))],
            cwd=ROOT, capture_output=True, text=True,
        )
        rows.append({"notebook": nb.name, "seconds": time.perf_counter() - start, "passed": proc.returncode == 0})
    return rows
