"""The stage report (book/performance.md) is produced by code, never typed: the committed table is
what `make report` renders from the seeded rebuild's record (minimind_ref/checkpoints/stage_seeds.json,
written by `python -m minimind_ref.stages rebuild --seeds 0,1,2,3,4 --paths native,default`); the
shipped stage files are the first seed's models on the first float path with the figures the record
holds for them; every claim a chapter makes about a stage's effect (``stages.STAGE_CLAIMS``) agrees
with the record over every seed and float path; and no run of a later stage destroyed a skill its
parent had. The rebuild's machinery: tests/test_stage_seeds.py."""

import copy
from pathlib import Path

import pytest

from minimind_ref import stages

ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "benchmarks" / "results" / "stage_report.md"
FIGURE = ROOT / "benchmarks" / "results" / "figures" / "stage_report.png"


@pytest.fixture(scope="module")
def records():
    return stages.load_seed_records()


def test_committed_table_is_the_rendered_seed_record(records):
    assert TABLE.read_text(encoding="utf-8") == stages.render_seed_report(records), (
        "benchmarks/results/stage_report.md is out of date: run `make report` (and commit the table)")
    assert FIGURE.is_file() and FIGURE.stat().st_size > 10_000


def test_the_record_has_five_seeds_on_both_float_paths_of_every_stage(records):
    assert len(records["seeds"]) >= 5
    assert {"native", "default"} <= set(records["paths"])
    assert records["capabilities"]["default"] == "DEFAULT"
    for name in ("base",) + stages.SEEDED_STAGES:
        assert sorted(records["stages"][name], key=int) == [str(s) for s in records["seeds"]], name
        for seed, per_path in records["stages"][name].items():
            assert sorted(per_path) == sorted(records["paths"]), (name, seed)
            for path, entry in per_path.items():
                assert set(stages.REPORT_KEYS) <= set(entry["metrics"]), (name, seed, path)


def test_shipped_stages_are_the_first_seeds_models(records):
    ship = records["ship"]
    assert ship == {"seed": records["seeds"][0], "path": records["paths"][0]}
    for name in stages.SEEDED_STAGES:
        meta = stages.stage_metadata(name)
        assert meta["seed"] == ship["seed"] and meta["float_path"]["path"] == ship["path"]
        assert meta["evaluate_chat"] == stages.run_metrics(records, name, ship["seed"], ship["path"]), name


def test_the_claims_command_passes_on_the_shipped_record(capsys):
    assert stages.main(["claims"]) == 0, capsys.readouterr().out


def test_no_later_stage_destroyed_a_skill_in_any_run(records):
    """Only a cost a chapter teaches may go that far (chapter 10: LoRA and the held-out sums)."""
    lost = stages.destroyed_skills(records)
    assert [d for d in lost if not d["taught"]] == []
    assert all((d["stage"], d["metric"]) in stages.TAUGHT_COSTS for d in lost)


def test_report_command_writes_the_committed_table_and_a_figure(tmp_path):
    out, fig = tmp_path / "report.md", tmp_path / "report.png"
    assert stages.main(["report", "--out", str(out), "--figure", str(fig)]) == 0
    assert out.read_text(encoding="utf-8") == TABLE.read_text(encoding="utf-8")
    assert fig.stat().st_size > 10_000


def test_the_performance_page_includes_the_table_and_the_figure():
    page = (ROOT / "book" / "performance.md").read_text(encoding="utf-8")
    assert "```{include} ../benchmarks/results/stage_report.md" in page and "make report" in page
    assert "../benchmarks/results/figures/stage_report.png" in page


@pytest.mark.parametrize("claim", stages.STAGE_CLAIMS, ids=lambda c: f"{c[0]}-{c[1]}-{c[2]}")
def test_every_chapter_claim_agrees_with_the_record(records, claim):
    stage, metric, direction = claim
    sentence = stages.check_claim(stage, metric, direction, records)
    assert direction == "within range" or direction in sentence  # "within range" holds for any overlap


# ---------------------------------------------------------------------- the machinery, on a made-up record
def _fake(values, paths=("native", "default")):
    """A record with the given {stage: [values over seeds]} for every report column, the same on
    every float path, 200 prompts per share."""
    seeds = [0, 1, 2]
    out = {"version": stages.RECORD_VERSION, "seeds": seeds, "paths": list(paths), "stages": {}}
    counts = {n_key: 200.0 for n_key, _ in stages.PROPORTIONS.values()}
    for name, vals in values.items():
        out["stages"][name] = {str(s): {p: {"metrics": {**{k: v for k in stages.REPORT_KEYS}, **counts},
                                            "seconds": 1.0} for p in paths} for s, v in zip(seeds, vals)}
    return out


