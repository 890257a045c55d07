"""Chapter 10's live-run record (``minimind_ref/checkpoints/lora_live_runs.json``, made by
``tools/lora_live_runs.py``): the runs the chapter's assert is measured on, one per seed and float
path (issue 45: a figure in a chapter comes from a record, not from numbers typed into a cell)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import lora_live_runs  # noqa: E402

from minimind_ref import chat_data  # noqa: E402


def test_the_record_holds_every_seed_on_both_float_paths():
    record = lora_live_runs.load_record()
    runs = record["runs"]
    assert sorted((r["seed"], r["path"]) for r in runs) == sorted(
        (s, p) for s in lora_live_runs.DEFAULT_SEEDS for p in lora_live_runs.DEFAULT_PATHS)
    n = len(chat_data.double_eval_exchanges("test"))
    for r in runs:
        assert r["n"] == n and 0 <= r["right"] <= n and abs(r["accuracy"] - r["right"] / n) < 1e-9, r
        assert (r["capability"] == "DEFAULT") == (r["path"] == "default"), r
    assert record["command"].startswith(lora_live_runs.COMMAND)


def test_the_chapter_reads_the_record_and_types_no_counts():
    import nbformat

    nb = nbformat.read(ROOT / "notebooks" / "10_lora.ipynb", as_version=4)
    cell = next(c for c in nb.cells if c.cell_type == "code" and "lora_live_runs.json" in c.source)
    assert "MEASURED" not in cell.source and "GAIN = 0." not in cell.source
