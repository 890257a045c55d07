"""The near-tie margins of the held-out evaluation cover what the stage record's two float paths move
(issue 45: the figure behind them comes from a record, `benchmarks/results/float_paths.json`, not from a
comment), and the Performance page quotes that record."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from benchmarks import float_paths
from minimind_ref import chat_eval

ROOT = Path(__file__).resolve().parents[1]
RECORD = json.loads(float_paths.RECORD.read_text(encoding="utf-8"))


def test_the_record_measured_every_shipped_stage_on_both_paths():
    from minimind_ref import stages

    assert set(RECORD["stages"]) == set(stages.available_stages())
    assert RECORD["capabilities"]["default"] == "DEFAULT" and RECORD["capabilities"]["native"] != "DEFAULT"
    assert RECORD["pairs"] > 100 and all(s["positions"] > 1000 for s in RECORD["stages"].values())
    for key in ("max_sum_diff", "max_pair_diff", "max_gap_diff"):
        assert RECORD[key] == max(s[key] for s in RECORD["stages"].values())


def test_the_near_tie_margins_are_ten_times_what_the_paths_moved():
    assert RECORD["margins"] == {"win_nats": chat_eval.WIN_TIE_MARGIN, "greedy_logits": chat_eval.GREEDY_TIE_MARGIN}
    assert 10 * RECORD["max_pair_diff"] < chat_eval.WIN_TIE_MARGIN
    assert 10 * RECORD["max_sum_diff"] < chat_eval.WIN_TIE_MARGIN
    assert 10 * RECORD["max_gap_diff"] < chat_eval.GREEDY_TIE_MARGIN


def test_the_performance_page_quotes_the_record():
    page = " ".join((ROOT / "book" / "performance.md").read_text(encoding="utf-8").split())
    assert float_paths.quote(RECORD) in page, float_paths.quote(RECORD)


def test_compare_takes_the_largest_difference_per_stage():
    a = {"x": {"chosen": torch.tensor([-1.0, -2.0]), "rejected": torch.tensor([-3.0, -4.0]),
               "gaps": torch.tensor([0.5, 0.25])}}
    b = {"x": {"chosen": torch.tensor([-1.0, -2.5]), "rejected": torch.tensor([-3.25, -4.0]),
               "gaps": torch.tensor([0.5, 0.0])}}
    out = float_paths.compare(a, b)
    assert out["stages"]["x"] == {"max_sum_diff": 0.5, "max_pair_diff": 0.5, "max_gap_diff": 0.25, "positions": 2}
    assert out["max_sum_diff"] == 0.5 and out["max_gap_diff"] == 0.25
