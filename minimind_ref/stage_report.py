"""The stage report over seeds: the seeded rebuild's record (``load_seed_records``,
``seed_values``), a stage's effect against its parent over the seeds (``stage_effect``) and the
chapters' claims checked against it (``check_claim``, ``STAGE_CLAIMS``), and the report itself
as a table and a figure (``REPORT_COLUMNS``, ``render_markdown``, ``render_seed_report``,
``render_seed_figure``). It measures nothing and loads no model: the figures come from the
record (or from ``stages.stage_rows``). ``stages`` re-exports every name here.

The report is over seeds: ``python -m minimind_ref.stages rebuild --seeds 0,1,2`` trains every
post-training stage from its parent with each seed (lineages from the shipped ``base``),
evaluates every model, records each seed's metrics in ``checkpoints/stage_seeds.json`` and ships
the first seed's models. ``render_seed_report`` shows mean and range per cell and marks the
changes that exceed the seed range; ``stage_effect`` / ``check_claim`` let a chapter (or a test)
state a stage's effect only if the record supports it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from .stage_registry import SEEDS_FILE, STAGE_INFO, STAGES


def load_seed_records(path: Optional[Path] = None) -> Dict[str, Any]:
    """The seeded rebuild's record (``rebuild_seeds``), shipped beside the checkpoints."""
    import json

    path = Path(path) if path is not None else SEEDS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no seed record at {path}: run `python -m minimind_ref.stages rebuild --seeds 0,1,2`.")
    records = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(records, dict) or not isinstance(records.get("stages"), dict):
        raise ValueError(f"{path} is not a seed record: expected a JSON object with \"stages\" (as "
                         "`python -m minimind_ref.stages rebuild --seeds 0,1,2` writes), got "
                         f"{type(records).__name__}{' without stages' if isinstance(records, dict) else ''}.")
    return records


def seed_values(records: Dict[str, Any], stage: str, metric: str) -> List[float]:
    """The values of ``metric`` for ``stage`` over the recorded seeds (in seed order)."""
    per_seed = records["stages"].get(stage, {})
    if not per_seed:
        raise ValueError(f"the seed record has no stage {stage!r}; it has {', '.join(records['stages'])}.")
    out = []
    for seed in sorted(per_seed, key=int):
        metrics = per_seed[seed]["metrics"]
        if metric not in metrics:
            raise ValueError(f"the seed record of {stage!r} has no metric {metric!r}; it has {', '.join(sorted(metrics))}.")
        out.append(float(metrics[metric]))
    return out


def stage_effect(stage: str, metric: str, records: Optional[Dict[str, Any]] = None,
                 parent: Optional[str] = None) -> Dict[str, Any]:
    """How ``stage`` changed ``metric`` relative to its parent stage (or ``parent``), over the
    recorded seeds: ``mean`` / ``parent_mean`` / ``change`` (child mean - parent mean),
    ``range`` / ``parent_range`` (min, max) and ``direction``: ``"up"`` when every seed of the
    stage lies above every seed of the parent (the ranges do not overlap), ``"down"`` in the
    opposite case, ``"within range"`` when the ranges overlap."""
    if stage not in STAGE_INFO:
        raise ValueError(f"unknown stage {stage!r}: the stages are {', '.join(STAGE_INFO)}.")
    records = records if records is not None else load_seed_records()
    parent = parent or STAGE_INFO[stage].parent
    if parent is None:
        raise ValueError(f"stage {stage!r} has no parent to compare with; pass parent=...")
    child, before = seed_values(records, stage, metric), seed_values(records, parent, metric)
    if min(child) > max(before):
        direction = "up"
    elif max(child) < min(before):
        direction = "down"
    else:
        direction = "within range"
    return {"stage": stage, "parent": parent, "metric": metric, "mean": sum(child) / len(child),
            "parent_mean": sum(before) / len(before), "change": sum(child) / len(child) - sum(before) / len(before),
            "range": (min(child), max(child)), "parent_range": (min(before), max(before)), "direction": direction,
            "seeds": len(child)}


def check_claim(stage: str, metric: str, claim: str, records: Optional[Dict[str, Any]] = None,
                parent: Optional[str] = None) -> str:
    """Assert that the recorded seeds support a chapter's claim about a stage's effect, and return
    it as a sentence. ``claim``: ``"up"`` / ``"down"`` (beyond the seed range) or ``"within
    range"`` (no change beyond it). Raises ``AssertionError`` naming the recorded figures
    otherwise, so a chapter cannot state an effect the report does not show."""
    if claim not in ("up", "down", "within range"):
        raise ValueError(f"claim must be 'up', 'down' or 'within range', got {claim!r}.")
    e = stage_effect(stage, metric, records, parent)
    fmt = _fmt(metric)
    sentence = (f"{e['stage']} vs {e['parent']}, {metric}: {fmt(e['parent_mean'])} -> {fmt(e['mean'])} "
                f"(seed ranges {fmt(e['parent_range'][0])}-{fmt(e['parent_range'][1])} and "
                f"{fmt(e['range'][0])}-{fmt(e['range'][1])}, {e['seeds']} seeds): {e['direction']}")
    assert e["direction"] == claim, f"the recorded seeds do not show '{claim}': {sentence}"
    return sentence


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