def test_effects_need_intervals_that_do_not_overlap():
    rec = _fake({"base": [0.0, 0.0, 0.0], "sft": [0.5, 0.6, 0.55], "lora": [0.58, 0.7, 0.65],
                 "dpo": [0.2, 0.3, 0.25], "grpo": [0.75, 0.8, 0.85]})
    assert stages.stage_effect("sft", "sum_accuracy", rec)["direction"] == "up"
    assert stages.stage_effect("lora", "sum_accuracy", rec)["direction"] == "up in every lineage"  # 0.58 <= 0.6
    assert stages.stage_effect("dpo", "sum_accuracy", rec)["direction"] == "down"
    assert stages.stage_effect("grpo", "sum_accuracy", rec)["direction"] == "up"
    e = stages.stage_effect("grpo", "sum_accuracy", rec)
    assert e["change"] == pytest.approx((0.75 + 0.8 + 0.85) / 3 - 0.55) and e["parent_range"] == (0.5, 0.6)
    assert e["parent_interval"] == (stages.wilson_interval(100, 200)[0], stages.wilson_interval(120, 200)[1])
    assert stages.check_claim("grpo", "sum_accuracy", "up", rec).endswith("up")
    with pytest.raises(AssertionError, match="do not show 'up'"):
        stages.check_claim("lora", "sum_accuracy", "up", rec)
    # "within range": the envelopes overlap, whatever each lineage did inside them
    assert stages.check_claim("lora", "sum_accuracy", "within range", rec).endswith("up in every lineage")
    assert stages.check_claim("lora", "sum_accuracy", "up in every lineage", rec)
    with pytest.raises(AssertionError, match="do not show 'within range'"):
        stages.check_claim("grpo", "sum_accuracy", "within range", rec)
    with pytest.raises(AssertionError, match="do not show 'down in every lineage'"):
        stages.check_claim("lora", "sum_accuracy", "down in every lineage", rec)
    with pytest.raises(ValueError, match="claim"):
        stages.check_claim("lora", "sum_accuracy", "better", rec)
    with pytest.raises(ValueError, match="no metric"):
        stages.stage_effect("lora", "poetry", rec)


def test_rendering_marks_the_effects_and_shows_ranges():
    rec = _fake({"base": [0.0, 0.0, 0.0], "sft": [0.5, 0.6, 0.55], "lora": [0.58, 0.7, 0.65],
                 "dpo": [0.2, 0.3, 0.25], "grpo": [0.75, 0.8, 0.85]})
    table = stages.render_seed_report(rec)
    main_table = table.split("\n\n")[0]  # the per-path table below repeats the stage names
    rows = {line.split(" | ")[0].strip("| "): line for line in main_table.splitlines() if line.startswith("| ")}
    assert "55.0% ▲<br>(50.0%–60.0%)" in rows["sft"]
    assert "▲" not in rows["lora"] and "▼" not in rows["lora"] and "64.3% ↑" in rows["lora"]
    assert "25.0% ▼" in rows["dpo"] and "80.0% ▲" in rows["grpo"]
    assert "6 runs: 3 seeds (0, 1, 2) on 2 float paths" in table
    assert rows["base"].split(" | ")[-2] == "–" and "▲" not in rows["sft"].split(" | ")[-2]  # the win rate
    broken = copy.deepcopy(rec)
    del broken["stages"]["lora"]["2"]["native"]["metrics"]["win_rate"]
    assert "–" in stages.render_seed_report(broken)


# ---------------------------------------------------------------------- bad input, named before any work
def test_rebuild_refuses_seeds_that_are_not_integers(capsys):
    from minimind_ref import stages

    def refuse(*args, **kwargs):
        pytest.fail("a real lineage started: the bad argument should have been refused first")

    for bad in ("a", "0,,1", "0,0", "-1"):
        with pytest.raises(SystemExit):
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(stages, "rebuild_seeds", refuse)
                stages.main(["rebuild", "--seeds", bad])
        assert "--seeds" in capsys.readouterr().err
    for args, word in ((["--paths", "native,sse9"], "sse9"), (["--paths", "native,native"], "distinct"),
                       (["--jobs", "0"], "--jobs")):
        with pytest.raises(SystemExit):
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(stages, "rebuild_seeds", refuse)
                stages.main(["rebuild", "--seeds", "0", *args])
        assert word in capsys.readouterr().err


def test_report_checks_its_output_paths_before_evaluating(tmp_path, monkeypatch):
    from minimind_ref import stages

    monkeypatch.setattr(stages, "stage_rows", lambda *a, **k: pytest.fail("evaluated before checking --out"))
    with pytest.raises(IsADirectoryError, match="--out"):
        stages.main(["report", "--evaluate", "--out", str(tmp_path)])


def test_seed_record_and_stage_names_are_checked(tmp_path):
    from minimind_ref import stage_report

    bad = tmp_path / "record.json"
    bad.write_text("[1, 2]", encoding="utf-8")
    with pytest.raises(ValueError, match="not a seed record"):
        stage_report.load_seed_records(bad)
    with pytest.raises(ValueError, match="unknown stage 'nope'"):
        stage_report.stage_effect("nope", "sum_accuracy", records={"stages": {}})


def test_evaluate_chat_names_a_reference_that_is_not_replies():
    from minimind_ref import chat_eval

    with pytest.raises(TypeError, match="reference must map"):
        chat_eval.evaluate_chat(None, None, reference=[1])
