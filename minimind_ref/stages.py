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

The command line refuses, before any work, what does not apply: stage names with ``--seeds``,
``--out``/``--paths``/``--jobs``/``--no-ship`` without it, ``--recorded`` with ``--evaluate``, and
the combinations that would leave the package's record and its stage files describing different
runs (``--out`` without ``--ship-dir`` or ``--no-ship``; ``--ship-dir`` or ``--no-ship`` without
``--out``). The shipped stage files, their tokenizer and the record change as one set
(``stage_set``: a manifest written last, checked whenever a stage or the record is loaded).
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
from .stage_set import check_set, file_sha256, write_set, write_set_files
from .stage_registry import (CAPABILITY_ENV, CHECKPOINT_DIR, DEFAULT_SEEDS, FLOAT_PATHS,  # noqa: F401
                             KNOWN_PATHS, RECIPES, RECORD_VERSION, SEEDED_STAGES, SEEDS_FILE, STAGE_INFO,
                             STAGES, TOKENIZER_FILE, Stage)
from .stage_report import (CLAIMS, METRICS, PROPORTIONS, REPORT_COLUMNS, REPORT_KEYS,  # noqa: F401
                           SKILLS, STAGE_CLAIMS, TAUGHT_COSTS, _fmt, check_claim, check_metric, check_seed_record,
                           describe_effect,
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
    """``(model, tokenizer)`` of a shipped stage, the model in fp32 and eval mode. The stage files
    are checked as one set first (``stage_set.check_set``: a mixed or hand-replaced set is refused)."""
    from .checkpoint import load_checkpoint

    path = stage_path(name)
    if not path.is_file():
        raise FileNotFoundError(f"stage {name!r} is not shipped yet ({path.name} missing); available: "
                                f"{', '.join(available_stages()) or 'none'}. Rebuild it with "
                                f"`python -m minimind_ref.stages rebuild {name}`.")
    model = load_checkpoint(path, map_location=device)  # the file's own digests first: the most specific message
    check_set(path.parent)
    tokenizer = load_tokenizer()
    check_tokenizer_fits(model.config, tokenizer, path)
    return model, tokenizer


def stage_metadata(name: str) -> Dict[str, Any]:
    """What the shipped file records about how it was made (config, command, metrics).

    The file is verified first (then checked as a member of its stage set, ``stage_set.check_set``): read weights-only (a damaged or truncated file is a one-line
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
    check_set(path.parent)  # and the file is the one its set lists (stage_set)
    return extra


def save_stage(model: torch.nn.Module, name: str, extra: Dict[str, Any], folder: Optional[PathLike] = None,
               tokenizer: Any = None, lineage: Optional[Dict[str, Any]] = None) -> Path:
    """Write a stage checkpoint: fp16 weights (as upstream saves them) and ``extra``, plus the
    digest of those weights in ``extra`` (see ``stage_metadata``), to the shipped stage's file
    (or its file name in ``folder``), as a change of the folder's stage set (``stage_set.write_set``:
    the manifest records the file's digest and lineage, from ``extra``'s ``stage``, ``parent``,
    ``seed`` and ``float_path``). ``tokenizer``: also the set's tokenizer, in the same change (the
    ``base`` stage's). ``lineage``: more for the manifest's entry (``parent_sha256``, the digest of
    the parent file the stage was trained from, when it is not the parent in the same folder). A
    weight beyond float16's range is a ``ValueError`` naming it (it would become inf)."""
    path = stage_path(name) if folder is None else Path(os.path.expanduser(os.fspath(folder))) / stage_path(name).name
    writers: Dict[str, Callable[[str], Any]] = {path.name: lambda target: _write_stage_file(model, name, extra, target)}
    if tokenizer is not None:
        from .tokenizer import save_tokenizer

        writers[TOKENIZER_FILE.name] = lambda target: save_tokenizer(tokenizer, target)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_set_files(path.parent, writers, {path.name: {**stage_lineage(name, extra), **(lineage or {})},
                                           TOKENIZER_FILE.name: {"role": "the tokenizer every stage uses"}})
    return path


