"""The seeded rebuild's machinery (``stages.rebuild_seeds``, the record over seeds and float paths,
the intervals the claims compare): every argument and output path is checked before the first
lineage runs, the record and the shipped stage files are written atomically and only once every
lineage has finished, and the figures' intervals, near ties and effects follow their definitions.
The lineages themselves are stubbed here (a real one trains four stages: minutes); what the
shipped record says is tests/test_stage_report.py's."""

import json
import math
import os
import subprocess
import sys

import pytest
import torch

from minimind_ref import stages


@pytest.fixture(autouse=True)
def no_real_lineage(monkeypatch):
    """A real lineage trains four stages (minutes): a test that reaches one fails at once."""
    def refuse(seed, path, *args):
        pytest.fail(f"a test started a real lineage (seed {seed}, path {path}): it should have failed before")
    monkeypatch.setattr(stages, "_subprocess_lineage", refuse)


def _metrics(value, n=200.0):
    """evaluate_chat-shaped figures: every share ``value`` of ``n`` prompts, no near ties."""
    out = {"preference_margin": 100 * value, "mean_length": 20.0, "stop_n": n, "win_rate_n": n, "preference_n": n}
    for key, (n_key, ties_key) in stages.PROPORTIONS.items():
        out.update({key: value, n_key: n, ties_key: 0.0})
    return out


def _fake_runner(values, calls=None, fail_on=None):
    """A lineage stub: ``values[stage]`` is a function (seed, path) -> share; it saves stand-in
    stage files when asked to (the shipped lineage)."""
    def run(seed, path, save_dir, work, log):
        if calls is not None:
            calls.append((seed, path, save_dir is not None))
        if fail_on == (seed, path):
            raise RuntimeError("lineage failed")
        if save_dir is not None:
            os.makedirs(save_dir)
            for name in stages.SEEDED_STAGES:
                with open(os.path.join(save_dir, stages.STAGE_INFO[name].file), "wb") as f:
                    f.write(f"{name} {seed} {path}".encode())
        return {"seed": seed, "path": path, "capability": path.upper(), "torch": "x", "seconds": 1.0,
                "stages": {name: {"metrics": _metrics(values[name](seed, path)), "seconds": 1.0, "stage_metrics": {}}
                           for name in ("base",) + stages.SEEDED_STAGES}}
    return run


VALUES = {"base": lambda s, p: 0.0, "sft": lambda s, p: 0.5 + 0.01 * s, "lora": lambda s, p: 0.3,
          "dpo": lambda s, p: 0.5 + 0.01 * s + (0.001 if p == "native" else -0.001), "grpo": lambda s, p: 0.56 + 0.01 * s}


# ---------------------------------------------------------------------- checked before anything runs
@pytest.mark.parametrize("kwargs, error", [
    (dict(seeds=[]), ValueError), (dict(seeds=[0, 0]), ValueError), (dict(seeds=[-1]), ValueError),
    (dict(seeds=[True]), ValueError), (dict(paths=["native", "native"]), ValueError),
    (dict(paths=["sse9"]), ValueError), (dict(jobs=0), ValueError), (dict(ship_seed=7), ValueError),
])
def test_bad_arguments_are_refused_before_any_lineage(tmp_path, kwargs, error):
    calls = []
    args = dict(seeds=[0, 1], paths=["native", "default"], jobs=1, ship_seed=0, out=tmp_path / "r.json",
                ship_dir=tmp_path / "ship", log=lambda line: None, runner=_fake_runner(VALUES, calls))
    with pytest.raises(error):
        stages.rebuild_seeds(**{**args, **kwargs})
    assert calls == [] and not (tmp_path / "r.json").exists()


