"""The course model at every stage (base, SFT, LoRA, DPO, GRPO), the one held-out evaluation that
the stage report runs on each of them, and the report over seeds.

The post-training chapters start from checkpoints the course's own code made: chapter 08's
pretraining config gives ``base``, chapter 09's SFT run on ``base`` gives ``sft``, and ``lora``,
``dpo`` and ``grpo`` start from ``sft``. The files ship with the package
(``minimind_ref/checkpoints/``, fp16 weights as upstream saves them, plus the tokenizer), each with
the config, command and metrics that produced it, so a chapter runs standalone.

This module owns the shipped files (``stage_path``, ``load_stage``, ``save_stage``,
``stage_metadata``), re-creating them (``build_base``, ``train_stage``, ``rebuild``), the
seeded rebuild over seeds and float paths (``run_lineage``: one seed's stages in this process;
``rebuild_seeds``: every seed on every path, each lineage in a process of its own with
``ATEN_CPU_CAPABILITY`` set, ``--jobs`` at a time), one report row per shipped stage
(``stage_rows``, ``recorded_rows``), the chapters' claims against a record (``check_all_claims``)
and the command line. It stands on three modules, whose names are importable from here as before:
``stage_registry`` (the stages, their parents, files and recipes), ``chat_eval`` (the held-out
evaluation, ``evaluate_chat``) and ``stage_report`` (the record over seeds, the claims and the
report's rendering).

    python -m minimind_ref.stages rebuild --seeds 0,1,2,3,4 --paths native,default --jobs 2
        # the seeded rebuild over seeds and float paths (not part of make test)
    python -m minimind_ref.stages report --out FILE --figure PNG   # the report from the seed record
    python -m minimind_ref.stages claims [--seeds-file FILE]  # the chapters' claims against a record
    python -m minimind_ref.stages report --evaluate       # one row per shipped stage, re-evaluated here
    python -m minimind_ref.stages rebuild [stage]         # re-create one shipped stage (seed 0)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from .checkpoint import _torch_load, check_metadata, check_tokenizer_fits, check_weights
# The evaluation, the registry and the report, importable from here as before (``stages.evaluate_chat``).
from .chat_eval import (EVAL_MAX_NEW_TOKENS, GREEDY_TIE_MARGIN, WIN_TIE_MARGIN, Z_95,  # noqa: F401
                        evaluate_chat, greedy_near_ties, heldout_prompts, mean_logprobs, own_reply_pairs,
                        reference_replies, reply_logprobs, score_reply, score_reply_text, wilson_interval)
from .files import DIGEST_KEY, PathLike, weights_digest
from .stage_registry import (CAPABILITY_ENV, CHECKPOINT_DIR, DEFAULT_SEEDS, FLOAT_PATHS,  # noqa: F401
                             KNOWN_PATHS, RECIPES, RECORD_VERSION, SEEDED_STAGES, SEEDS_FILE, STAGE_INFO,
                             STAGES, TOKENIZER_FILE, Stage)
from .stage_report import (CLAIMS, METRICS, PROPORTIONS, REPORT_COLUMNS, REPORT_KEYS,  # noqa: F401
                           SKILLS, STAGE_CLAIMS, TAUGHT_COSTS, _fmt, check_claim, describe_effect,
                           destroyed_skills, load_seed_records, metric_interval, render_markdown,
                           render_seed_figure, render_seed_report, run_metrics, seed_runs, seed_values,
                           stage_effect)


# ---------------------------------------------------------------------- shipped checkpoints
def stage_path(name: str) -> Path:
    if name not in STAGE_INFO:
        raise ValueError(f"unknown stage {name!r}; the stages are {', '.join(STAGES)}.")
    return CHECKPOINT_DIR / STAGE_INFO[name].file


def available_stages() -> List[str]:
    return [s for s in STAGES if stage_path(s).is_file()]


def load_tokenizer() -> Any:
    """The course tokenizer every stage uses (chapter 08's, shipped with the package)."""
    from .tokenizer import load_tokenizer as _load

    return _load(TOKENIZER_FILE)


def load_stage(name: str, device: Any = "cpu") -> Tuple[torch.nn.Module, Any]:
    """``(model, tokenizer)`` of a shipped stage, the model in fp32 and eval mode."""
    from .checkpoint import load_checkpoint

    path = stage_path(name)
    if not path.is_file():
        raise FileNotFoundError(f"stage {name!r} is not shipped yet ({path.name} missing); available: "
                                f"{', '.join(available_stages()) or 'none'}. Rebuild it with "
                                f"`python -m minimind_ref.stages rebuild {name}`.")
    model, tokenizer = load_checkpoint(path, map_location=device), load_tokenizer()
    check_tokenizer_fits(model.config, tokenizer, path)
    return model, tokenizer


def stage_metadata(name: str) -> Dict[str, Any]:
    """What the shipped file records about how it was made (config, command, metrics).

    The file is verified first: read weights-only (a damaged or truncated file is a one-line
    ``ValueError``), its weights must match the digest ``save_checkpoint`` recorded, and the
    digest ``save_stage`` wrote into ``extra`` (the weights the figures were measured on) must be
    the same: recorded figures are never reported for weights they do not belong to."""
    path = stage_path(name)
    if not path.is_file():
        raise FileNotFoundError(f"stage {name!r} is not shipped yet ({path.name} missing); rebuild it with "
                                f"`python -m minimind_ref.stages rebuild {name}`.")
    blob = _torch_load(path, "cpu")
    if not (isinstance(blob, dict) and isinstance(blob.get("state_dict"), dict) and isinstance(blob.get("extra", {}), dict)):
        raise ValueError(f"{path} is not a stage file (a save_checkpoint file with weights and extra).")
    check_weights(blob["state_dict"], path, digest=blob.get(DIGEST_KEY))
    check_metadata(blob, path)
    extra = dict(blob.get("extra", {}))
    recorded = extra.get(DIGEST_KEY)
    if recorded is not None and recorded != weights_digest(blob["state_dict"]):
        raise ValueError(f"{path}: the figures it records were measured on other weights than the ones it holds (the file "
                         f"was re-saved with new weights and the old metadata); rebuild it with "
                         f"`python -m minimind_ref.stages rebuild {name}`.")
    return extra


def save_stage(model: torch.nn.Module, name: str, extra: Dict[str, Any], folder: Optional[PathLike] = None) -> Path:
    """Write a stage checkpoint: fp16 weights (as upstream saves them) and ``extra``, plus the
    digest of those weights in ``extra`` (see ``stage_metadata``), to the shipped stage's file
    (or its file name in ``folder``). A weight beyond float16's range is a ``ValueError`` naming
    it (it would become inf)."""
    import copy

    from .checkpoint import save_checkpoint

    path = stage_path(name) if folder is None else Path(os.path.expanduser(os.fspath(folder))) / stage_path(name).name
    for key, tensor in model.state_dict().items():  # fp16 holds magnitudes up to 65,504
        finite = tensor[torch.isfinite(tensor)] if tensor.is_floating_point() else None
        if finite is not None and finite.numel() and float(finite.abs().max()) > torch.finfo(torch.float16).max:
            raise ValueError(f"cannot save stage {name!r}: weight {key!r} holds values up to {float(finite.abs().max()):.4g}, "
                             "beyond float16's range (65,504), and stage files store fp16 weights (as upstream saves "
                             "them). Such weights are rare in a healthy run: check the run's loss; save_checkpoint keeps fp32.")
    path.parent.mkdir(parents=True, exist_ok=True)
    half = copy.deepcopy(model).to("cpu").half()
    # the digest of the weights the figures in ``extra`` belong to (stage_metadata checks it)
    extra = {**extra, DIGEST_KEY: weights_digest(half.state_dict())}
    save_checkpoint(half, str(path), extra=extra)
    return path


# ---------------------------------------------------------------------- rebuilding


def build_base(parent: Optional[torch.nn.Module] = None, tokenizer: Any = None,
               seed: int = 0) -> Tuple[torch.nn.Module, Dict[str, Any], Any]:
    """The ``base`` stage: chapter 08's pretraining run, ``python -m minimind_ref.train --config
    ch08_cpu`` (the tokenizer is trained on the run's corpus and ships beside the weights). Not
    re-run by the seeded rebuild: every lineage starts from the shipped ``base``."""
    from .train import TrainConfig, arithmetic_accuracy, train

    cfg = TrainConfig.from_json("ch08_cpu").replace(progress=False, out_dir=None)
    with torch.random.fork_rng():
        result = train(cfg, log=lambda line: None)
    acc = arithmetic_accuracy(result.model, result.tokenizer, result.data.test_problems, torch.device(cfg.device))
    extra = {"recipe": RECIPES["base"], "command": "python -m minimind_ref.train --config ch08_cpu",
             "train_config": cfg.to_dict(), "metrics": {"final_train_loss_mean20": sum(result.history["loss"][-20:]) / 20,
                                                        "final_val_loss": result.history["eval_loss"][-1],
                                                        "heldout_sum_accuracy_all": acc}}
    return result.model, extra, result.tokenizer


def _recipe(name: str) -> Callable[..., Tuple[torch.nn.Module, Dict[str, Any], Any]]:
    import importlib

    if name not in RECIPES:
        raise ValueError(f"no recipe for stage {name!r}; recipes exist for {', '.join(RECIPES)}.")
    module, function = RECIPES[name].split(":")
    return getattr(importlib.import_module(module), function)


def train_stage(name: str, parent: Optional[torch.nn.Module], tokenizer: Any, seed: int = 0
                ) -> Tuple[torch.nn.Module, Dict[str, Any], Any, float]:
    """Run a stage's recipe on a copy of ``parent`` with ``seed``: ``(model, extra, tokenizer,
    seconds)``. The parent is left as it was."""
    import copy
    import time

    start = time.perf_counter()
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        parent_copy = copy.deepcopy(parent) if parent is not None else None
        model, extra, tokenizer = _recipe(name)(parent_copy, tokenizer, seed=seed)
    return model, extra, tokenizer, time.perf_counter() - start


def rebuild(name: str, log: Callable[[str], None] = print, seed: int = 0, folder: Optional[PathLike] = None) -> Path:
    """Re-create a shipped stage from its shipped parent with its recipe, evaluate it (against the
    shipped ``sft`` stage's replies, or its own for ``sft``), save it (to the package's
    checkpoints, or to ``folder``, checked before training starts)."""
    from .files import check_writable
    from .tokenizer import save_tokenizer

    if name not in RECIPES:
        raise ValueError(f"no recipe for stage {name!r}; recipes exist for {', '.join(RECIPES)}.")
    if folder is not None:
        if os.path.exists(os.path.expanduser(os.fspath(folder))) and not os.path.isdir(os.path.expanduser(os.fspath(folder))):
            raise NotADirectoryError(f"the folder for the rebuilt stage {folder} is a file; give a folder.")
        check_writable(Path(os.path.expanduser(os.fspath(folder))) / stage_path(name).name, "the rebuilt stage file")
    else:
        check_writable(stage_path(name), "the rebuilt stage file")
    parent_name = STAGE_INFO[name].parent if name in STAGE_INFO else None
    parent, tokenizer = load_stage(parent_name) if parent_name else (None, None)
    model, extra, tokenizer, seconds = train_stage(name, parent, tokenizer, seed)
    if parent_name is None:
        save_tokenizer(tokenizer, TOKENIZER_FILE if folder is None else Path(os.path.expanduser(os.fspath(folder))) / TOKENIZER_FILE.name)
    reference = None
    if name == "sft":
        reference = reference_replies(model, tokenizer)
    elif stage_path("sft").is_file():
        reference = reference_replies(load_stage("sft")[0], tokenizer)
    extra = {**extra, "stage": name, "parent": parent_name, "seconds": round(seconds, 1),
             "evaluate_chat": evaluate_chat(model, tokenizer, reference), "torch": str(torch.__version__),
             "float_path": float_path()}
    path = save_stage(model, name, extra, folder=folder)
    log(f"rebuilt {name} in {seconds:.0f} s -> {path}")
    return path


# ---------------------------------------------------------------------- seeds and float paths
def float_path() -> Dict[str, str]:
    """The float path this process runs: ``{"path": "native" or the ATEN_CPU_CAPABILITY value,
    "capability": what torch uses (e.g. "AVX512", "AVX2", "DEFAULT")}``."""
    path = os.environ.get(CAPABILITY_ENV, "").strip().lower() or "native"
    capability = str(torch.backends.cpu.get_cpu_capability())
    return {"path": path, "capability": "DEFAULT" if capability == "NO AVX" else capability}  # torch 2.4 says "NO AVX"


def path_environment(path: str, threads: int = 1) -> Dict[str, str]:
    """The environment of a process that runs on float path ``path`` with ``threads`` threads."""
    if path not in KNOWN_PATHS:
        raise ValueError(f"unknown float path {path!r}; choose from {', '.join(KNOWN_PATHS)} (native: the CPU's own "
                         f"kernels; the others set {CAPABILITY_ENV}).")
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    env.pop(CAPABILITY_ENV, None)
    if path != "native":
        env[CAPABILITY_ENV] = path
    return env


def run_lineage(seed: int, save_dir: Optional[PathLike] = None, log: Callable[[str], None] = print) -> Dict[str, Any]:
    """Lineage ``seed`` on this process's float path: ``sft`` from the shipped ``base``, then
    ``lora``, ``dpo`` and ``grpo`` from that ``sft`` model, each with ``seed``; every model (``base``
    too) evaluated with ``evaluate_chat`` against the lineage's ``sft`` replies. Returns
    ``{"seed", "path", "capability", "torch", "stages": {stage: {"metrics", "seconds",
    "stage_metrics"}}}``; with ``save_dir`` the four models are saved there as stage files
    (``save_stage``), with the figures the result holds for them."""
    import time

    start = time.perf_counter()
    base, tokenizer = load_stage("base")
    where = float_path()
    sft_model, sft_extra, _, seconds = train_stage("sft", base, tokenizer, seed)
    reference = reference_replies(sft_model, tokenizer)
    models = {"sft": (sft_model, sft_extra, seconds)}
    for name in SEEDED_STAGES[1:]:
        model, extra, _, seconds = train_stage(name, sft_model, tokenizer, seed)
        models[name] = (model, extra, seconds)
    result: Dict[str, Any] = {"seed": seed, **where, "torch": str(torch.__version__),
                              "stages": {"base": {"metrics": evaluate_chat(base, tokenizer, reference), "seconds": 0.0,
                                                  "stage_metrics": {}}}}
    for name, (model, extra, seconds) in models.items():
        metrics = evaluate_chat(model, tokenizer, reference)
        result["stages"][name] = {"metrics": metrics, "seconds": round(seconds, 1),
                                  "stage_metrics": extra.get("metrics", {})}
        log(f"seed {seed}, {where['path']} ({where['capability']}): {name} trained in {seconds:.0f} s; " + ", ".join(
            f"{k} {metrics[k]:.3f}" for k in REPORT_KEYS if k in metrics))
        if save_dir is not None:
            extra = {**extra, "stage": name, "parent": STAGE_INFO[name].parent, "seconds": round(seconds, 1),
                     "evaluate_chat": metrics, "torch": str(torch.__version__), "float_path": where}
            save_stage(model, name, extra, folder=save_dir)
    result["seconds"] = round(time.perf_counter() - start, 1)
    return result


def _subprocess_lineage(seed: int, path: str, save_dir: Optional[str], work: str,
                        log: Callable[[str], None]) -> Dict[str, Any]:
    """``run_lineage(seed)`` in a new process on float path ``path`` (one thread); its output goes
    to a log file in ``work``, its result to a JSON file there."""
    import subprocess

    from .files import read_json

    stem = os.path.join(work, f"seed{seed}-{path}")
    cmd = [sys.executable, "-m", "minimind_ref.stages", "lineage", "--seed", str(seed), "--result", stem + ".json"]
    if save_dir is not None:
        cmd += ["--save-dir", save_dir]
    with open(stem + ".log", "w", encoding="utf-8") as out:
        code = subprocess.run(cmd, env=path_environment(path), stdout=out, stderr=subprocess.STDOUT).returncode
    if code != 0:
        with open(stem + ".log", encoding="utf-8", errors="replace") as f:
            tail = "".join(f.readlines()[-15:])
        raise RuntimeError(f"lineage seed {seed} on float path {path!r} failed (exit code {code}); the end of its "
                           f"output:\n{tail}")
    return read_json(stem + ".json", "lineage result")


def _check_seeds_and_paths(seeds: Sequence[int], paths: Sequence[str]) -> None:
    if not seeds or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in seeds):
        raise ValueError(f"seeds must be whole numbers >= 0 (at least one), got {list(seeds)!r}.")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds must be distinct, got {list(seeds)!r}.")
    if not paths or len(set(paths)) != len(paths):
        raise ValueError(f"paths must be distinct float paths (at least one), got {list(paths)!r}.")
    for path in paths:
        path_environment(path)  # a clear error for an unknown name