def stage_lineage(name: str, extra: Dict[str, Any]) -> Dict[str, Any]:
    """What the stage set's manifest records about a stage file: its stage, parent stage, seed and
    float path (from the figures ``extra`` it is saved with)."""
    where = extra.get("float_path")
    return {"stage": name, "parent": STAGE_INFO[name].parent, "seed": extra.get("seed"),
            "float_path": where.get("path") if isinstance(where, dict) else where}


def _write_stage_file(model: torch.nn.Module, name: str, extra: Dict[str, Any], path: PathLike) -> None:
    """``save_stage``'s file, written to ``path``."""
    import copy

    from .checkpoint import save_checkpoint

    for key, tensor in model.state_dict().items():  # fp16 holds magnitudes up to 65,504
        finite = tensor[torch.isfinite(tensor)] if tensor.is_floating_point() else None
        if finite is not None and finite.numel() and float(finite.abs().max()) > torch.finfo(torch.float16).max:
            raise ValueError(f"cannot save stage {name!r}: weight {key!r} holds values up to {float(finite.abs().max()):.4g}, "
                             "beyond float16's range (65,504), and stage files store fp16 weights (as upstream saves "
                             "them). Such weights are rare in a healthy run: check the run's loss; save_checkpoint keeps fp32.")
    half = copy.deepcopy(model).to("cpu").half()
    # the digest of the weights the figures in ``extra`` belong to (stage_metadata checks it)
    extra = {**extra, DIGEST_KEY: weights_digest(half.state_dict())}
    save_checkpoint(half, os.fspath(path), extra=extra)


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
    lineage = {"parent_sha256": file_sha256(stage_path(parent_name))} if parent_name else {}  # the package's parent
    model, extra, tokenizer, seconds = train_stage(name, parent, tokenizer, seed)
    reference = None
    if name == "sft":
        reference = reference_replies(model, tokenizer)
    elif stage_path("sft").is_file():
        reference = reference_replies(load_stage("sft")[0], tokenizer)
    extra = {**extra, "stage": name, "parent": parent_name, "seconds": round(seconds, 1),
             "evaluate_chat": evaluate_chat(model, tokenizer, reference), "torch": str(torch.__version__),
             "float_path": float_path()}
    # base ships with its tokenizer: the two change as one (stage_set)
    path = save_stage(model, name, extra, folder=folder, tokenizer=tokenizer if parent_name is None else None,
                      lineage=lineage)
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
    import tempfile
    import time
    from concurrent.futures import ThreadPoolExecutor

    from .files import check_writable, expand, write_text
    from .stage_set import read_manifest

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
        # the shipped files and, when it sits beside them, the record change as one set (stage_set.write_set)
        sources: Dict[str, str] = {}
        lineage: Dict[str, Dict[str, Any]] = {}
        if ship_seed is not None:
            source = os.path.join(work, f"ship-seed{ship_seed}-{paths[0]}")
            for name in SEEDED_STAGES:
                sources[STAGE_INFO[name].file] = os.path.join(source, STAGE_INFO[name].file)
                lineage[STAGE_INFO[name].file] = {"stage": name, "parent": STAGE_INFO[name].parent, "seed": ship_seed,
                                                  "float_path": paths[0]}
            if stage_path("base").is_file():  # every lineage's sft started from the package's base
                lineage[STAGE_INFO["sft"].file]["parent_sha256"] = file_sha256(stage_path("base"))
        text = json.dumps(record, indent=1, sort_keys=True) + "\n"
        ship_folder = os.path.realpath(expand(ship_dir)) if ship_seed is not None else None
        record_folder = os.path.realpath(os.path.dirname(os.path.abspath(out))) if out is not None else None
        record_in_set = out is not None and os.path.basename(out) == SEEDS_FILE.name and (
            record_folder == ship_folder or read_manifest(record_folder) is not None)
        if record_in_set:
            sources[SEEDS_FILE.name] = os.path.join(work, SEEDS_FILE.name)
            lineage[SEEDS_FILE.name] = {"role": "seed record", "ship": record["ship"]}
            with open(sources[SEEDS_FILE.name], "w", encoding="utf-8") as f:
                f.write(text)
        if ship_seed is not None:
            write_set(ship_dir, {k: v for k, v in sources.items() if k != SEEDS_FILE.name or record_folder == ship_folder},
                      lineage)
        if record_in_set and record_folder != ship_folder:
            write_set(record_folder, {SEEDS_FILE.name: sources[SEEDS_FILE.name]}, lineage)
        elif out is not None and not record_in_set:
            write_text(out, text)
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