def test_a_bad_out_or_ship_dir_is_refused_before_any_lineage(tmp_path):
    calls = []
    runner = _fake_runner(VALUES, calls)
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    quiet = dict(seeds=[0], paths=["native"], log=lambda line: None, runner=runner)
    with pytest.raises(IsADirectoryError, match="is a folder"):
        stages.rebuild_seeds(out=tmp_path, ship_dir=tmp_path / "ship", **quiet)
    with pytest.raises(NotADirectoryError, match="is a file"):
        stages.rebuild_seeds(out=a_file / "record.json", ship_dir=tmp_path / "ship", **quiet)
    with pytest.raises(NotADirectoryError, match="is a file"):
        stages.rebuild_seeds(out=tmp_path / "r.json", ship_dir=a_file, **quiet)
    assert calls == []


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root writes into read-only folders")
def test_an_unwritable_out_is_refused_before_any_lineage(tmp_path):
    calls = []
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        with pytest.raises(PermissionError, match="not writable"):
            stages.rebuild_seeds([0], ["native"], out=locked / "r.json", ship_seed=None, log=lambda line: None,
                                 runner=_fake_runner(VALUES, calls))
    finally:
        locked.chmod(0o700)
    assert calls == []


def test_the_command_line_checks_out_before_training(tmp_path):
    """A folder as --out: a one-line error at once (the real lineages would take minutes each)."""
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    for args, error in ((["--out", str(tmp_path), "--no-ship"], IsADirectoryError),
                        (["--out", str(a_file / "r.json"), "--no-ship"], NotADirectoryError),
                        (["--ship-dir", str(a_file), "--out", str(tmp_path / "r.json")], NotADirectoryError)):
        with pytest.raises(error):
            stages.main(["rebuild", "--seeds", "0", "--paths", "native", *args])
    with pytest.raises(NotADirectoryError):
        stages.main(["rebuild", "sft", "--ship-dir", str(a_file)])
    with pytest.raises(SystemExit):
        stages.main(["rebuild", "--seeds", "0,x"])


# ---------------------------------------------------------------------- what a rebuild writes
def test_rebuild_writes_every_seed_and_path_and_ships_the_first(tmp_path):
    calls = []
    out, ship = tmp_path / "record.json", tmp_path / "ship"
    record = stages.rebuild_seeds([0, 1, 2], ["native", "default"], jobs=2, ship_seed=0, out=out, ship_dir=ship,
                                  log=lambda line: None, runner=_fake_runner(VALUES, calls))
    assert sorted(calls) == sorted([(s, p, (s, p) == (0, "native")) for s in (0, 1, 2) for p in ("native", "default")])
    assert stages.load_seed_records(out) == json.loads(out.read_text()) == record
    assert record["version"] == stages.RECORD_VERSION and record["paths"] == ["native", "default"]
    assert record["capabilities"] == {"native": "NATIVE", "default": "DEFAULT"}
    assert record["ship"] == {"seed": 0, "path": "native"}
    for name in ("base",) + stages.SEEDED_STAGES:
        assert sorted(record["stages"][name], key=int) == ["0", "1", "2"]
        for seed in (0, 1, 2):
            for path in ("native", "default"):
                assert stages.run_metrics(record, name, seed, path)["sum_accuracy"] == VALUES[name](seed, path)
    for name in stages.SEEDED_STAGES:
        assert (ship / stages.STAGE_INFO[name].file).read_bytes() == f"{name} 0 native".encode()
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]
    assert stages.seed_values(record, "dpo", "sum_accuracy", ["default"]) == [VALUES["dpo"](s, "default") for s in (0, 1, 2)]
    assert len(stages.seed_values(record, "dpo", "sum_accuracy")) == 6


def test_a_failed_lineage_leaves_the_previous_record_and_stages_as_they_were(tmp_path):
    out, ship = tmp_path / "record.json", tmp_path / "ship"
    ship.mkdir()
    out.write_text("previous record")
    for name in stages.SEEDED_STAGES:
        (ship / stages.STAGE_INFO[name].file).write_bytes(b"previous")
    with pytest.raises(RuntimeError, match="lineage failed"):
        stages.rebuild_seeds([0, 1], ["native"], jobs=1, ship_seed=0, out=out, ship_dir=ship, log=lambda line: None,
                             runner=_fake_runner(VALUES, fail_on=(1, "native")))
    assert out.read_text() == "previous record"
    assert all((ship / stages.STAGE_INFO[n].file).read_bytes() == b"previous" for n in stages.SEEDED_STAGES)
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]


