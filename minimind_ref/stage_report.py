"""The stage report over seeds and float paths: the seeded rebuild's record
(``load_seed_records``, ``seed_runs``, ``run_metrics``, ``seed_values``), where a run's share could
lie (``metric_interval``), a stage's effect against its parent over every run (``stage_effect``,
``describe_effect``), the chapters' claims checked against it (``check_claim``,
``STAGE_CLAIMS``), the runs in which a stage destroyed a skill its parent had
(``destroyed_skills``), and the report itself as a table and a figure (``REPORT_COLUMNS``,
``render_markdown``, ``render_seed_report``, ``render_seed_figure``). It measures nothing and
loads no model: the figures come from the record (or from ``stages.stage_rows``). ``stages``
re-exports every name here.

The record: ``python -m minimind_ref.stages rebuild --seeds 0,1,2,3,4 --paths native,default
--jobs 2`` trains every post-training stage from its parent with each seed (lineages from the
shipped ``base``), once on the CPU's own kernels and once under ``ATEN_CPU_CAPABILITY=default``,
evaluates every model (``chat_eval.evaluate_chat``), records every run's figures in
``checkpoints/stage_seeds.json`` (version ``RECORD_VERSION``: stage -> seed -> path) and ships the
first seed's models of the first path. A share's interval is the 95 % Wilson interval of its count
of held-out prompts, widened by the near ties another float path could flip; a claim holds only
over every run: "up" / "down" when the envelopes of the runs' intervals do not overlap, "up in
every lineage" / "down in every lineage" when they overlap but each seed and path moved that way
from its own parent, "within range" when they overlap.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from . import chat_data
from .chat_eval import Z_95, wilson_interval
from .files import PathLike
from .stage_registry import DEFAULT_SEEDS, RECORD_VERSION, SEEDED_STAGES, SEEDS_FILE, STAGE_INFO, STAGES


def _mean(values: Sequence[float]) -> float:
    """The mean, summed exactly (``math.fsum``): the same float on every Python (3.12's ``sum`` of floats is
    compensated and 3.11's is not, which moves a printed mean that sits on a rounding boundary)."""
    return math.fsum(values) / len(values)


def load_seed_records(path: Optional[PathLike] = None) -> Dict[str, Any]:
    """The seeded rebuild's record (``rebuild_seeds``), shipped beside the checkpoints, read through
    ``check_seed_record`` (a record that fails it is a ``ValueError`` naming the file and what is
    wrong where). The shipped record is also checked against the stage set's manifest
    (``stage_set.check_set``): it must be the record the shipped stage files were made with."""
    from .files import read_json
    from .stage_set import check_set

    path = Path(path) if path is not None else SEEDS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no seed record at {path}: run `python -m minimind_ref.stages rebuild --seeds "
                                f"{','.join(map(str, DEFAULT_SEEDS))}`.")
    if path.resolve() == SEEDS_FILE.resolve():
        check_set(SEEDS_FILE.parent)
    return check_seed_record(read_json(path, "seed record"), str(path))


# ---------------------------------------------------------------------- the record's one schema check
_REMAKE = "make it again with `python -m minimind_ref.stages rebuild --seeds 0,1,2,3,4`"
#: the figures every run must hold (the report's skills and their counts: ``destroyed_skills`` reads them)
REQUIRED_METRICS = ("sum_accuracy", "identity_accuracy", "refusal_accuracy", "stop_rate")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_whole(value: Any) -> bool:
    return _is_number(value) and math.isfinite(value) and value == int(value)


def _count_key(metric: str) -> Optional[str]:
    """The count a share or a near-ties figure is out of (``PROPORTIONS``), else None."""
    for share, (n_key, ties_key) in PROPORTIONS.items():
        if metric in (share, ties_key):
            return n_key
    return None


def check_metric(metrics: Dict[str, Any], metric: str, where: str) -> float:
    """One figure of a run, checked (``where`` names the file, stage, seed and path): a finite number
    (not a bool, a string or null); a share (``..._accuracy``, ``..._rate``) within [0, 1] and, for
    the report's shares (``PROPORTIONS``), over a count > 0; a count (``..._n``) a whole number >= 0;
    near ties a whole number between 0 and their count; a length >= 0. Returns it as a float."""
    if metric not in metrics:
        raise ValueError(f"{where}: no metric {metric!r}; the run has {', '.join(sorted(metrics)) or 'none'}.")
    value = metrics[metric]
    at = f"{where}, metric {metric!r}"
    if not _is_number(value):
        raise ValueError(f"{at} is {json_repr(value)}, not a number: edited by hand? Restore the file or {_REMAKE}.")
    if not math.isfinite(value):
        raise ValueError(f"{at} is {json_repr(value)}: figures must be finite. Restore the file or {_REMAKE}.")
    n_key = _count_key(metric)
    if metric.endswith(("_accuracy", "_rate")) and not 0 <= value <= 1:
        raise ValueError(f"{at} is {value!r}, a share outside [0, 1]. Restore the file or {_REMAKE}.")
    if metric.endswith("_n") and not (_is_whole(value) and value >= 0):
        raise ValueError(f"{at} is {value!r}: a count of prompts must be a whole number >= 0. Restore the file or "
                         f"{_REMAKE}.")
    if metric.endswith("_length") and value < 0:
        raise ValueError(f"{at} is {value!r}: a length must be >= 0. Restore the file or {_REMAKE}.")
    if n_key is not None:
        n = check_metric(metrics, n_key, where) if n_key in metrics else None
        if metric.endswith("_near_ties"):
            if not (_is_whole(value) and 0 <= value <= (n if n is not None else value)):
                raise ValueError(f"{at} is {value!r}: near ties are a whole number between 0 and the count {n_key} "
                                 f"({n!r}). Restore the file or {_REMAKE}.")
        elif n is None or n <= 0:
            raise ValueError(f"{at}: a share needs its count {n_key} > 0, the run has "
                             f"{json_repr(metrics.get(n_key, 'none'))}. Restore the file or {_REMAKE}.")
    return float(value)


def json_repr(value: Any) -> str:
    """A value as the JSON file shows it (``NaN``, ``Infinity``, ``null``, a string in quotes)."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if value != value else ("Infinity" if value > 0 else "-Infinity")
    return "null" if value is None else repr(value)


def check_seed_record(records: Any, source: str = "the seed record") -> Dict[str, Any]:
    """Check a seed record's shape and every figure in it, and return it: the one schema check every
    reader of a record goes through (``load_seed_records``, the report, the claims, the effects).
    ``source`` names it in the messages (the file).

    * ``version``: ``RECORD_VERSION``, in its shape (stage -> seed -> float path -> run; version 1
      had no float paths);
    * ``seeds`` (distinct whole numbers >= 0) and ``paths`` (distinct names): the header; every stage
      of ``stages`` (names of ``STAGES``) has a run for every seed and path of the header, and none
      other;
    * every run: ``metrics`` with ``REQUIRED_METRICS`` and their counts, each figure as
      ``check_metric`` wants it; ``seconds`` a finite number >= 0.

    A ``ValueError`` names the file, stage, seed, path and metric of the first problem."""
    if not isinstance(records, dict) or records.get("version") != RECORD_VERSION:
        raise ValueError(f"{source} is not a seed record of this version ({RECORD_VERSION}: every seed under every "
                         f"float path); {_REMAKE}.")
    seeds, paths, per_stage = records.get("seeds"), records.get("paths"), records.get("stages")
    if not (isinstance(seeds, list) and seeds and all(_is_whole(s) and s >= 0 for s in seeds)
            and len(set(seeds)) == len(seeds)):
        raise ValueError(f"{source}: the header's 'seeds' must be a list of distinct whole numbers >= 0, got "
                         f"{json_repr(seeds)}; {_REMAKE}.")
    if not (isinstance(paths, list) and paths and all(isinstance(p, str) and p for p in paths)
            and len(set(paths)) == len(paths)):
        raise ValueError(f"{source}: the header's 'paths' must be a list of distinct float path names, got "
                         f"{json_repr(paths)}; {_REMAKE}.")
    if not isinstance(per_stage, dict) or not per_stage:
        raise ValueError(f"{source}: 'stages' must map each stage to its runs, got {json_repr(per_stage)}; {_REMAKE}.")
    capabilities, ship = records.get("capabilities", {}), records.get("ship")
    if not (isinstance(capabilities, dict) and all(isinstance(v, str) for v in capabilities.values())):
        raise ValueError(f"{source}: 'capabilities' must map each float path to its CPU capability (strings), got "
                         f"{json_repr(capabilities)}.")
    if ship is not None and not (isinstance(ship, dict) and ship.get("seed") in seeds and ship.get("path") in paths):
        raise ValueError(f"{source}: 'ship' must name the seed and float path of the shipped stages (one of the "
                         f"header's), got {json_repr(ship)}.")
    want_seeds = [str(int(s)) for s in seeds]
    for stage, runs in per_stage.items():
        if stage not in STAGE_INFO:
            raise ValueError(f"{source}: unknown stage {stage!r}; the stages are {', '.join(STAGES)}.")
        if not isinstance(runs, dict):
            raise ValueError(f"{source}: stage {stage!r} must map each seed to its runs, got {json_repr(runs)}.")
        for seed, entry in runs.items():
            if isinstance(entry, dict) and "metrics" in entry:
                raise ValueError(f"{source} is labelled version {RECORD_VERSION} but is in the old shape (version 1: "
                                 f"stage -> seed -> run, without float paths; stage {stage!r}, seed {seed} holds a run "
                                 f"directly); {_REMAKE}.")
        missing = [s for s in want_seeds if s not in runs]
        extra = [s for s in runs if s not in want_seeds]
        if missing or extra:
            raise ValueError(f"{source}: stage {stage!r} has runs for seeds {', '.join(sorted(runs, key=str)) or 'none'}, "
                             f"but the header's 'seeds' lists {', '.join(want_seeds)}"
                             + (f" (no runs for {', '.join(missing)})" if missing else "")
                             + (f" (runs for {', '.join(extra)} not in the header)" if extra else "")
                             + f"; every stage needs a run per seed and path. {_REMAKE[0].upper() + _REMAKE[1:]}.")
        for seed in want_seeds:
            per_path = runs[seed]
            if not isinstance(per_path, dict) or set(per_path) != set(paths):
                have = ", ".join(sorted(per_path)) if isinstance(per_path, dict) else json_repr(per_path)
                raise ValueError(f"{source}: stage {stage!r}, seed {seed} has runs for paths {have or 'none'}, but the "
                                 f"header's 'paths' lists {', '.join(paths)}. {_REMAKE[0].upper() + _REMAKE[1:]}.")
            for path in paths:
                run, where = per_path[path], f"{source}: stage {stage!r}, seed {seed}, path {path!r}"
                if not isinstance(run, dict) or not isinstance(run.get("metrics"), dict):
                    raise ValueError(f"{where}: a run must hold its 'metrics' (a JSON object); got {json_repr(run)}.")
                seconds = run.get("seconds", 0.0)
                if not (_is_number(seconds) and math.isfinite(seconds) and seconds >= 0):
                    raise ValueError(f"{where}: 'seconds' must be a finite number >= 0, got {json_repr(seconds)}.")
                if "stage_metrics" in run and not isinstance(run["stage_metrics"], dict):
                    raise ValueError(f"{where}: 'stage_metrics' must be a JSON object, got "
                                     f"{json_repr(run['stage_metrics'])}.")
                metrics = run["metrics"]
                for metric in REQUIRED_METRICS:
                    check_metric(metrics, metric, where)
                for metric in metrics:
                    check_metric(metrics, metric, where)
    return records


def _checked(records: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """``records``, or the shipped record, through ``check_seed_record``."""
    return load_seed_records() if records is None else check_seed_record(records)


def seed_runs(records: Dict[str, Any], stage: str, paths: Optional[Sequence[str]] = None
              ) -> List[Tuple[int, str, Dict[str, Any]]]:
    """``(seed, path, run)`` for every recorded run of ``stage`` (seed order, then path order);
    ``run`` holds ``metrics``, ``seconds`` and ``stage_metrics``. ``paths``: only these paths."""
    _checked(records)
    return _seed_runs(records, stage, paths)


def _seed_runs(records: Dict[str, Any], stage: str, paths: Optional[Sequence[str]] = None
               ) -> List[Tuple[int, str, Dict[str, Any]]]:
    if stage not in STAGE_INFO:
        raise ValueError(f"unknown stage {stage!r}: the stages are {', '.join(STAGE_INFO)}.")
    per_seed = records["stages"].get(stage, {})
    if not per_seed:
        raise ValueError(f"the seed record has no stage {stage!r}; it has {', '.join(records['stages'])}.")
    wanted = list(paths) if paths is not None else list(records["paths"])
    unknown = [p for p in wanted if p not in records["paths"]]
    if unknown:
        raise ValueError(f"the seed record has no float path {unknown[0]!r}; it has {', '.join(records['paths'])}.")
    return [(int(seed), path, per_seed[seed][path]) for seed in sorted(per_seed, key=int) for path in wanted
            if path in per_seed[seed]]


def run_metrics(records: Dict[str, Any], stage: str, seed: int, path: Optional[str] = None) -> Dict[str, float]:
    """The ``evaluate_chat`` figures of one run: ``stage`` in lineage ``seed`` on float ``path``
    (default: the record's first path, the one the shipped stages come from)."""
    _checked(records)
    path = path or records["paths"][0]
    try:
        return records["stages"][stage][str(seed)][path]["metrics"]
    except (KeyError, TypeError):
        raise ValueError(f"the seed record has no run of {stage!r} with seed {seed} on float path {path!r}; it has "
                         f"seeds {records['seeds']} and paths {records['paths']}.") from None


def seed_values(records: Dict[str, Any], stage: str, metric: str, paths: Optional[Sequence[str]] = None) -> List[float]:
    """The values of ``metric`` for ``stage`` over the recorded runs, every seed on every float path
    (``seed_runs`` order); ``paths``: only these paths."""
    _checked(records)
    return _seed_values(records, stage, metric, paths)


def _seed_values(records: Dict[str, Any], stage: str, metric: str, paths: Optional[Sequence[str]] = None) -> List[float]:
    out = []
    for seed, path, run in _seed_runs(records, stage, paths):
        if metric not in run["metrics"]:
            raise ValueError(f"the seed record of {stage!r} has no metric {metric!r}; it has "
                             f"{', '.join(sorted(run['metrics']))}.")
        out.append(float(run["metrics"][metric]))
    return out


def _mean(values: Sequence[float]) -> float:
    """The mean, summed exactly (``math.fsum``): the same digits on every Python (3.12 changed ``sum``'s rounding)."""
    return math.fsum(values) / len(values)


#: proportion metric -> (its count key, its near-ties key) in ``evaluate_chat``'s figures
PROPORTIONS: Dict[str, Tuple[str, str]] = {
    **{f"{kind}_accuracy": (f"{kind}_n", f"{kind}_near_ties") for kind in chat_data.KINDS + ("double",)},
    "stop_rate": ("stop_n", "stop_near_ties"), "win_rate": ("win_rate_n", "win_near_ties"),
}


def metric_interval(metrics: Dict[str, float], metric: str, z: float = Z_95) -> Tuple[float, float]:
    """Where ``metric`` of one run could lie: for a share (``PROPORTIONS``) the Wilson interval of
    its count (``z``: 95 %), widened by its near ties (each could go either way on another float
    path); for other figures (margins, lengths) the value itself (their spread comes from the seeds
    and paths). Every figure it reads goes through ``check_metric`` (a NaN, a count of 0, negative
    near ties: a ``ValueError`` naming the metric)."""
    if not isinstance(metrics, dict):
        raise TypeError(f"metrics must be one run's figures (a dict), got {type(metrics).__name__}.")
    where = "the run's figures"
    value = check_metric(metrics, metric, where)
    if metric not in PROPORTIONS:
        return value, value
    n_key, ties_key = PROPORTIONS[metric]
    n = check_metric(metrics, n_key, where)
    successes = round(value * n)
    ties = check_metric(metrics, ties_key, where) if ties_key in metrics else 0.0
    return wilson_interval(max(0.0, successes - ties), n, z)[0], wilson_interval(min(n, successes + ties), n, z)[1]


def stage_effect(stage: str, metric: str, records: Optional[Dict[str, Any]] = None,
                 parent: Optional[str] = None, paths: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """How ``stage`` changed ``metric`` relative to its parent stage (or ``parent``), over every
    recorded run (each seed on each float path; ``paths``: only the runs on these paths).

    ``mean`` / ``parent_mean`` / ``change``, ``range`` / ``parent_range`` (min, max of the values),
    ``interval`` / ``parent_interval`` (the envelope of the runs' ``metric_interval``: lowest lower
    bound, highest upper bound), ``lineages`` (runs compared with their own parent: seed and path
    equal) and ``lineages_up`` / ``lineages_down`` (how many of them went up / down), and
    ``direction``:

    * ``"up"`` / ``"down"``: the envelopes do not overlap (every run's interval of the stage lies
      above / below every run's interval of the parent): a re-run on any seed and path shows it;
    * ``"up in every lineage"`` / ``"down in every lineage"``: the envelopes overlap, but in every
      lineage the stage's value lies above / below its own parent's: a consistent change smaller
      than what one run can resolve;
    * ``"within range"``: neither.

    ``runs`` and ``seeds`` count the stage's recorded runs and seeds, ``paths`` its float paths."""
    if stage not in STAGE_INFO:
        raise ValueError(f"unknown stage {stage!r}: the stages are {', '.join(STAGE_INFO)}.")
    return _stage_effect(stage, metric, _checked(records), parent, paths)


def _stage_effect(stage: str, metric: str, records: Dict[str, Any], parent: Optional[str] = None,
                  paths: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    parent = parent or STAGE_INFO[stage].parent
    if parent is None:
        raise ValueError(f"stage {stage!r} has no parent to compare with; pass parent=...")
    child_runs, parent_runs = _seed_runs(records, stage, paths), _seed_runs(records, parent, paths)
    for name, runs in ((stage, child_runs), (parent, parent_runs)):
        for seed, path, run in runs:
            if metric not in run["metrics"]:
                raise ValueError(f"the seed record of {name!r} has no metric {metric!r}; it has "
                                 f"{', '.join(sorted(run['metrics']))}.")
    child = [float(run["metrics"][metric]) for _, _, run in child_runs]
    before = [float(run["metrics"][metric]) for _, _, run in parent_runs]
    child_iv = [metric_interval(run["metrics"], metric) for _, _, run in child_runs]
    parent_iv = [metric_interval(run["metrics"], metric) for _, _, run in parent_runs]
    interval = (min(lo for lo, _ in child_iv), max(hi for _, hi in child_iv))
    parent_interval = (min(lo for lo, _ in parent_iv), max(hi for _, hi in parent_iv))
    own = {(seed, path): float(run["metrics"][metric]) for seed, path, run in parent_runs}
    pairs = [(float(run["metrics"][metric]), own[(seed, path)]) for seed, path, run in child_runs if (seed, path) in own]
    up, down = sum(c > p for c, p in pairs), sum(c < p for c, p in pairs)
    if interval[0] > parent_interval[1]:
        direction = "up"
    elif interval[1] < parent_interval[0]:
        direction = "down"
    elif pairs and up == len(pairs):
        direction = "up in every lineage"
    elif pairs and down == len(pairs):
        direction = "down in every lineage"
    else:
        direction = "within range"
    return {"stage": stage, "parent": parent, "metric": metric, "mean": _mean(child),
            "parent_mean": _mean(before), "change": _mean(child) - _mean(before),
            "range": (min(child), max(child)), "parent_range": (min(before), max(before)), "interval": interval,
            "parent_interval": parent_interval, "lineages": len(pairs), "lineages_up": up, "lineages_down": down,
            "direction": direction, "runs": len(child), "seeds": len({s for s, _, _ in child_runs}),
            "paths": len({p for _, p, _ in child_runs})}


CLAIMS = ("up", "down", "up in every lineage", "down in every lineage", "within range")


def describe_effect(stage: str, metric: str, records: Optional[Dict[str, Any]] = None,
                    parent: Optional[str] = None, paths: Optional[Sequence[str]] = None) -> str:
    """``stage_effect`` as one sentence (asserting nothing): the means, the intervals (shares) or
    ranges (other figures), how many lineages went up and down, and the direction; where the
    direction differs between float paths, each path's own."""
    if stage not in STAGE_INFO:
        raise ValueError(f"unknown stage {stage!r}: the stages are {', '.join(STAGE_INFO)}.")
    return _describe_effect(stage, metric, _checked(records), parent, paths)


def _describe_effect(stage: str, metric: str, records: Dict[str, Any], parent: Optional[str] = None,
                     paths: Optional[Sequence[str]] = None) -> str:
    e = _stage_effect(stage, metric, records, parent, paths)
    fmt = _fmt(metric)
    kind = "95 % intervals" if metric in PROPORTIONS else "ranges"
    low, high = ("interval", "parent_interval") if metric in PROPORTIONS else ("range", "parent_range")
    sentence = (f"{e['stage']} vs {e['parent']}, {metric}: {fmt(e['parent_mean'])} -> {fmt(e['mean'])} ({e['seeds']} seeds "
                f"x {e['paths']} float paths; {kind} {fmt(e[high][0])}-{fmt(e[high][1])} and {fmt(e[low][0])}-"
                f"{fmt(e[low][1])}; higher in {e['lineages_up']} of {e['lineages']} lineages, lower in "
                f"{e['lineages_down']}): {e['direction']}")
    if paths is None and len(records["paths"]) > 1:
        each = {p: _stage_effect(stage, metric, records, parent, [p])["direction"] for p in records["paths"]}
        if len(set(each.values())) > 1:
            sentence += " (" + "; ".join(f"on {p} alone: {d}" for p, d in each.items()) + ")"
    return sentence


def check_claim(stage: str, metric: str, claim: str, records: Optional[Dict[str, Any]] = None,
                parent: Optional[str] = None) -> str:
    """Assert that the record (every seed on every float path) supports a chapter's claim about a
    stage's effect, and return it as a sentence (``describe_effect``). ``claim``: one of
    ``CLAIMS`` (see ``stage_effect``): ``"up"`` / ``"down"`` need envelopes that do not overlap;
    ``"up in every lineage"`` also holds when the effect is ``"up"`` (likewise down); ``"within
    range"`` holds whenever the envelopes overlap (every lineage may still have moved the same
    way, by less than one run resolves). Raises ``AssertionError`` naming the recorded figures
    otherwise, so a chapter cannot state an effect the record does not show."""
    if claim not in CLAIMS:
        raise ValueError(f"claim must be one of {', '.join(repr(c) for c in CLAIMS)}, got {claim!r}.")
    if stage not in STAGE_INFO:
        raise ValueError(f"unknown stage {stage!r}: the stages are {', '.join(STAGE_INFO)}.")
    records = _checked(records)
    direction = _stage_effect(stage, metric, records, parent)["direction"]
    sentence = _describe_effect(stage, metric, records, parent)
    if claim == "within range":
        holds = direction not in ("up", "down")
    else:
        holds = direction == claim or (claim.endswith("in every lineage") and direction == claim.split()[0])
    assert holds, f"the recorded runs do not show '{claim}': {sentence}"
    return sentence


#: The skills a later stage must not destroy (``destroyed_skills``).
SKILLS = ("sum_accuracy", "identity_accuracy", "refusal_accuracy", "stop_rate")
#: Losses a chapter teaches as the lesson, with the measurement: ``(stage, metric) -> chapter``.
#: Chapter 10's LoRA learns the doubling ``n+n=2n`` in the sums' own format, and the held-out sums
#: pay for it (rehearsal softens it); ``destroyed_skills`` marks such runs ``taught``.
TAUGHT_COSTS: Dict[Tuple[str, str], str] = {("lora", "sum_accuracy"): "10"}


def destroyed_skills(records: Dict[str, Any], stages: Sequence[str] = SEEDED_STAGES[1:],
                     skills: Sequence[str] = SKILLS) -> List[Dict[str, Any]]:
    """Every run in which a stage destroyed a skill its own parent (same seed and path) had: the
    parent's interval (``metric_interval``) lies above 20 % and the stage's upper bound is below
    half the parent's lower bound (e.g. refusals 83.7 % of 49 -> 0 %). Each entry says whether the
    loss is one a chapter teaches (``TAUGHT_COSTS``: ``"taught"`` names the chapter, else None).
    Empty when nothing was destroyed."""
    _checked(records)
    out = []
    for stage in stages:
        parent = STAGE_INFO[stage].parent
        for seed, path, run in _seed_runs(records, stage):
            before = records["stages"][parent][str(seed)][path]["metrics"]
            for skill in skills:
                had, now = metric_interval(before, skill), metric_interval(run["metrics"], skill)
                if had[0] > 0.2 and now[1] < had[0] / 2:
                    out.append({"stage": stage, "metric": skill, "seed": seed, "path": path,
                                "parent_value": before[skill], "value": run["metrics"][skill],
                                "taught": TAUGHT_COSTS.get((stage, skill))})
    return out


# ---------------------------------------------------------------------- the report
#: the stage report's columns: (metric, header, "pct" or "num")
REPORT_COLUMNS: Tuple[Tuple[str, str, str], ...] = (
    ("sum_accuracy", "held-out sums", "pct"),
    ("story_accuracy", "stories", "pct"),
    ("identity_accuracy", "identity", "pct"),
    ("refusal_accuracy", "refusals", "pct"),
    ("double_accuracy", "doubling (ch. 10)", "pct"),
    ("stop_rate", "stops at `<\\|im_end\\|>`", "pct"),
    ("preference_margin", "preference margin (nats)", "num"),
    ("win_rate", "wins vs SFT's replies", "pct"),
    ("mean_length", "reply length (tokens)", "num"),
)
REPORT_KEYS = tuple(c[0] for c in REPORT_COLUMNS)
METRICS = REPORT_KEYS

#: What the chapters state about each stage's effect, as ``(stage, metric, claim)`` against the stage's
#: parent over every recorded run (``check_claim``; ``claim`` one of ``CLAIMS``). tests/test_stage_report.py
#: checks every entry against the shipped record; a chapter that states an effect adds it here.
STAGE_CLAIMS: List[Tuple[str, str, str]] = [
    # chapter 09: base -> sft
    ("sft", "sum_accuracy", "up"), ("sft", "identity_accuracy", "up"), ("sft", "refusal_accuracy", "up"),
    ("sft", "stop_rate", "up"), ("sft", "preference_margin", "up"), ("sft", "story_accuracy", "within range"),
    # chapter 10: sft -> lora (the new skill, and what it costs)
    ("lora", "double_accuracy", "up in every lineage"), ("lora", "sum_accuracy", "down"),
    ("lora", "preference_margin", "down in every lineage"), ("lora", "refusal_accuracy", "within range"),
    ("lora", "identity_accuracy", "within range"), ("lora", "stop_rate", "within range"),
    # chapter 11: sft -> dpo (preferences move, the rest is kept on the whole)
    ("dpo", "preference_margin", "up"), ("dpo", "win_rate", "up in every lineage"),
    ("dpo", "refusal_accuracy", "within range"), ("dpo", "sum_accuracy", "within range"),
    ("dpo", "mean_length", "within range"),
    # chapter 12: sft -> grpo (the win rate moves; greedy held-out sums stay within what one run resolves)
    ("grpo", "win_rate", "up in every lineage"), ("grpo", "sum_accuracy", "within range"),
    ("grpo", "refusal_accuracy", "within range"), ("grpo", "stop_rate", "within range"),
]


def _fmt(metric: str) -> Callable[[float], str]:
    kind = dict((k, t) for k, _, t in REPORT_COLUMNS).get(metric, "pct" if "accuracy" in metric or "rate" in metric else "num")
    return (lambda v: f"{100 * v:.1f}%") if kind == "pct" else (lambda v: f"{v:.1f}")


def render_markdown(rows: Sequence[Dict[str, Any]]) -> str:
    """One value per stage and column (e.g. ``stage_rows``), as a markdown table."""
    header = "| stage | chapter | " + " | ".join(h for _, h, _ in REPORT_COLUMNS) + " |"
    lines = [header, "| --- | --- |" + " ---: |" * len(REPORT_COLUMNS)]
    for r in rows:
        cells = [_fmt(k)(r[k]) if k in r else "–" for k in REPORT_KEYS]
        lines.append(f"| {r['stage']} | {r['chapter']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _mark(direction: str) -> str:
    return {"up": " ▲", "down": " ▼", "up in every lineage": " ↑", "down in every lineage": " ↓"}.get(direction, "")


def render_seed_report(records: Dict[str, Any]) -> str:
    """The stage report over seeds and float paths, as markdown.

    The main table: per stage and column the mean over every run (each seed on each float path)
    and, below it, the range (min-max) of the runs; ▲ / ▼ where the stage's runs lie above / below
    its parent's beyond their intervals (``stage_effect`` "up" / "down"), ↑ / ↓ where they overlap
    but every lineage went up / down; then the number of held-out prompts per column. A second
    table gives the mean and range per float path, then the runs in which a stage destroyed a
    skill its parent had (``destroyed_skills``). The record goes through ``check_seed_record`` first."""
    check_seed_record(records)
    seeds, paths = records["seeds"], records["paths"]
    header = "| stage | chapter | " + " | ".join(h for _, h, _ in REPORT_COLUMNS) + " |"
    lines = [header, "| --- | --- |" + " ---: |" * len(REPORT_COLUMNS)]
    for name in STAGES:
        if not records["stages"].get(name):
            continue
        cells = []
        for key in REPORT_KEYS:
            if key == "win_rate" and name == "base":  # against the SFT model's wrong replies: SFT's measure
                cells.append("–")
                continue
            try:
                values = _seed_values(records, name, key)
            except ValueError:
                cells.append("–")
                continue
            fmt = _fmt(key)
            mark = ""
            own = key == "win_rate" and name == "sft"  # its own replies are the reference: low by construction
            if STAGE_INFO[name].parent and records["stages"].get(STAGE_INFO[name].parent) and not own:
                try:
                    mark = _mark(_stage_effect(name, key, records)["direction"])
                except ValueError:
                    pass
            mean = _mean(values)
            cells.append(f"{fmt(mean)}{mark}<br>({fmt(min(values))}–{fmt(max(values))})")
        lines.append(f"| {name} | {STAGE_INFO[name].chapter} | " + " | ".join(cells) + " |")
    first = run_metrics(records, "sft", seeds[0]) if records["stages"].get("sft") else {}
    counts = {"sum_accuracy": "sum_n", "story_accuracy": "story_n", "identity_accuracy": "identity_n",
              "refusal_accuracy": "refusal_n", "double_accuracy": "double_n", "stop_rate": "stop_n",
              "preference_margin": "preference_n", "win_rate": "win_rate_n"}
    n_cells = [f"{int(first[counts[k]])}" if k in counts and counts[k] in first else "" for k in REPORT_KEYS]
    lines.append("| held-out prompts | | " + " | ".join(n_cells) + " |")
    capabilities = records.get("capabilities", {})
    where = ", ".join(f"`{p}`" + (f" ({capabilities[p]})" if p in capabilities else "") for p in paths)
    ties = max((run["metrics"].get(PROPORTIONS[k][1], 0.0) for name in STAGES if records["stages"].get(name)
                for _, _, run in _seed_runs(records, name) for k in REPORT_KEYS if k in PROPORTIONS), default=0.0)
    lines.append(f"\nMean over {len(seeds) * len(paths)} runs: {len(seeds)} seeds ({', '.join(map(str, seeds))}) on "
                 f"{len(paths)} float paths ({where}); range (min–max) below it. ▲ / ▼: every run of the stage lies "
                 "above / below every run of its parent stage (`base` for `sft`, `sft` for the others) beyond the 95 % "
                 "intervals of both (Wilson intervals from the number of held-out prompts, widened by the near ties "
                 f"a run counts: at most {int(ties)} per column here); ↑ / ↓: the intervals overlap, but every "
                 "lineage (seed and path) moved that way from its own parent. `base` is one model (chapter 08's), "
                 "evaluated once per lineage. The win rate is measured on the held-out prompts the lineage's SFT "
                 "model answers wrongly, against that model's own replies (so `sft`'s own win rate is low by "
                 "construction, the number of such prompts varies by lineage, and the same model scores "
                 f"differently against another lineage's SFT model); seed {seeds[0]}'s count on `{paths[0]}` is "
                 "shown.\n")
    path_cols = [("sum_accuracy", "held-out sums"), ("identity_accuracy", "identity"), ("refusal_accuracy", "refusals"),
                 ("double_accuracy", "doubling (ch. 10)"), ("stop_rate", "stops"), ("win_rate", "wins vs SFT's replies")]
    lines.append("| stage | float path | " + " | ".join(h for _, h in path_cols) + " |")
    lines.append("| --- | --- |" + " ---: |" * len(path_cols))
    for name in STAGES:
        if not records["stages"].get(name) or name == "base":
            continue
        for path in paths:
            cells = []
            for key, _ in path_cols:
                try:
                    values = _seed_values(records, name, key, [path])
                except ValueError:  # a run without this figure, as in the main table
                    cells.append("–")
                    continue
                fmt = _fmt(key)
                cells.append(f"{fmt(_mean(values))} ({fmt(min(values))}–{fmt(max(values))})")
            lines.append(f"| {name} | `{path}` | " + " | ".join(cells) + " |")
    lost = destroyed_skills(records)
    untaught = [d for d in lost if not d["taught"]]
    describe = lambda d: (f"{d['stage']} seed {d['seed']} on `{d['path']}`, {d['metric']} "  # noqa: E731
                          f"{_fmt(d['metric'])(d['parent_value'])} -> {_fmt(d['metric'])(d['value'])}")
    lines.append(f"\nMean (min–max) over the {len(seeds)} seeds of each float path. "
                 + ("No run of a later stage destroyed a skill its own parent had (held-out sums, identity, "
                    "refusals, stopping: the parent's interval above 20 % and the stage's below half of it)"
                    if not untaught else "Runs in which a stage destroyed a skill its own parent had: "
                    + "; ".join(describe(d) for d in untaught))
                 + ("; beyond that line, only the cost chapter 10 teaches: " + "; ".join(describe(d) for d in lost if d["taught"])
                    if any(d["taught"] for d in lost) else "") + ".")
    return "\n".join(lines) + "\n"


def render_seed_figure(records: Dict[str, Any], path: Path) -> Path:
    """The report's figure: per stage, the mean of each accuracy column over every run, with the
    envelope of the runs' 95 % intervals (``metric_interval``) as error bars. The record goes through
    ``check_seed_record`` first."""
    check_seed_record(records)
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    columns = [(k, h) for k, h, t in REPORT_COLUMNS if t == "pct"]
    names = [n for n in STAGES if records["stages"].get(n)]
    fig, ax = plt.subplots(figsize=(10, 4.2))
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        means, lows, highs = [], [], []
        for key, _ in columns:
            if key == "win_rate" and name == "base":  # as in the table: the SFT model's measure
                means.append(float("nan"))
                lows.append(0.0)
                highs.append(0.0)
                continue
            runs = _seed_runs(records, name)
            if any(key not in run["metrics"] for _, _, run in runs):  # a run without this figure: no bar, as "–"
                means.append(float("nan"))
                lows.append(0.0)
                highs.append(0.0)
                continue
            v = [float(run["metrics"][key]) for _, _, run in runs]
            intervals = [metric_interval(run["metrics"], key) for _, _, run in runs]
            m = _mean(v)
            means.append(100 * m)
            lows.append(100 * max(0.0, m - min(lo for lo, _ in intervals)))
            highs.append(100 * max(0.0, max(hi for _, hi in intervals) - m))
        xs = [j + (i - (len(names) - 1) / 2) * width for j in range(len(columns))]
        ax.bar(xs, means, width, yerr=[lows, highs], capsize=2, label=name)
    ax.set_xticks(range(len(columns)))
    ax.set_xticklabels([h.replace("`<\\|im_end\\|>`", "<|im_end|>") for _, h in columns], fontsize=8)
    ax.set_ylabel("% of held-out prompts")
    ax.set_ylim(0, 105)
    ax.set_title(f"The stage report: mean of {len(records['seeds'])} seeds x {len(records['paths'])} float paths, "
                 "and the runs' 95 % intervals")
    ax.legend(ncol=len(names), fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.12))
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