def _one_seed(text: str) -> int:
    """``lineage --seed``: one whole number >= 0."""
    try:
        seed = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--seed takes a whole number >= 0, got {text!r}") from None
    if seed < 0:
        raise argparse.ArgumentTypeError(f"--seed takes a whole number >= 0, got {text!r}")
    return seed


def _rebuild_plan(args: argparse.Namespace) -> Dict[str, Any]:
    """What ``rebuild`` will do, or a ``ValueError`` for an argument that does not apply or a
    combination that would leave the package's record and stage files describing different runs."""
    if args.seeds is None:
        given = [flag for flag, value in (("--out", args.out), ("--paths", args.paths), ("--jobs", args.jobs),
                                          ("--no-ship", args.no_ship)) if value not in (None, False)]
        if given:
            raise ValueError(f"{', '.join(given)} applies only with --seeds (the seeded rebuild over seeds and float "
                             "paths); `rebuild [stage ...]` re-creates stages with seed 0 here, into --ship-dir or the "
                             "package's checkpoints.")
        unknown = [name for name in args.stages if name not in RECIPES]
        if unknown:
            raise ValueError(f"unknown stage {unknown[0]!r}; the stages are {', '.join(RECIPES)}.")
        if len(set(args.stages)) != len(args.stages):
            raise ValueError(f"each stage once, please: got {' '.join(args.stages)}.")
        names = args.stages or list(SEEDED_STAGES)
        return {"stages": sorted(names, key=STAGES.index)}  # parents before children
    if args.stages:
        raise ValueError(f"--seeds trains every post-training stage ({', '.join(SEEDED_STAGES)}) in every lineage and "
                         f"takes no stage names (got {' '.join(args.stages)}); drop the names, or drop --seeds to "
                         "rebuild only those stages.")
    package_record = args.out is None or os.path.realpath(os.path.expanduser(args.out)) == os.path.realpath(SEEDS_FILE)
    if args.no_ship and package_record:
        raise ValueError(f"--no-ship writes the record only: give --out (a file of your own), so the package's "
                         f"{SEEDS_FILE.name} keeps describing the package's stage files.")
    if args.no_ship and args.ship_dir:
        raise ValueError("--no-ship ships no stage file, so --ship-dir does not apply: drop one of them.")
    if not args.no_ship and args.out is not None and args.ship_dir is None and not package_record:
        raise ValueError("--out writes the record elsewhere, but the first seed's stage files would replace the "
                         "package's own: give --ship-dir (e.g. the folder of --out) or --no-ship.")
    if args.ship_dir is not None and args.out is None:
        raise ValueError(f"--ship-dir ships the stage files elsewhere, but the record would replace the package's "
                         f"{SEEDS_FILE.name}: give --out too (e.g. {os.path.join(args.ship_dir, SEEDS_FILE.name)}).")
    paths = [x.strip() for x in (args.paths if args.paths is not None else ",".join(FLOAT_PATHS)).split(",")]
    if any(not x for x in paths):
        raise ValueError(f"--paths takes comma-separated float paths, e.g. native,default; got {args.paths!r}.")
    _check_seeds_and_paths(args.seeds, paths)
    jobs = 1 if args.jobs is None else args.jobs
    if jobs < 1:
        raise ValueError(f"--jobs must be >= 1 (lineages run at a time), got {jobs}.")
    return {"paths": paths, "jobs": jobs}


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
    reb.add_argument("--paths", default=None,
                     help=f"with --seeds: comma-separated float paths (default {','.join(FLOAT_PATHS)}; also "
                          f"{', '.join(p for p in KNOWN_PATHS if p not in FLOAT_PATHS)}); each runs in its own process "
                          f"with {CAPABILITY_ENV} set (native: unset)")
    reb.add_argument("--jobs", type=int, default=None, help="with --seeds: lineages run at a time, one thread each "
                                                            "(default 1)")
    reb.add_argument("--out", default=None, help=f"with --seeds: the record to write (default: {SEEDS_FILE.name} beside "
                                                  "the checkpoints; with --out give --ship-dir or --no-ship too, so the "
                                                  "package's record keeps describing the package's stage files)")
    reb.add_argument("--ship-dir", default=None, help="where the rebuilt stage files go (default: the package's "
                                                      "checkpoints folder; with --seeds, give --out too)")
    reb.add_argument("--no-ship", action="store_true", help="with --seeds and --out: write the record only, no stage file")
    cla = sub.add_parser("claims", help="check every claim the chapters make (STAGE_CLAIMS) and that no later stage "
                                        "destroyed a skill, against a seed record; exit status 1 if one fails")
    cla.add_argument("--seeds-file", default=None, help=f"the seed record (default {SEEDS_FILE.name} beside the "
                                                        "checkpoints; e.g. the --out of your own rebuild)")
    lin = sub.add_parser("lineage", help="one lineage on this process's float path (what rebuild --seeds runs per "
                                         "seed and path): JSON result")
    lin.add_argument("--seed", type=_one_seed, required=True)
    lin.add_argument("--result", required=True, help="the JSON file to write the lineage's figures to")
    lin.add_argument("--save-dir", default=None, help="also save the lineage's four models there as stage files")
    args = p.parse_args(argv)
    if args.command == "rebuild":
        try:  # a usage line, not a traceback, for any argument that does not apply (nothing has run yet)
            plan = _rebuild_plan(args)
        except ValueError as error:
            p.error(str(error))
        if args.seeds is not None:
            rebuild_seeds(args.seeds, plan["paths"], plan["jobs"], ship_seed=None if args.no_ship else args.seeds[0],
                          out=args.out or SEEDS_FILE, ship_dir=args.ship_dir or CHECKPOINT_DIR)
        else:
            for name in plan["stages"]:
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

        if args.recorded and args.evaluate:
            p.error("--recorded and --evaluate are two different reports (the figures each stage file recorded, or "
                    "a fresh evaluation here): choose one.")
        if (args.recorded or args.evaluate) and (args.figure or args.seeds_file):
            p.error(f"{'--figure' if args.figure else '--seeds-file'} belongs to the report from the seed record; "
                    f"{'--recorded' if args.recorded else '--evaluate'} makes one row per shipped stage without it. "
                    "Drop one of them.")

        for path, what in ((args.out, "--out (the report's table)"), (args.figure, "--figure (the report's PNG)")):
            if path:  # before any evaluation: a folder or an unwritable place fails now, not after minutes
                check_writable(path, what)
        with torch.inference_mode(False):
            if args.recorded or args.evaluate:
                table = render_markdown(recorded_rows() if args.recorded else stage_rows())
            else:
                try:  # a record that fails the schema check: one usage line naming the file, stage and metric
                    records = load_seed_records(Path(args.seeds_file) if args.seeds_file else None)
                except (FileNotFoundError, ValueError) as error:
                    p.error(str(error))
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