def test_the_record_is_written_with_atomic_write(tmp_path, monkeypatch):
    """Through files.write_text / atomic_write: a kill mid-write leaves the previous file."""
    from minimind_ref import files

    written = []
    real = files.atomic_write

    def spy(path, *a, **k):
        written.append(os.fspath(path))
        return real(path, *a, **k)

    monkeypatch.setattr(files, "atomic_write", spy)
    stages.rebuild_seeds([0], ["native"], ship_seed=0, out=tmp_path / "r.json", ship_dir=tmp_path / "ship",
                         log=lambda line: None, runner=_fake_runner(VALUES))
    assert os.fspath(tmp_path / "r.json") in written
    assert {os.fspath(tmp_path / "ship" / stages.STAGE_INFO[n].file) for n in stages.SEEDED_STAGES} <= set(written)


def test_an_old_record_is_refused_with_the_command_that_remakes_it(tmp_path):
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"seeds": [0], "stages": {}}))
    with pytest.raises(ValueError, match="rebuild --seeds"):
        stages.load_seed_records(old)
    with pytest.raises(FileNotFoundError, match="rebuild --seeds"):
        stages.load_seed_records(tmp_path / "missing.json")


# ---------------------------------------------------------------------- float paths
def test_path_environment_sets_or_clears_the_capability():
    env = stages.path_environment("default")
    assert env["ATEN_CPU_CAPABILITY"] == "default" and env["OMP_NUM_THREADS"] == "1"
    assert "ATEN_CPU_CAPABILITY" not in stages.path_environment("native")
    with pytest.raises(ValueError, match="unknown float path"):
        stages.path_environment("fast")


@pytest.mark.slow
def test_a_process_on_the_default_path_reports_it():
    code = "from minimind_ref import stages; print(stages.float_path())"
    out = subprocess.run([sys.executable, "-c", code], env=stages.path_environment("default"), capture_output=True,
                         text=True, check=True).stdout
    assert "'path': 'default'" in out and "'capability': 'DEFAULT'" in out


# ---------------------------------------------------------------------- intervals and effects
def test_wilson_interval_has_its_closed_forms_at_the_ends():
    z = stages.Z_95
    for n in (10, 49, 200):
        low, high = stages.wilson_interval(0, n)
        assert low == pytest.approx(0.0, abs=1e-12) and high == pytest.approx(z * z / (n + z * z))
        low, high = stages.wilson_interval(n, n)
        assert high == pytest.approx(1.0) and low == pytest.approx(n / (n + z * z))
    low, high = stages.wilson_interval(100, 200)
    assert low < 0.5 < high and 0.5 - low == pytest.approx(high - 0.5)  # symmetric at one half
    assert stages.wilson_interval(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError):
        stages.wilson_interval(3, 2)


def test_near_ties_widen_a_shares_interval():
    m = _metrics(0.5, 200.0)
    plain = stages.metric_interval(m, "sum_accuracy")
    assert plain == stages.wilson_interval(100, 200)
    m["sum_near_ties"] = 4.0
    wide = stages.metric_interval(m, "sum_accuracy")
    assert wide == (stages.wilson_interval(96, 200)[0], stages.wilson_interval(104, 200)[1])
    assert stages.metric_interval(m, "preference_margin") == (50.0, 50.0)  # not a share: the value itself


def _record(values, seeds=(0, 1, 2), paths=("native", "default")):
    runner = _fake_runner(values)
    record = {"version": stages.RECORD_VERSION, "seeds": list(seeds), "paths": list(paths), "stages": {}}
    for seed in seeds:
        for path in paths:
            for name, entry in runner(seed, path, None, None, None)["stages"].items():
                record["stages"].setdefault(name, {}).setdefault(str(seed), {})[path] = entry
    return record