def rebuild_seeds(seeds: Sequence[int] = DEFAULT_SEEDS, paths: Sequence[str] = FLOAT_PATHS, jobs: int = 1,
                  ship_seed: Optional[int] = 0, out: Optional[PathLike] = SEEDS_FILE,
                  ship_dir: PathLike = CHECKPOINT_DIR, log: Callable[[str], None] = print,
                  runner: Optional[Callable[..., Dict[str, Any]]] = None) -> Dict[str, Any]:
    """Every post-training stage trained with each seed on each float path, and every model
    evaluated: one lineage (``run_lineage``) per seed and path, each in a process of its own
    (``ATEN_CPU_CAPABILITY`` is read when torch is imported), ``jobs`` of them at a time (one
    thread each).

    Everything is checked before the first step: the seeds, the paths, ``out`` (the record, JSON;
    None: not written) and ``ship_dir`` (a writable folder, or one that can be created). Only when
    every lineage has finished are the models of ``ship_seed`` on the first path copied into
    ``ship_dir`` as the shipped stages (None: nothing is shipped) and the record written, each file
    atomically, so a failed or interrupted rebuild leaves the previous files as they were.

    Returns ``{"version", "command", "seeds", "paths", "capabilities", "ship": {"seed", "path"},
    "torch", "seconds", "stages": {stage: {seed: {path: {"metrics", "seconds", "stage_metrics"}}}}}``
    (seed keys are strings, as JSON has them). ``runner(seed, path, save_dir, work, log)`` runs one
    lineage (default: a subprocess; tests pass their own)."""
    import shutil
    import tempfile
    import time
    from concurrent.futures import ThreadPoolExecutor

    from .files import atomic_write, check_writable, write_text

    seeds, paths = list(seeds), list(paths)
    _check_seeds_and_paths(seeds, paths)
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs must be a whole number >= 1 (lineages run at a time), got {jobs!r}.")
    if ship_seed is not None and ship_seed not in seeds:
        raise ValueError(f"ship_seed {ship_seed!r} is not among the seeds {seeds}: pass one of them, or None to ship nothing.")
    if out is not None:
        out = check_writable(out, "the seed record (--out)")
    if ship_seed is not None:
        if os.path.exists(ship_dir) and not os.path.isdir(ship_dir):
            raise NotADirectoryError(f"the folder for the shipped stages (--ship-dir) {ship_dir} is a file; give a folder.")
        for name in SEEDED_STAGES:
            check_writable(Path(ship_dir) / STAGE_INFO[name].file, "the shipped stage file")
    runner = runner or _subprocess_lineage
    jobs_list = [(seed, path) for seed in seeds for path in paths]
    command = (f"python -m minimind_ref.stages rebuild --seeds {','.join(map(str, seeds))} --paths {','.join(paths)}"
               f" --jobs {jobs}")
    log(f"{command}: {len(jobs_list)} lineages, {jobs} at a time")
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="minimind-stage-seeds-") as work:
        def one(job: Tuple[int, str]) -> Dict[str, Any]:
            seed, path = job
            save_dir = os.path.join(work, f"ship-seed{seed}-{path}") if (seed, path) == (ship_seed, paths[0]) else None
            result = runner(seed, path, save_dir, work, log)
            log(f"seed {seed} on {path} ({result.get('capability', '?')}): done in {result.get('seconds', 0):.0f} s; sft "
                f"held-out sums {result['stages']['sft']['metrics']['sum_accuracy']:.1%}")
            return result

        with ThreadPoolExecutor(max_workers=jobs) as pool:
            results = list(pool.map(one, jobs_list))
        record: Dict[str, Any] = {
            "version": RECORD_VERSION, "command": command, "seeds": seeds, "paths": paths,
            "capabilities": {path: next(r["capability"] for r in results if r["path"] == path) for path in paths},
            "ship": {"seed": ship_seed, "path": paths[0]} if ship_seed is not None else None,
            "torch": str(torch.__version__), "machine": platform.machine(),
            "seconds": {"wall": round(time.perf_counter() - start, 1), "jobs": jobs,
                        "lineages": {f"{r['seed']}/{r['path']}": r["seconds"] for r in results}},
            "stages": {name: {str(seed): {} for seed in seeds} for name in ("base",) + SEEDED_STAGES}}
        for result in results:
            for name, entry in result["stages"].items():
                record["stages"][name][str(result["seed"])][result["path"]] = entry
        if ship_seed is not None:
            source = os.path.join(work, f"ship-seed{ship_seed}-{paths[0]}")
            os.makedirs(ship_dir, exist_ok=True)
            for name in SEEDED_STAGES:
                with open(os.path.join(source, STAGE_INFO[name].file), "rb") as src, \
                        atomic_write(Path(ship_dir) / STAGE_INFO[name].file, "wb") as dst:
                    shutil.copyfileobj(src, dst)
        if out is not None:
            write_text(out, json.dumps(record, indent=1, sort_keys=True) + "\n")
    log(f"{len(jobs_list)} lineages in {record['seconds']['wall'] / 60:.1f} min wall" + (f"; record: {out}" if out else ""))
    return record



