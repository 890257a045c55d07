"""The stage report (book/performance.md) is produced by code, never typed: the committed table is
what `make report` writes, and it holds every shipped stage's held-out figures as the stage files
recorded them when `python -m minimind_ref.stages rebuild` made them."""

from pathlib import Path

from minimind_ref import stages

ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "benchmarks" / "results" / "stage_report.md"


def test_committed_table_is_the_recorded_figures_of_every_shipped_stage():
    rows = stages.recorded_rows()
    assert [r["stage"] for r in rows] == [s for s in stages.STAGES if stages.stage_path(s).is_file()]
    assert TABLE.read_text(encoding="utf-8") == stages.render_markdown(rows), (
        "benchmarks/results/stage_report.md is out of date: run `make report` (and commit the table)")


def test_every_shipped_stage_records_its_parent_and_evaluation():
    for name in stages.available_stages():
        meta = stages.stage_metadata(name)
        assert meta["parent"] == stages.STAGE_INFO[name].parent, name
        assert set(stages.METRICS) <= set(meta["evaluate_chat"]), name


def test_report_command_writes_the_recorded_table(tmp_path):
    out = tmp_path / "report.md"
    assert stages.main(["report", "--recorded", "--out", str(out)]) == 0
    assert out.read_text(encoding="utf-8") == TABLE.read_text(encoding="utf-8")


def test_the_performance_page_includes_the_table():
    page = (ROOT / "book" / "performance.md").read_text(encoding="utf-8")
    assert "```{include} ../benchmarks/results/stage_report.md" in page and "make report" in page