def test_effects_compare_intervals_and_lineages():
    rec = _record(VALUES)
    assert stages.stage_effect("sft", "sum_accuracy", rec)["direction"] == "up"  # 0 % vs 50-52 % of 200
    assert stages.stage_effect("lora", "sum_accuracy", rec)["direction"] == "down"  # 30 % vs 50-52 %
    e = stages.stage_effect("grpo", "sum_accuracy", rec)  # +6 points in every lineage, intervals overlap
    assert e["direction"] == "up in every lineage" and (e["lineages"], e["lineages_up"]) == (6, 6)
    assert e["interval"][0] < e["parent_interval"][1]
    e = stages.stage_effect("dpo", "sum_accuracy", rec)  # +-0.1 point, by path
    assert e["direction"] == "within range" and (e["lineages_up"], e["lineages_down"]) == (3, 3)
    assert stages.check_claim("grpo", "sum_accuracy", "up in every lineage", rec).endswith("up in every lineage")
    assert stages.check_claim("sft", "sum_accuracy", "up in every lineage", rec).endswith(": up")  # up implies it
    with pytest.raises(AssertionError, match="do not show 'up'"):
        stages.check_claim("grpo", "sum_accuracy", "up", rec)
    with pytest.raises(ValueError, match="claim must be"):
        stages.check_claim("grpo", "sum_accuracy", "better", rec)
    # the margin is not a share: its range over the runs decides (grpo's 56-58 vs sft's 50-52)
    assert stages.stage_effect("grpo", "preference_margin", rec)["direction"] == "up"


def test_destroyed_skills_names_the_run():
    values = dict(VALUES, grpo=lambda s, p: 0.0 if (s, p) == (1, "default") else 0.5)
    lost = stages.destroyed_skills(_record(values))
    assert {(d["stage"], d["seed"], d["path"]) for d in lost} == {("grpo", 1, "default")}
    assert {d["metric"] for d in lost} == set(stages.SKILLS)
    assert stages.destroyed_skills(_record(VALUES)) == []  # lora's 50 -> 30 % is a cost, not destruction
    deep = stages.destroyed_skills(_record(dict(VALUES, lora=lambda s, p: 0.05)))  # chapter 10's cost, taught
    assert deep and all(d["taught"] == "10" for d in deep if d["metric"] == "sum_accuracy")
    assert "No run of a later stage destroyed" in stages.render_seed_report(_record(VALUES))
    assert "grpo seed 1 on `default`" in stages.render_seed_report(_record(values))


# ---------------------------------------------------------------------- near ties in the evaluation
def test_every_reply_is_a_near_tie_when_every_logit_ties():
    """A model whose head gives every token the same logit: each greedy step is a tie, so a right
    reply, a wrong one and a stop could all go the other way."""
    model, tok = stages.load_stage("base")
    torch.nn.init.zeros_(model.lm_head.weight)
    conv = [[{"role": "user", "content": "What is 2 plus 3?"}]] * 2
    right = {"text": "02+03=005", "ids": sft_ids(tok, "02+03=005"), "stopped": True}
    wrong = {"text": "02+03=006", "ids": sft_ids(tok, "02+03=006"), "stopped": False}
    score, stop = stages.greedy_near_ties(model, tok, conv, [right, wrong], ["02+03=005"] * 2)
    assert score == [True, True] and stop == [True, True]


def sft_ids(tok, text):
    from minimind_ref import sft

    return sft._plain_ids(tok, text)


def test_near_ties_follow_the_margin():
    """Margin 0 counts nothing (a tie must be closer than it); an enormous margin counts every
    right reply, every wrong reply's first wrong step and every stop; more margin never counts fewer."""
    from minimind_ref import chat_data, sft

    model, tok = stages.load_stage("sft")
    exchanges = chat_data.heldout_exchanges("sum")[:24] + chat_data.heldout_exchanges("refusal")[:8]
    conv = [[{"role": "user", "content": ex.user}] for ex in exchanges]
    replies = sft.generate_replies(model, tok, conv, max_new_tokens=stages.EVAL_MAX_NEW_TOKENS)
    answers = [ex.answer for ex in exchanges]
    counted = {m: stages.greedy_near_ties(model, tok, conv, replies, answers, margin=m) for m in (0.0, 0.01, 1.0, 1e9)}
    assert counted[0.0] == ([False] * len(conv), [False] * len(conv))
    assert counted[1e9] == ([True] * len(conv), [True] * len(conv))
    for small, large in ((0.0, 0.01), (0.01, 1.0), (1.0, 1e9)):
        for k in (0, 1):
            assert all(b or not a for a, b in zip(counted[small][k], counted[large][k]))
    assert sum(counted[stages.GREEDY_TIE_MARGIN][0]) <= 0.1 * len(conv), "the shipped sft model decides clearly"