# ---------------------------------------------------------------------- report rows
def stage_rows(stages: Sequence[str] = STAGES, evaluate: Callable[..., Dict[str, float]] = evaluate_chat) -> List[Dict[str, Any]]:
    """One row per available shipped stage: its name, chapter and ``evaluate_chat`` metrics
    (against the shipped ``sft`` stage's replies when it is shipped)."""
    reference = None
    if stage_path("sft").is_file() and evaluate is evaluate_chat:
        model, tokenizer = load_stage("sft")
        reference = reference_replies(model, tokenizer)
    rows = []
    for name in stages:
        if not stage_path(name).is_file():
            continue
        model, tokenizer = load_stage(name)
        metrics = evaluate(model, tokenizer, reference) if reference is not None else evaluate(model, tokenizer)
        rows.append({"stage": name, "chapter": STAGE_INFO[name].chapter, **metrics})
    return rows


def recorded_rows(stages: Sequence[str] = STAGES) -> List[Dict[str, Any]]:
    """The same rows as ``stage_rows``, from the ``evaluate_chat`` figures each shipped file
    recorded when it was built (no model is run)."""
    rows = []
    for name in stages:
        if stage_path(name).is_file():
            figures = stage_metadata(name).get("evaluate_chat")
            # every version of evaluate_chat records these two (base.pt keeps chapter 08's older figures)
            if not isinstance(figures, dict) or not {"sum_accuracy", "stop_rate"} <= set(figures):
                raise ValueError(f"{stage_path(name)} records no evaluate_chat figures: it was not made by "
                                 "`python -m minimind_ref.stages rebuild`. Run the report without --recorded, or "
                                 "rebuild the stage.")
            rows.append({"stage": name, "chapter": STAGE_INFO[name].chapter, **figures})
    return rows



