"""How far the stage record's two float paths move what the held-out evaluation decides on.

    python -m benchmarks.float_paths      # writes benchmarks/results/float_paths.json (a few minutes, one thread)

The stage record (``minimind_ref/checkpoints/stage_seeds.json``) trains and evaluates every lineage on
two float paths: the CPU's own SIMD kernels (``native``) and ``ATEN_CPU_CAPABILITY=default``. The
evaluation counts a decision another path could flip as a near tie (``chat_eval.greedy_near_ties``,
``win_near_ties``): a greedy step whose two best logits lie within ``chat_eval.GREEDY_TIE_MARGIN``, a
win-rate pair whose two summed log-probabilities lie within ``chat_eval.WIN_TIE_MARGIN`` nats. This
benchmark measures what those margins must cover: the same shipped models, on the same inputs, on
both paths (each in a process of its own, one thread), and the largest difference between the paths in

* a summed log-probability of a reply (``chat_eval.reply_logprobs``), and in a win-rate pair's
  difference of two sums, over the win-rate pairs of every shipped stage against the shipped
  ``sft`` model's greedy replies (the pairs ``evaluate_chat`` scores: the held-out prompts whose
  ``sft`` reply is wrong, the right answer against that reply);
* the gap between the two best logits, at every position of those conversations (teacher forcing).

``tests/test_float_paths.py`` checks that both margins are at least ten times the largest difference
measured, and that the Performance page quotes this record (``quote``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import torch

RESULTS = Path(__file__).resolve().parent / "results"
RECORD = RESULTS / "float_paths.json"
COMMAND = "python -m benchmarks.float_paths"
PATHS = ("native", "default")


def win_pairs() -> List[Dict[str, Any]]:
    """The win-rate pairs against the shipped ``sft`` model's greedy replies (one thread)."""
    from minimind_ref import chat_eval, stages
    from minimind_ref.utils import single_thread

    sft_model, tok = stages.load_stage("sft")
    with single_thread():
        reference = chat_eval.reference_replies(sft_model, tok)
    return chat_eval.own_reply_pairs(chat_eval.heldout_prompts(), reference)


@torch.no_grad()
def top2_gaps(model: torch.nn.Module, tokenizer: Any, conversations: Sequence[Sequence[Dict[str, str]]],
              batch_size: int = 64) -> torch.Tensor:
    """The gap between the two best logits at every position of every conversation, one flat tensor."""
    from minimind_ref.sft import encode_chat

    encoded = [encode_chat(tokenizer, c) for c in conversations]
    gaps = []
    model.eval()
    for start in range(0, len(encoded), batch_size):
        rows = encoded[start:start + batch_size]
        width = max(len(r) for r in rows)
        x = torch.zeros(len(rows), width, dtype=torch.long)
        for i, ids in enumerate(rows):
            x[i, :len(ids)] = torch.tensor(ids)
        top2 = model(x).logits.float().topk(2, dim=-1).values
        for i, ids in enumerate(rows):
            gaps.append(top2[i, :len(ids), 0] - top2[i, :len(ids), 1])
    return torch.cat(gaps)


def measure(pairs: Sequence[Dict[str, Any]]) -> Dict[str, Dict[str, torch.Tensor]]:
    """On this process's float path: per shipped stage, the chosen and rejected replies' summed
    log-probabilities and the top-two logit gaps of every position."""
    from minimind_ref import chat_eval, stages
    from minimind_ref.utils import single_thread

    out = {}
    with single_thread():
        for name in stages.available_stages():
            model, tok = stages.load_stage(name)
            chosen, _ = chat_eval.reply_logprobs(model, tok, [p["chosen"] for p in pairs])
            rejected, _ = chat_eval.reply_logprobs(model, tok, [p["rejected"] for p in pairs])
            gaps = top2_gaps(model, tok, [p["chosen"] for p in pairs] + [p["rejected"] for p in pairs])
            out[name] = {"chosen": chosen, "rejected": rejected, "gaps": gaps}
    return out


def compare(a: Dict[str, Dict[str, torch.Tensor]], b: Dict[str, Dict[str, torch.Tensor]]) -> Dict[str, Any]:
    """The largest differences between two ``measure`` results, per stage and over all of them."""
    stages = {}
    for name in a:
        x, y = a[name], b[name]
        sums = torch.cat([(x["chosen"] - y["chosen"]).abs(), (x["rejected"] - y["rejected"]).abs()])
        margins = ((x["chosen"] - x["rejected"]) - (y["chosen"] - y["rejected"])).abs()
        stages[name] = {"max_sum_diff": float(sums.max()), "max_pair_diff": float(margins.max()),
                        "max_gap_diff": float((x["gaps"] - y["gaps"]).abs().max()), "positions": int(x["gaps"].numel())}
    return {"stages": stages, **{k: max(s[k] for s in stages.values())
                                 for k in ("max_sum_diff", "max_pair_diff", "max_gap_diff")}}


def quote(record: Dict[str, Any]) -> str:
    """The Performance page's sentence about this record (``tests/test_float_paths.py`` looks for it)."""
    return (f"moved a summed log-probability by at most {record['max_sum_diff']:.1e} nats and the gap between "
            f"two best logits by at most {record['max_gap_diff']:.1e}, over the {record['pairs']} win-rate pairs of "
            f"the {len(record['stages'])} shipped stages against the shipped `sft` model's replies")


def run(log=print) -> Dict[str, Any]:
    from minimind_ref import chat_eval, stages

    pairs = win_pairs()
    results, capabilities = {}, {}
    with tempfile.TemporaryDirectory(prefix="minimind_float_paths_") as work:
        pairs_file = Path(work) / "pairs.json"
        pairs_file.write_text(json.dumps(pairs), encoding="utf-8")
        for path in PATHS:
            out = Path(work) / f"{path}.pt"
            done = subprocess.run([sys.executable, "-m", "benchmarks.float_paths", "--worker", str(pairs_file),
                                   str(out)], cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True,
                                  env=stages.path_environment(path, threads=1))
            if done.returncode != 0:
                raise RuntimeError(f"the {path} path failed:\n{done.stderr[-2000:]}")
            saved = torch.load(out, weights_only=True)
            capabilities[path] = saved.pop("capability")
            results[path] = saved
            log(f"{path} ({capabilities[path]}): {len(saved)} stages measured")
    record = {"about": "The largest differences between the stage record's two float paths (native kernels and "
                       "ATEN_CPU_CAPABILITY=default, one thread each) in what the held-out evaluation decides on; "
                       "made by benchmarks/float_paths.py.",
              "command": COMMAND, "date": datetime.date.today().isoformat(), "torch": torch.__version__,
              "capabilities": capabilities, "pairs": len(pairs),
              "margins": {"win_nats": chat_eval.WIN_TIE_MARGIN, "greedy_logits": chat_eval.GREEDY_TIE_MARGIN}}
    record.update(compare(results["native"], results["default"]))
    return record


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=RECORD)
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)  # pairs file, output file: one path
    args = parser.parse_args(argv)
    if args.worker:
        from minimind_ref.stages import float_path

        pairs = json.loads(Path(args.worker[0]).read_text(encoding="utf-8"))
        saved: Dict[str, Any] = dict(measure(pairs))
        saved["capability"] = float_path()["capability"]
        torch.save(saved, args.worker[1])
        return 0
    record = run()
    args.out.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    print(quote(record))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
