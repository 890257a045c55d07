"""Chapter 10's live LoRA run (section 4) over seeds and float paths: the record its assert is measured on.

    .venv/bin/python tools/lora_live_runs.py                       # seeds 0-3, native and default kernels
    .venv/bin/python tools/lora_live_runs.py --seeds 0 --paths native --out /tmp/x.json   # one run, elsewhere

A 300-step LoRA run lands in a different place on another CPU: float rounding through hundreds of
optimizer steps moves its end point. So the chapter asserts a gain over the ``sft`` model that every
run of this record exceeds, and prints the record's range. Each run is exactly the chapter's cell
(the shipped ``sft`` stage, ``lora.LORA_CONFIG`` with ``eval_every=0``, ``lora.STAGE_SETTINGS``, the
adapters' initial ``A`` drawn after ``torch.manual_seed(seed)``, one thread) with its seed, in a
process of its own on one float path (``stages.path_environment``: ``native`` is the CPU's own SIMD
kernels, ``default`` sets ``ATEN_CPU_CAPABILITY=default``). Each run takes about half a minute on one
thread. The record, ``minimind_ref/checkpoints/lora_live_runs.json``, holds every run's right answers
of the held-out doubling prompts, the machine, torch and the command; re-run this tool after changing
the LoRA recipe, the ``sft`` stage or the held-out prompts, and re-execute chapter 10.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "minimind_ref" / "checkpoints" / "lora_live_runs.json"
COMMAND = "python tools/lora_live_runs.py"
DEFAULT_SEEDS = (0, 1, 2, 3)
DEFAULT_PATHS = ("native", "default")


def run_one(seed: int) -> Dict[str, object]:
    """The chapter's live run with ``seed``, on this process's float path, one thread."""
    import copy
    import warnings

    import torch

    from minimind_ref import chat_data, lora, stages
    from minimind_ref.train import TrainConfig
    from minimind_ref.utils import single_thread

    sft_model, tok = stages.load_stage("sft")
    cfg = TrainConfig.from_json(lora.LORA_CONFIG).replace(eval_every=0, progress=False, out_dir=None, seed=seed)
    s = lora.STAGE_SETTINGS
    model = copy.deepcopy(sft_model)
    start = time.perf_counter()
    with single_thread(), torch.random.fork_rng(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the data loader's truncation note, which the chapter prints
        torch.manual_seed(seed)  # the adapters' A ~ N(0, 0.02), drawn as the chapter draws them
        lora.train_lora(model, tok, cfg, rank=s["rank"], replay=s["replay"], n_train=s["n_train"], seed=seed,
                        log=lambda line: None)
        seconds = time.perf_counter() - start
        accuracy = lora.double_accuracy(model, tok)
    n = len(chat_data.double_eval_exchanges("test"))
    return {"seed": seed, "path": stages.float_path()["path"], "capability": stages.float_path()["capability"],
            "right": int(round(accuracy * n)), "n": n, "accuracy": accuracy, "seconds": round(seconds, 1)}


def run_all(seeds: Sequence[int], paths: Sequence[str], log=print) -> Dict[str, object]:
    """Every (seed, path) in a process of its own; returns the record."""
    import torch

    from minimind_ref import stages

    runs: List[Dict[str, object]] = []
    for path in paths:
        for seed in seeds:
            done = subprocess.run([sys.executable, __file__, "--worker", str(seed)], cwd=ROOT, capture_output=True,
                                  text=True, env=stages.path_environment(path, threads=1))
            if done.returncode != 0:
                raise RuntimeError(f"seed {seed} on the {path} path failed:\n{done.stderr[-2000:]}")
            run = json.loads(done.stdout.strip().splitlines()[-1])
            runs.append(run)
            log(f"seed {seed}, {path} ({run['capability']}): {run['right']} of {run['n']} right, {run['seconds']} s")
    return {"about": "Chapter 10's live LoRA run (section 4) with each seed on each float path, one thread each: "
                     "right answers of the held-out doubling prompts. Made by tools/lora_live_runs.py.",
            "command": f"{COMMAND} --seeds {','.join(map(str, seeds))} --paths {','.join(paths)}",
            "torch": torch.__version__, "machine": platform.processor() or platform.machine(),
            "cpu_capability": str(torch.backends.cpu.get_cpu_capability()), "runs": runs}


def load_record(path: Path = RECORD) -> Dict[str, object]:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", default=",".join(map(str, DEFAULT_SEEDS)))
    parser.add_argument("--paths", default=",".join(DEFAULT_PATHS))
    parser.add_argument("--out", type=Path, default=RECORD)
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)  # one run, in this process
    args = parser.parse_args(argv)
    if args.worker is not None:
        print(json.dumps(run_one(args.worker)))
        return 0
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    record = run_all(seeds, paths)
    args.out.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