def check_all_claims(records: Dict[str, Any], log: Callable[[str], None] = print) -> int:
    """Every claim of ``STAGE_CLAIMS`` and the no-destroyed-skill rule checked against ``records``
    (a seed record: the shipped one, or your own rebuild's), one line each; 0 when all hold, else 1."""
    failed = 0
    for stage, metric, claim in STAGE_CLAIMS:
        try:
            log(f"holds: {check_claim(stage, metric, claim, records)}")
        except (AssertionError, ValueError) as error:
            failed += 1
            log(f"FAILS: {error}")
    lost = [d for d in destroyed_skills(records) if not d["taught"]]
    for d in lost:
        log(f"FAILS: {d['stage']} seed {d['seed']} on {d['path']} destroyed {d['metric']}: "
            f"{_fmt(d['metric'])(d['parent_value'])} -> {_fmt(d['metric'])(d['value'])}")
    log(f"{len(STAGE_CLAIMS) - failed} of {len(STAGE_CLAIMS)} claims hold over {len(records['seeds'])} seeds x "
        f"{len(records['paths'])} float paths; " + (f"{len(lost)} runs destroyed a skill" if lost else
                                                      "no run destroyed a skill its parent had"))
    return 1 if failed or lost else 0


def _seed_list(text: str) -> List[int]:
    """``--seeds``: comma-separated whole numbers >= 0, each once (argparse turns the error into a usage line)."""
    try:
        seeds = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--seeds takes comma-separated integers, e.g. --seeds 0,1,2,3,4; got {text!r}") from None
    if len(set(seeds)) != len(seeds) or min(seeds) < 0:
        raise argparse.ArgumentTypeError(f"--seeds must name each seed once, each >= 0; got {text!r}")
    return seeds


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m minimind_ref.stages", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    rep = sub.add_parser("report", help="render the stage report (the seeded record, or a fresh evaluation)")
    rep.add_argument("--out", default=None, help="write the table to this file instead of printing it")
    rep.add_argument("--figure", default=None, help="also draw the report's figure (PNG) to this file")
    rep.add_argument("--seeds-file", default=None, help=f"the seeded record (default {SEEDS_FILE.name} beside the checkpoints)")
    rep.add_argument("--recorded", action="store_true",
                     help="one row per shipped stage, from the figures each file recorded")
    rep.add_argument("--evaluate", action="store_true", help="one row per shipped stage, re-evaluated here")
    reb = sub.add_parser("rebuild", help="re-create shipped stage checkpoints with their recipes (in stage order)")
    reb.add_argument("stages", nargs="*", default=None, help=f"stages to rebuild (default: all of {', '.join(SEEDED_STAGES)})")
    reb.add_argument("--seeds", default=None, type=_seed_list,
                     help="comma-separated seeds, e.g. 0,1,2,3,4: train every post-training stage with each seed on "
                          "each float path (lineages from the shipped base), record every run's metrics, ship the first "
                          "seed's models of the first path")
    reb.add_argument("--paths", default=",".join(FLOAT_PATHS),
                     help=f"with --seeds: comma-separated float paths (default {','.join(FLOAT_PATHS)}; also "
                          f"{', '.join(p for p in KNOWN_PATHS if p not in FLOAT_PATHS)}); each runs in its own process "
                          f"with {CAPABILITY_ENV} set (native: unset)")
    reb.add_argument("--jobs", type=int, default=1, help="with --seeds: lineages run at a time, one thread each (default 1)")
    reb.add_argument("--out", default=None, help=f"with --seeds: the record to write (default: {SEEDS_FILE.name} beside "
                                                  "the checkpoints)")
    reb.add_argument("--ship-dir", default=None, help="where the rebuilt stage files go (default: the package's "
                                                      "checkpoints folder)")
    reb.add_argument("--no-ship", action="store_true", help="with --seeds: write the record only, no stage file")
    cla = sub.add_parser("claims", help="check every claim the chapters make (STAGE_CLAIMS) and that no later stage "
                                        "destroyed a skill, against a seed record; exit status 1 if one fails")
    cla.add_argument("--seeds-file", default=None, help=f"the seed record (default {SEEDS_FILE.name} beside the "
                                                        "checkpoints; e.g. the --out of your own rebuild)")
    lin = sub.add_parser("lineage", help="one lineage on this process's float path (what rebuild --seeds runs per "
                                         "seed and path): JSON result")
    lin.add_argument("--seed", type=int, required=True)
    lin.add_argument("--result", required=True, help="the JSON file to write the lineage's figures to")
    lin.add_argument("--save-dir", default=None, help="also save the lineage's four models there as stage files")
    args = p.parse_args(argv)
    if args.command == "rebuild":
        if args.seeds:
            paths = [x.strip() for x in args.paths.split(",") if x.strip()]
            try:  # a usage line, not a traceback, for a bad path or job count (nothing has run yet)
                _check_seeds_and_paths(args.seeds, paths)
                if args.jobs < 1:
                    raise ValueError(f"--jobs must be >= 1 (lineages run at a time), got {args.jobs}.")
            except ValueError as error:
                p.error(str(error))
            rebuild_seeds(args.seeds, paths, args.jobs, ship_seed=None if args.no_ship else args.seeds[0],
                          out=args.out or SEEDS_FILE, ship_dir=args.ship_dir or CHECKPOINT_DIR)
        else:
            names = args.stages or list(SEEDED_STAGES)
            for name in names:  # every name and the output folder checked before the first run
                if name not in RECIPES:
                    raise SystemExit(f"unknown stage {name!r}; the stages are {', '.join(RECIPES)}.")
            for name in names:
                rebuild(name, folder=args.ship_dir)
    if args.command == "claims":
        try:
            records = load_seed_records(Path(args.seeds_file) if args.seeds_file else None)
        except (FileNotFoundError, ValueError) as error:
            p.error(str(error))
        return check_all_claims(records)
    if args.command == "lineage":
        from .files import check_writable, write_text

        check_writable(args.result, "the lineage result (--result)")
        result = run_lineage(args.seed, args.save_dir)
        write_text(args.result, json.dumps(result, indent=1, sort_keys=True) + "\n")
    if args.command == "report":
        from .files import check_writable

        for path, what in ((args.out, "--out (the report's table)"), (args.figure, "--figure (the report's PNG)")):
            if path:  # before any evaluation: a folder or an unwritable place fails now, not after minutes
                check_writable(path, what)
        with torch.inference_mode(False):
            if args.recorded or args.evaluate:
                table = render_markdown(recorded_rows() if args.recorded else stage_rows())
            else:
                records = load_seed_records(Path(args.seeds_file) if args.seeds_file else None)
                table = render_seed_report(records)
                if args.figure:
                    render_seed_figure(records, Path(args.figure))
        if args.out:
            from .files import write_text

            write_text(args.out, table)  # atomic
        else:
            print(table, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