#: What the chapters state about each stage's effect, as ``(stage, metric, "up" | "down" | "within
#: range")`` against the stage's parent over the recorded seeds (``check_claim``). tests/test_stage_report.py
#: checks every entry against the shipped record; a chapter that states an effect adds it here.
STAGE_CLAIMS: List[Tuple[str, str, str]] = [
    # chapter 09: base -> sft
    ("sft", "sum_accuracy", "up"), ("sft", "identity_accuracy", "up"), ("sft", "refusal_accuracy", "up"),
    ("sft", "stop_rate", "up"), ("sft", "preference_margin", "up"), ("sft", "story_accuracy", "within range"),
    # chapter 10: sft -> lora (the new skill, and what it costs)
    ("lora", "double_accuracy", "up"), ("lora", "sum_accuracy", "down"), ("lora", "preference_margin", "down"),
    ("lora", "refusal_accuracy", "within range"), ("lora", "identity_accuracy", "within range"),
    ("lora", "stop_rate", "within range"),
    # chapter 11: sft -> dpo (preferences move, refusals are kept)
    ("dpo", "preference_margin", "up"), ("dpo", "win_rate", "up"), ("dpo", "refusal_accuracy", "within range"),
    ("dpo", "sum_accuracy", "within range"), ("dpo", "mean_length", "within range"),
    # chapter 12: sft -> grpo (a greedy gain on held-out sums)
    ("grpo", "sum_accuracy", "up"), ("grpo", "win_rate", "up"), ("grpo", "refusal_accuracy", "within range"),
    ("grpo", "stop_rate", "within range"),
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


def render_seed_report(records: Dict[str, Any]) -> str:
    """The stage report over seeds, as markdown: per stage and column the mean and, below it, the
    range (min-max) over the seeds; ▲ / ▼ where every seed of a stage lies above / below every
    seed of its parent stage (``stage_effect``); then the number of held-out prompts per column."""
    seeds = records["seeds"]
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
                values = seed_values(records, name, key)
            except ValueError:
                cells.append("–")
                continue
            fmt = _fmt(key)
            mark = ""
            own = key == "win_rate" and name == "sft"  # its own replies are the reference: low by construction
            if STAGE_INFO[name].parent and records["stages"].get(STAGE_INFO[name].parent) and not own:
                try:
                    direction = stage_effect(name, key, records)["direction"]
                    mark = {"up": " ▲", "down": " ▼"}.get(direction, "")
                except ValueError:
                    pass
            mean = sum(values) / len(values)
            cells.append(f"{fmt(mean)}{mark}<br>({fmt(min(values))}–{fmt(max(values))})")
        lines.append(f"| {name} | {STAGE_INFO[name].chapter} | " + " | ".join(cells) + " |")
    first = records["stages"]["sft"][str(seeds[0])]["metrics"] if records["stages"].get("sft") else {}
    counts = {"sum_accuracy": "sum_n", "story_accuracy": "story_n", "identity_accuracy": "identity_n",
              "refusal_accuracy": "refusal_n", "double_accuracy": "double_n", "preference_margin": "preference_n",
              "win_rate": "win_rate_n"}
    n_cells = [f"{int(first[counts[k]])}" if k in counts and counts[k] in first else "" for k in REPORT_KEYS]
    lines.append("| held-out prompts | | " + " | ".join(n_cells) + " |")
    legend = (f"\nMean over {len(seeds)} seeds ({', '.join(map(str, seeds))}), range (min–max) below it. "
              "▲ / ▼: every seed of the stage lies above / below every seed of its parent stage (`base` for "
              "`sft`, `sft` for the others). `base` is one model (chapter 08's), evaluated once per lineage. The win "
              "rate is measured on the held-out prompts the lineage's SFT model answers wrongly, against that "
              "model's own replies (so `sft`'s own win rate is low by construction, and the number of such "
              f"prompts varies by seed; seed {seeds[0]}'s count is shown).\n")
    return "\n".join(lines) + "\n" + legend


def render_seed_figure(records: Dict[str, Any], path: Path) -> Path:
    """The report's figure: per stage, the mean of each accuracy column with its seed range."""
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
            v = seed_values(records, name, key)
            m = sum(v) / len(v)
            means.append(100 * m)
            lows.append(100 * (m - min(v)))
            highs.append(100 * (max(v) - m))
        xs = [j + (i - (len(names) - 1) / 2) * width for j in range(len(columns))]
        ax.bar(xs, means, width, yerr=[lows, highs], capsize=2, label=name)
    ax.set_xticks(range(len(columns)))
    ax.set_xticklabels([h.replace("`<\\|im_end\\|>`", "<|im_end|>") for _, h in columns], fontsize=8)
    ax.set_ylabel("% of held-out prompts")
    ax.set_ylim(0, 105)
    ax.set_title(f"The stage report: mean and range over {len(records['seeds'])} seeds")
    ax.legend(ncol=len(names), fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.12))
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