def test_the_claims_command_checks_a_record_and_fails_loudly(tmp_path, capsys):
    """``stages claims --seeds-file``: what a reader runs on their own rebuild's record."""
    out = tmp_path / "record.json"
    stages.rebuild_seeds([0, 1], ["native"], ship_seed=None, out=out, log=lambda line: None,
                         runner=_fake_runner(VALUES))
    assert stages.main(["claims", "--seeds-file", str(out)]) == 1  # made-up figures: the chapters' claims fail
    printed = capsys.readouterr().out
    assert "FAILS: the recorded runs do not show" in printed and "claims hold over 2 seeds x 1 float paths" in printed
    with pytest.raises(SystemExit):
        stages.main(["claims", "--seeds-file", str(tmp_path / "missing.json")])
    assert "no seed record" in capsys.readouterr().err


# ---------------------------------------------------------------------- the shipped files as one set
def test_a_rebuild_ships_one_set_with_its_manifest(tmp_path):
    """The shipped stage files and the record beside them change as one set (stage_set): the manifest lists each
    file's digest and lineage; a file swapped afterwards, or a mix of two sets, is refused at load."""
    from minimind_ref import stage_set

    ship = tmp_path / "ship"
    stages.rebuild_seeds([0, 1], ["native"], ship_seed=1, out=ship / stages.SEEDS_FILE.name, ship_dir=ship,
                         log=lambda line: None, runner=_fake_runner(VALUES))
    entries = stage_set.check_set(ship)
    assert sorted(entries) == sorted([stages.STAGE_INFO[n].file for n in stages.SEEDED_STAGES] + ["stage_seeds.json"])
    assert entries["lora.pt"]["parent_sha256"] == entries["sft.pt"]["sha256"] and entries["lora.pt"]["seed"] == 1
    assert entries["sft.pt"]["parent_sha256"] == stage_set.file_sha256(stages.stage_path("base"))  # the package's base
    assert stages.load_seed_records(ship / "stage_seeds.json")["ship"] == {"seed": 1, "path": "native"}
    old = (ship / "dpo.pt").read_bytes()
    (ship / "dpo.pt").write_bytes(b"dpo by hand")
    with pytest.raises(ValueError, match="dpo.pt is not the file the stage set's manifest.json lists"):
        stage_set.check_set(ship)
    (ship / "dpo.pt").write_bytes(old)
    # a write interrupted after its pending manifest and one file: refused as mixed, naming both sides
    manifest = json.loads((ship / "manifest.json").read_text())
    manifest["pending"] = {**manifest["files"], "sft.pt": {"sha256": stage_set.file_sha256(ship / "lora.pt")}}
    (ship / "manifest.json").write_text(json.dumps(manifest))
    assert stage_set.check_set(ship) == manifest["files"]  # nothing replaced yet: the old set, whole
    (ship / "sft.pt").write_bytes((ship / "lora.pt").read_bytes())
    assert stage_set.check_set(ship)["sft.pt"]["sha256"] == manifest["pending"]["sft.pt"]["sha256"]  # the new, whole
    manifest["pending"]["grpo.pt"] = {"sha256": "0" * 64}
    (ship / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="the stage set is mixed.*sft.pt from the new set.*grpo.pt"):
        stage_set.check_set(ship)


def test_a_stage_rebuilt_alone_shows_in_the_lineage(tmp_path):
    from minimind_ref import stage_set

    sources = {name: tmp_path / f"{name}.src" for name in ("sft.pt", "lora.pt")}
    for name, path in sources.items():
        path.write_bytes(name.encode())
    lineage = {"sft.pt": {"stage": "sft", "parent": "base"}, "lora.pt": {"stage": "lora", "parent": "sft"}}
    entries = stage_set.write_set(tmp_path / "set", sources, lineage)
    assert stage_set.stale_lineage(entries) == {}
    sources["sft.pt"].write_bytes(b"sft, rebuilt")
    entries = stage_set.write_set(tmp_path / "set", {"sft.pt": sources["sft.pt"]}, lineage)
    assert stage_set.stale_lineage(entries) == {"lora.pt": "sft.pt"}  # lora was trained from the sft before
    assert stage_set.check_set(tmp_path / "set") == entries
