"""tools/current_releases.py, the third pass of `make test` (`make test-current`): its parts.

The run itself (a fresh environment with the newest releases, the package tests and every chapter
natively) is `make test-current`; these tests check the allow-list's rules, which pins it lifts, the
kernel settings, and that it covers every package the course's extras name."""

from __future__ import annotations

import datetime
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import colab_like  # noqa: E402
import current_releases as C  # noqa: E402


def test_the_committed_allow_list_is_well_formed():
    entries = C.read_exceptions()
    assert all(e["reason"] and datetime.date.fromisoformat(e["date"]) <= datetime.date.today() for e in entries)


def test_an_allow_list_entry_excludes_one_release_with_a_date_and_a_reason(tmp_path):
    path = tmp_path / "current-exceptions.txt"
    path.write_text("# comment\n\nnumpy!=2.5.0  # 2026-11-20: breaks chapter 04's printout\n", encoding="utf-8")
    assert C.read_exceptions(path) == [{"name": "numpy", "version": "2.5.0", "date": "2026-11-20",
                                        "reason": "breaks chapter 04's printout"}]
    line = C.describe_exceptions(C.read_exceptions(path), today=datetime.date(2026, 11, 27))[0]
    assert line == "skipping numpy 2.5.0 (allow-listed 2026-11-20, 7 days ago): breaks chapter 04's printout"


@pytest.mark.parametrize("line", ["numpy==2.4.6  # 2026-11-20: held", "numpy<2.5  # 2026-11-20: held",
                                  "numpy!=2.5.0", "numpy!=2.5.0  # no date here", "numpy!=2.5.0  # 2026-11-20:",
                                  "numpy!=2.5.0  # 2026-13-40: bad date"])
def test_pins_bounds_and_undated_entries_are_refused(tmp_path, line):
    path = tmp_path / "current-exceptions.txt"
    path.write_text(line + "\n", encoding="utf-8")
    with pytest.raises(colab_like.ColabLikeError, match="current-exceptions.txt:1"):
        C.read_exceptions(path)


def test_the_test_tools_keep_their_pins_and_lose_those_of_the_current_packages():
    kept = C.dev_requirements_without_current()
    names = {C.canonical(re.split(r"[\s<>=!~;\[]", r, maxsplit=1)[0]) for r in kept}
    assert not names & {C.canonical(n) for n in C.CURRENT}
    assert "jupyter-book==1.0.4.post1" in kept and "nbval==0.11.0" in kept
    dev = (ROOT / "requirements" / "dev.txt").read_text(encoding="utf-8")
    assert "transformers==" in dev and "numpy==" in dev  # (what the pinned passes hold)


def test_current_covers_what_the_extras_and_the_chapters_use():
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    named = list(project["dependencies"])
    for extra in ("course", "hf", "hub", "train"):
        named += project["optional-dependencies"][extra]
    names = {C.canonical(re.split(r"[\s<>=!~;\[]", r, maxsplit=1)[0]) for r in named} - {"torch"}
    assert names <= {C.canonical(n) for n in C.CURRENT}, names - {C.canonical(n) for n in C.CURRENT}
    assert C.EXTRAS.split(",") == ["course", "hf", "hub"]


def test_the_chapters_run_natively(monkeypatch, tmp_path):
    """No ATEN_CPU_CAPABILITY, no OMP_NUM_THREADS, no MPLBACKEND reach the kernels, even when the caller
    has them set; the Colab-like pass keeps its own settings."""
    for name, value in (("ATEN_CPU_CAPABILITY", "default"), ("OMP_NUM_THREADS", "1"), ("MPLBACKEND", "Agg")):
        monkeypatch.setenv(name, value)
    native = colab_like.clean_env(tmp_path, C.NATIVE_ENV)
    assert not {"ATEN_CPU_CAPABILITY", "OMP_NUM_THREADS", "MPLBACKEND"} & set(native)
    assert native["MINIMIND_DEVICE"] == "cpu" and native["TMPDIR"] == str(tmp_path)
    colab = colab_like.clean_env(tmp_path)
    assert (colab["ATEN_CPU_CAPABILITY"], colab["OMP_NUM_THREADS"], colab["MPLBACKEND"]) == ("default", "1", "Agg")


def test_make_test_runs_the_three_passes():
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    body = makefile.split("\ntest:", 1)[1].split("\n\n", 1)[0]
    assert [p for p in ("test-package", "test-colab", "test-current") if p in body] == ["test-package", "test-colab",
                                                                                       "test-current"]
    assert "tools/current_releases.py" in makefile.split("\ntest-current:", 1)[1].split("\n\n", 1)[0]
