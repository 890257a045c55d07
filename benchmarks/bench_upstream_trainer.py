"""The course's trainer beside upstream's own ``trainer/train_pretrain.py``, on this CPU, in one run.

    # a checkout of upstream at each pinned commit, made by you, outside this repository:
    git clone https://github.com/jingyaogong/minimind ~/minimind
    git -C ~/minimind worktree add ~/minimind-c090b69 c090b69
    git -C ~/minimind worktree add ~/minimind-d65ef2c d65ef2c
    # upstream's trainer imports transformers and Hugging Face datasets (its requirements.txt pins
    # datasets==3.6.0); an environment that has them, e.g. the course's .venv plus datasets:
    python -m venv .venv-upstream && echo "$(.venv/bin/python -c 'import site; print(site.getsitepackages()[0])')" \
        > "$(.venv-upstream/bin/python -c 'import site; print(site.getsitepackages()[0])')/course.pth"
    .venv-upstream/bin/pip install datasets==3.6.0 torch==2.13.0 transformers==4.57.6
    nice python -m benchmarks.bench_upstream_trainer bench --upstream-dir ~/minimind-c090b69 \
        --upstream-dir ~/minimind-d65ef2c --upstream-python .venv-upstream/bin/python
    python -m benchmarks.bench_upstream_trainer report    # the table and the figure from the record

Nothing of upstream is copied into this repository: the benchmark runs the files of the checkout it
is given, and refuses a checkout whose trainer, model, dataset or tokenizer file differs from the
pinned commit's (``UPSTREAM_FILES``: their SHA-256 at c090b69 and d65ef2c).

**What runs.** Each run is a fresh process with ``torch.set_num_threads(threads)`` (and
``OMP_NUM_THREADS``) that trains from scratch for ``steps`` optimizer steps of batch 8 x 340 tokens,
accumulation 1, on the same synthetic file in upstream's format (``synthetic_jsonl``: documents of
the course's generated corpus, joined into texts of varied length, one ``{"text": ...}`` a line),
tokenized by upstream's own tokenizer (the checkout's ``model/tokenizer.json``):

* ``upstream``: ``python trainer/train_pretrain.py`` of the checkout, executed as its ``__main__``
  (``runpy``) with its own argument parser: ``--batch_size 8 --max_seq_len 340
  --accumulation_steps 1 --num_workers 0 --device cpu`` and the model's width and depth. On a CPU
  upstream never autocasts (``c090b69:trainer/train_pretrain.py:112 "nullcontext() if device_type =="``), so it trains in fp32. Its
  ``PretrainDataset`` pads or cuts every document to 340 tokens, one a row.
* ``course_fp32``, ``course_bf16``, ``course_bf16_compiled``: ``minimind_ref.train.train`` with the
  matching recipe (``pretrain_minimind2_small`` / ``pretrain_minimind3``), batch 8, accumulation 1,
  the same tokenizer file, the data through the token cache (filled before the timed runs), in fp32,
  with bf16 autocast, and with bf16 autocast under ``torch.compile``. The course packs the token
  stream into windows: no position is padding.

Both trainers run their own learning-rate schedules over the same length (upstream's epoch of the
file; the course's ``max_steps`` set to the same number of steps), and stop after ``steps``.

**What is measured, the same way for both.** A hook on every optimizer's step
(``torch.optim.optimizer.register_optimizer_step_post_hook``) stamps the time at the end of each
step, so a step's time is everything between two updates: reading and tokenizing the batch,
forward, backward, clipping, the update, the loop's bookkeeping. A wrapper around the model class's
``forward`` (upstream's ``MiniMindForCausalLM`` from the checkout; the course's records its loss in
``history``) records each training step's loss and its non-padding tokens (upstream: labels that
are not -100, exactly the positions its dataset did not pad; the course: every position). The first
``warmup`` steps of every run are not timed. Per run: the median step time, and the useful tokens
per second: the mean non-padding tokens of its timed steps over that median step time (the median,
not the total time, so that a step another job on the shared machine slowed down does not decide
the rate). The variants run in ``rounds`` rounds; within a round their processes step in turns,
one step each, in an order that rotates every step, so no two compute at once and a slow spell of
the machine hits them alike; every figure is the median over the rounds with its range, and every
ratio the median of the per-round ratios. The machine is shared with other jobs, which slow some
steps down; the table also gives each variant's fastest step over all rounds (the least disturbed
one) and its ratio to upstream's fastest, a second estimate that load inflates less. Upstream's run repeats the same seed (42, its own) each round;
the course's round r uses seed r.

**Loss at equal data.** The loss after the same number of useful tokens: ``U`` is what upstream's
run has trained on after its last step; each run's loss there is the mean of its per-step losses
over the steps that end in the last fifth of ``U`` (a short mean, so one batch's noise does not
decide). bf16 against fp32: for each seed the course's two runs start from the same weights and see
the same batches; their mean loss over the last ten steps differs by ``d``; the seed noise is the
range of the fp32 runs' own mean over those steps across seeds. The curves match when every
``|d|`` is below that range.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
RECORD = RESULTS / "upstream_trainer.json"
TABLE = RESULTS / "upstream_trainer_table.md"
FIGURE = RESULTS / "figures" / "upstream_trainer.png"
#: The records the Performance page shows, each with its table and figure: MiniMind2-Small's size at
#: both commits (``RECORD``), and minimind-3 at its own width at d65ef2c (``--d65ef2c-hidden 768``).
RECORD_MINIMIND3 = RESULTS / "upstream_trainer_minimind3.json"
PAGE_FILES = {RECORD: (TABLE, FIGURE),
              RECORD_MINIMIND3: (RESULTS / "upstream_trainer_minimind3_table.md",
                                 RESULTS / "figures" / "upstream_trainer_minimind3.png")}

BATCH, SEQ_LEN = 8, 340

#: SHA-256 of the files the benchmark runs, at each pinned commit (``git show COMMIT:PATH | sha256sum``
#: on a clone of jingyaogong/minimind): a checkout is identified by them and refused if one differs.
UPSTREAM_FILES: Dict[str, Dict[str, str]] = {
    "c090b69": {
        "trainer/train_pretrain.py": "91d433c4883797491bdbccebabd94afcdac510031d31455d8e51f1634dbd800c",
        "trainer/trainer_utils.py": "3f69b8b56ecb798de761183aabbc01406b548e577d51a41edf95a3632d7603ac",
        "model/model_minimind.py": "fbb18f334bc94154f9d648f2dce5a25846356e4030414c0caef481d469d32b5a",
        "dataset/lm_dataset.py": "145b3b770f9ad561538bd97e9afd7f682d281b4bca7c554497024fa7aea22b89",
        "model/tokenizer.json": "d98595c6aef70d95f72748582fb9b4f53d76dd58c1ae1dd702ad7c84e1caf5e4",
    },
    "d65ef2c": {
        "trainer/train_pretrain.py": "0c630aa6b5dce11a35f9176ff8337930a72a79bffee0a9282a4378b8005955f8",
        "trainer/trainer_utils.py": "c613d485c8861caccc9d920e4639a8053cdfb4d69e56fa33280a631a5530234b",
        "model/model_minimind.py": "47f124f5f386a8cd76b488b36ecc3e00fc43e3894cdb3ba602420188d9ba8860",
        "dataset/lm_dataset.py": "e6dd56b5745015ddc1579932c292ec7a5e1cc33796a5eadf4911065d92f1c6b8",
        "model/tokenizer.json": "71f32c68cf63a15355a8fc171b7594b3d41870fe0ddb54fc6aefa55f73a4a668",
    },
}

#: Per commit: the model both trainers build (upstream's --hidden_size / --num_hidden_layers, the
#: course's recipe with the same width and depth) and a name for the page. Both at MiniMind2-Small's
#: width and depth (512 x 8), so the two commits' rows compare the same size; minimind-3's default
#: width, 768, costs 2.5 times the time a step on this CPU (``--d65ef2c-hidden 768`` measures it).
MODELS: Dict[str, Dict[str, Any]] = {
    "c090b69": {"name": "MiniMind2-Small", "recipe": "pretrain_minimind2_small", "hidden_size": 512, "num_hidden_layers": 8},
    "d65ef2c": {"name": "minimind-3 at MiniMind2-Small's size", "recipe": "pretrain_minimind3", "hidden_size": 512,
                "num_hidden_layers": 8},
}

#: The variants of a commit's comparison, in the order of the first round.
VARIANTS = ("upstream", "course_fp32", "course_bf16", "course_bf16_compiled")
LABELS = {"upstream": "upstream, fp32", "course_fp32": "course, fp32", "course_bf16": "course, bf16 autocast",
          "course_bf16_compiled": "course, bf16 autocast, compiled"}


# ---------------------------------------------------------------------- the machine
def cpu_flags() -> List[str]:
    """The CPU's flags that say it computes bf16 natively (``/proc/cpuinfo``: AVX512-BF16, AMX)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return []
    return sorted(set(flags) & {"avx512_bf16", "amx_bf16", "amx_tile", "avx512f", "avx2"})


def native_bf16(flags: Sequence[str]) -> bool:
    """Whether the CPU runs bf16 natively: AVX512-BF16 or AMX (the rule for choosing the course's precision)."""
    return "avx512_bf16" in flags or "amx_bf16" in flags


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def identify_checkout(folder: Path) -> str:
    """The pinned commit a checkout of upstream is at, from the SHA-256 of the files the benchmark
    runs; ``ValueError`` naming the files that differ when it matches neither."""
    folder = Path(folder).expanduser()
    if not (folder / "trainer" / "train_pretrain.py").is_file():
        raise ValueError(f"{folder} is not a checkout of jingyaogong/minimind (no trainer/train_pretrain.py); make one "
                         "with: git clone https://github.com/jingyaogong/minimind && git -C minimind checkout c090b69")
    differing = {}
    for commit, files in UPSTREAM_FILES.items():
        bad = [p for p, digest in files.items() if not (folder / p).is_file() or _sha256(folder / p) != digest]
        if not bad:
            return commit
        differing[commit] = bad
    raise ValueError(f"{folder} is at neither pinned commit: its files differ from c090b69's ({', '.join(differing['c090b69'])}) "
                     f"and from d65ef2c's ({', '.join(differing['d65ef2c'])}); check out c090b69 or d65ef2c "
                     "(git -C FOLDER checkout c090b69) and leave its files unedited.")


# ---------------------------------------------------------------------- the data
def synthetic_jsonl(path: Path, n_docs: int = 4000, seed: int = 0, max_parts: int = 6) -> List[str]:
    """Upstream's pretraining format (one ``{"text": ...}`` a line, as ``pretrain_hq.jsonl``), from the
    course's generated corpus (``minimind_ref.data.make_corpus``): each text joins 1 to ``max_parts``
    generated documents, so some fit a 340-token row with padding and some are cut. Returns the texts."""
    from minimind_ref import data as D

    pool = D.make_corpus(2000, seed=seed)
    rng = random.Random(seed)
    texts = [" ".join(rng.choice(pool) for _ in range(rng.randint(1, max_parts))) for _ in range(n_docs)]
    with open(path, "w", encoding="utf-8") as f:
        for t in texts:
            f.write(json.dumps({"text": t}, ensure_ascii=False) + "\n")
    return texts


def row_statistics(texts: Sequence[str], tokenizer_json: Path, commit: str) -> Dict[str, float]:
    """How upstream's ``PretrainDataset`` fills its rows with these texts: c090b69 tokenizes the text as
    it is (its tokenizer adds no special token), d65ef2c frames it ``[bos] ... [eos]``
    (``d65ef2c:dataset/lm_dataset.py:47-49``); each row is cut or padded to 340. The mean tokens of a
    text, the share of row positions that are padding, the share of the text's tokens cut away."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_json))
    extra = 2 if commit == "d65ef2c" else 0
    lengths = [len(e.ids) + extra for e in tok.encode_batch(list(texts), add_special_tokens=False)]
    kept = [min(n, SEQ_LEN) for n in lengths]
    return {"texts": len(lengths), "mean_tokens": statistics.mean(lengths),
            "padding_share": 1 - sum(kept) / (SEQ_LEN * len(lengths)),
            "cut_share": 1 - sum(kept) / sum(lengths)}


# ---------------------------------------------------------------------- one run, in its own process
class _Stop(Exception):
    """Raised by upstream's step hook after the last measured step: ends its trainer's loop."""


class _Turns:
    """A run's side of the turn-taking: the coordinator lets one run at a time compute a step.

    At a gate the run writes one byte to ``done`` (it is idle) and blocks until it reads one from
    ``go`` (its turn). Every step of every run starts at a gate and ends at the next one, so a step is
    timed from the moment its run got the turn to the end of its optimizer step (the stamps around the
    gate), with no other run of the benchmark computing meanwhile."""

    def __init__(self, go_fd: int, done_fd: int):
        self.go_fd, self.done_fd = go_fd, done_fd

    def wait(self) -> float:
        os.write(self.done_fd, b"d")
        if os.read(self.go_fd, 1) != b"g":
            raise SystemExit("the benchmark's coordinator went away")
        return time.perf_counter()


class _Recorder:
    """A run's measurements: each step's seconds (from its turn to the end of its update), loss and
    non-padding tokens. ``first_gate`` is called before the first step's work; ``step_hook`` is
    registered as a global optimizer step post-hook."""

    def __init__(self, steps: int, turns: _Turns, stop: bool):
        self.steps, self.turns, self.stop = steps, turns, stop
        self.starts: List[float] = []
        self.ends: List[float] = []
        self.cpu: List[float] = []
        self.losses: List[float] = []
        self.useful: List[int] = []

    def first_gate(self) -> None:
        if not self.starts:
            self.starts.append(self.turns.wait())
            self.cpu.append(time.process_time())

    def forward(self, labels: Any, loss: Any) -> None:
        self.losses.append(float(loss.detach()))
        self.useful.append(int((labels != -100).sum()))

    def step_hook(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.ends.append(time.perf_counter())
        self.cpu.append(time.process_time())
        start = self.turns.wait()  # after the last step too: the run ends on its turn
        if len(self.ends) >= self.steps:
            if self.stop:
                raise _Stop()
        else:
            self.starts.append(start)
            self.cpu.append(time.process_time())

    def result(self) -> Dict[str, Any]:
        n = len(self.ends)
        return {"step_s": [b - a for a, b in zip(self.starts, self.ends)], "loss": self.losses[:n],
                "useful_tokens": self.useful[:n], "cpu_s": [b - a for a, b in zip(self.cpu[0::2], self.cpu[1::2])]}


def _run_upstream(spec: Mapping[str, Any], turns: _Turns) -> Dict[str, Any]:
    """Upstream's ``trainer/train_pretrain.py`` as its ``__main__``, in a scratch folder laid out as the
    checkout (``trainer/`` the working directory, ``../model`` its tokenizer, ``../out`` and
    ``../checkpoints`` what it would save), with the recorder's hooks."""
    import runpy

    import torch  # noqa: F401
    from torch.optim.optimizer import register_optimizer_step_post_hook

    checkout, work = Path(spec["upstream_dir"]).resolve(), Path(spec["work"])
    (work / "trainer").mkdir(parents=True)
    os.symlink(checkout / "model", work / "model")
    os.chdir(work / "trainer")
    sys.path.insert(0, str(checkout))
    rec = _Recorder(spec["steps"], turns, stop=True)
    import model.model_minimind as upstream_model  # the checkout's, as the trainer imports it

    cls = upstream_model.MiniMindForCausalLM
    original = cls.forward
    params: Dict[str, int] = {}

    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        training = self.training and kwargs.get("labels") is not None
        if training:
            rec.first_gate()
        out = original(self, *args, **kwargs)
        if training:
            rec.forward(kwargs["labels"], out.loss)
            params.setdefault("n", sum(p.numel() for p in self.parameters()))
        return out

    cls.forward = forward
    register_optimizer_step_post_hook(rec.step_hook)
    m = spec["model"]
    sys.argv = ["train_pretrain.py", "--data_path", spec["data"], "--batch_size", str(BATCH), "--max_seq_len", str(SEQ_LEN),
                "--accumulation_steps", "1", "--num_workers", "0", "--device", "cpu", "--epochs", "1",
                "--hidden_size", str(m["hidden_size"]), "--num_hidden_layers", str(m["num_hidden_layers"]),
                "--log_interval", "1000000", "--save_interval", "1000000"]
    try:
        runpy.run_path(str(checkout / "trainer" / "train_pretrain.py"), run_name="__main__")
    except _Stop:
        pass
    return {**rec.result(), "parameters": params.get("n")}


def _run_course(spec: Mapping[str, Any], turns: _Turns) -> Dict[str, Any]:
    """``minimind_ref.train.train`` with the commit's recipe, batch 8, accumulation 1, the run's precision."""
    from torch.optim.optimizer import register_optimizer_step_post_hook

    from minimind_ref import train as train_mod

    rec = _Recorder(spec["steps"], turns, stop=False)
    register_optimizer_step_post_hook(rec.step_hook)
    micro_batches = train_mod._micro_batches

    def gated(*args: Any, **kwargs: Any) -> Any:  # the first step waits for its turn before reading its batch
        rec.first_gate()
        return micro_batches(*args, **kwargs)

    train_mod._micro_batches = gated
    recipe = train_mod.TrainConfig.from_json(spec["recipe"])
    size = {k: spec["model"][k] for k in ("hidden_size", "num_hidden_layers")}
    cfg = recipe.replace(
        model={**recipe.model, **size}, data=spec["data"], tokenizer=spec["tokenizer"], data_cache=spec["cache"], data_workers=1, batch_size=BATCH,
        accumulation_steps=1, epochs=None, max_steps=spec["schedule_steps"], seq_len=SEQ_LEN, dtype=spec["dtype"],
        compile=spec["compile"], seed=spec["seed"], device="cpu", out_dir=None, resume=None, progress=False,
        log_every=0, eval_every=0, save_every=0)
    result = train_mod.train(cfg, stop_at=spec["steps"], log=lambda line: None)
    out = rec.result()
    out["loss"] = result.history["loss"]
    out["useful_tokens"] = [BATCH * SEQ_LEN] * len(out["loss"])  # packed windows: every position holds a token of the text
    out["parameters"] = sum(p.numel() for p in result.model.parameters())
    return out


def run_one(spec_path: str, out_path: str) -> None:
    """The hidden ``_one`` command: one run described by a JSON spec (with the file descriptors of its
    turns), its result written as JSON."""
    import torch

    spec = json.loads(Path(spec_path).read_text())
    torch.set_num_threads(spec["threads"])
    turns = _Turns(spec["go_fd"], spec["done_fd"])
    result = _run_upstream(spec, turns) if spec["variant"] == "upstream" else _run_course(spec, turns)
    result["threads"] = torch.get_num_threads()
    Path(out_path).write_text(json.dumps(result))


# ---------------------------------------------------------------------- the interleaved runs
def _environment(threads: int, upstream_python: str) -> Dict[str, Any]:
    import platform

    import torch

    from minimind_ref.utils import device_name

    torch.set_num_threads(threads)
    flags = cpu_flags()
    versions = {}
    for name in ("transformers", "datasets", "tokenizers", "numpy"):
        code = f"import {name}; print({name}.__version__)"
        proc = subprocess.run([upstream_python, "-c", code], capture_output=True, text=True)
        versions[name] = proc.stdout.strip() or None
    return {"device_name": device_name("cpu"), "cpu_count": os.cpu_count(), "threads": threads, "cpu_flags": flags,
            "native_bf16": native_bf16(flags), "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "python": platform.python_version(), "torch": torch.__version__, "upstream_env": versions,
            "load_average_at_start": list(os.getloadavg())}


def _rotation(variants: Sequence[str], r: int) -> List[str]:
    shift = r % len(variants)
    return list(variants[shift:]) + list(variants[:shift])


def _spec(variant: str, commit: str, checkout: Path, data: Path, tmp: Path, steps: int, threads: int, seed: int,
          schedule_steps: int, model: Mapping[str, Any]) -> Dict[str, Any]:
    spec = {"variant": variant, "commit": commit, "steps": steps, "threads": threads, "data": str(data), "model": model,
            "upstream_dir": str(checkout), "work": str(tmp / f"work_{commit}_{variant}_{seed}")}
    if variant != "upstream":
        spec.update(recipe=model["recipe"], tokenizer=str(checkout / "model" / "tokenizer.json"), cache=str(tmp / "cache"),
                    schedule_steps=schedule_steps, seed=seed, dtype="float32" if variant == "course_fp32" else "bfloat16",
                    compile=variant.endswith("_compiled"))
    return spec


class _Child:
    """One run's process and the two pipes of its turns."""

    def __init__(self, spec: Dict[str, Any], python: str, tmp: Path, threads: int):
        self.spec, self.name = spec, spec["variant"]
        go_r, self.go_w = os.pipe()
        self.done_r, done_w = os.pipe()
        spec.update(go_fd=go_r, done_fd=done_w)
        self.spec_path, self.out_path = tmp / f"spec_{self.name}.json", tmp / f"out_{self.name}.json"
        self.spec_path.write_text(json.dumps(spec))
        self.out_path.unlink(missing_ok=True)
        self.log = open(tmp / f"log_{self.name}.txt", "w+")
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), "PYTHONPATH": str(ROOT),
               "TOKENIZERS_PARALLELISM": "false", "HF_HOME": str(tmp / "hf"), "HF_DATASETS_OFFLINE": "1",
               "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore"}
        self.proc = subprocess.Popen([python, "-m", "benchmarks.bench_upstream_trainer", "_one", str(self.spec_path),
                                      str(self.out_path)], cwd=ROOT, env=env, pass_fds=(go_r, done_w),
                                     stdout=self.log, stderr=subprocess.STDOUT)
        os.close(go_r)
        os.close(done_w)

    def idle(self) -> None:
        """Wait until the run sits at a gate (its step, or its start-up, is over)."""
        if os.read(self.done_r, 1) != b"d":
            self.proc.wait()
            self.log.seek(0)
            raise RuntimeError(f"the {self.name} run of {self.spec['commit']} stopped ({self.proc.returncode}):\n"
                               + self.log.read()[-4000:])

    def go(self) -> None:
        os.write(self.go_w, b"g")

    def finish(self) -> Dict[str, Any]:
        self.go()
        self.proc.wait()
        self.log.seek(0)
        text = self.log.read()
        self.log.close()
        os.close(self.go_w)
        os.close(self.done_r)
        if self.proc.returncode != 0 or not self.out_path.exists():
            raise RuntimeError(f"the {self.name} run of {self.spec['commit']} failed ({self.proc.returncode}):\n{text[-4000:]}")
        return json.loads(self.out_path.read_text())


def run_round(specs: Sequence[Dict[str, Any]], pythons: Mapping[str, str], tmp: Path, threads: int, steps: int,
              first: int = 0) -> Dict[str, Dict[str, Any]]:
    """One round: every variant's process starts (their set-ups overlap), then they take turns, one step
    each, in an order that rotates every step (starting at ``first``), so the runs' steps alternate."""
    children = [_Child(spec, pythons[spec["variant"]], tmp, threads) for spec in specs]
    try:
        for child in children:
            child.idle()  # set up, waiting at its first gate
        for step in range(steps):
            for child in _rotation(children, first + step):
                child.go()
                child.idle()
        return {child.name: child.finish() for child in children}
    finally:
        for child in children:
            if child.proc.poll() is None:
                child.proc.kill()


def bench(checkouts: Sequence[Path], upstream_python: str, steps: int = 30, rounds: int = 3, warmup: int = 3,
          threads: int = 2, variants: Sequence[str] = VARIANTS, n_docs: int = 4000, out: Path = RECORD,
          log=print, d65ef2c_hidden: int = 512) -> Dict[str, Any]:
    """Every variant of every checkout's commit, ``rounds`` times (the course's seed is the round), the
    runs of a round stepping in turns; the record is written after every round."""
    from minimind_ref.tokenizer import load_tokenizer
    from minimind_ref.token_cache import prepare_token_cache

    if steps <= warmup + 1:
        raise ValueError(f"steps={steps} leaves nothing to time after warmup={warmup}")
    commits = {identify_checkout(Path(c)): Path(c).expanduser().resolve() for c in checkouts}
    record: Dict[str, Any] = {
        "date": datetime.date.today().isoformat(), "environment": _environment(threads, upstream_python),
        "settings": {"batch": BATCH, "seq_len": SEQ_LEN, "steps": steps, "warmup": warmup, "rounds": rounds,
                     "threads": threads, "accumulation_steps": 1, "n_docs": n_docs, "variants": list(variants),
                     "interleaving": "the runs of a round step in turns, one step each, the order rotating every step"},
        "commits": {}}
    pythons = {v: (upstream_python if v == "upstream" else sys.executable) for v in variants}
    with tempfile.TemporaryDirectory(prefix="minimind_bench_upstream_") as tmp_name:
        tmp = Path(tmp_name)
        data = tmp / "pretrain_synthetic.jsonl"
        texts = synthetic_jsonl(data, n_docs)
        schedule_steps = -(-n_docs // BATCH)  # upstream's len(loader): one epoch of the file
        for commit, checkout in commits.items():
            tokenizer = checkout / "model" / "tokenizer.json"
            prepare_token_cache(str(data), load_tokenizer(str(tokenizer)), str(tmp / "cache"), workers=1)
            model = dict(MODELS[commit])
            if commit == "d65ef2c" and d65ef2c_hidden != model["hidden_size"]:
                model.update(hidden_size=d65ef2c_hidden, name="minimind-3")
            entry = record["commits"][commit] = {
                "model": model, "upstream_files": UPSTREAM_FILES[commit],
                "rows": row_statistics(texts, tokenizer, commit), "schedule_steps": schedule_steps,
                "runs": {v: [] for v in variants}}
            for r in range(rounds):
                specs = [_spec(v, commit, checkout, data, tmp, steps, threads, r, schedule_steps, model) for v in variants]
                tic = time.perf_counter()
                got = run_round(specs, pythons, tmp, threads, steps, first=r)
                for spec in specs:
                    shutil.rmtree(spec["work"], ignore_errors=True)
                for v in variants:
                    run = {**got[v], "round": r, "seed": 42 if v == "upstream" else r}
                    entry["runs"][v].append(run)
                    s = summarize_run(run, warmup)
                    log(f"{commit} round {r} {v}: {s['step_s']:.2f} s/step, {s['tokens_per_s']:,.0f} useful tok/s, "
                        f"last loss {run['loss'][-1]:.3f}")
                entry.setdefault("load_average_after_rounds", []).append(list(os.getloadavg()))
                log(f"{commit} round {r}: {time.perf_counter() - tic:.0f} s, load average {os.getloadavg()[0]:.2f}")
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_text(json.dumps(record, indent=1) + "\n")  # a partial record survives an interruption
    return record


# ---------------------------------------------------------------------- the summary
def summarize_run(run: Mapping[str, Any], warmup: int) -> Dict[str, float]:
    """A run's median step time over its timed steps (after ``warmup``) and its useful tokens per second,
    the mean useful tokens of those steps over the median step time; ``step_s[i]`` is the time of step
    ``i``, which trained on ``useful_tokens[i]``."""
    times = run["step_s"][warmup:]
    tokens = run["useful_tokens"][warmup: warmup + len(times)]
    median = statistics.median(times)
    return {"step_s": median, "tokens_per_s": statistics.mean(tokens) / median, "fastest_step_s": min(times)}


def _stats(values: Sequence[float]) -> Dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def loss_at_tokens(run: Mapping[str, Any], tokens: float) -> float:
    """Mean loss of the steps whose cumulative useful tokens end in ``(0.8 tokens, tokens]`` (in a run too
    short to have one there, the last step that ends before ``tokens``)."""
    total, picked, before = 0, [], []
    for loss, n in zip(run["loss"], run["useful_tokens"]):
        total += n
        if 0.8 * tokens < total <= tokens:
            picked.append(loss)
        elif total <= tokens:
            before = [loss]
    if not picked and not before:
        raise ValueError(f"the run's first step already trained on more than {tokens:,.0f} useful tokens")
    return statistics.mean(picked or before)


def summarize_commit(entry: Mapping[str, Any], warmup: int, last: int = 10) -> Dict[str, Any]:
    """Per variant: step time, useful tokens/s, loss at upstream's tokens (median and range over the
    rounds), the speed-ups over upstream (median and range of the per-round ratios); bf16 against fp32."""
    runs = entry["runs"]
    per_run = {v: [summarize_run(r, warmup) for r in rs] for v, rs in runs.items() if rs}
    up = runs["upstream"][0]
    budget = sum(up["useful_tokens"])
    out: Dict[str, Any] = {"useful_tokens": budget, "variants": {}}
    for v, rs in per_run.items():
        row = {"step_s": _stats([r["step_s"] for r in rs]), "tokens_per_s": _stats([r["tokens_per_s"] for r in rs]),
               "fastest_step_s": min(r["fastest_step_s"] for r in rs),
               "loss_at_upstream_tokens": _stats([loss_at_tokens(r, budget) for r in runs[v]]), "runs": len(rs)}
        if v != "upstream":
            rounds = {run["round"]: s for run, s in zip(runs[v], rs)}
            ups = {run["round"]: s for run, s in zip(runs["upstream"], per_run["upstream"])}
            both = sorted(set(rounds) & set(ups))
            row["step_speedup"] = _stats([ups[r]["step_s"] / rounds[r]["step_s"] for r in both])
            row["tokens_speedup"] = _stats([rounds[r]["tokens_per_s"] / ups[r]["tokens_per_s"] for r in both])
        out["variants"][v] = row
    for v, row in out["variants"].items():  # the least disturbed step of all rounds, against upstream's
        row["fastest_step_speedup"] = out["variants"]["upstream"]["fastest_step_s"] / row["fastest_step_s"]
        out["variants"][v] = row
    bf16 = [v for v in ("course_bf16", "course_bf16_compiled") if v in per_run]
    chosen = min(bf16, key=lambda v: out["variants"][v]["step_s"]["median"]) if bf16 else None
    out["chosen"] = chosen
    if "course_fp32" in runs and bf16:
        fp32 = {r["seed"]: statistics.mean(r["loss"][-last:]) for r in runs["course_fp32"]}
        noise = max(fp32.values()) - min(fp32.values()) if len(fp32) > 1 else None
        match = {}
        for v in bf16:
            diffs = [statistics.mean(r["loss"][-last:]) - fp32[r["seed"]] for r in runs[v] if r["seed"] in fp32]
            match[v] = {"diffs": diffs, "max_abs": max(abs(d) for d in diffs),
                        "within_noise": noise is not None and max(abs(d) for d in diffs) < noise}
        out["bf16_vs_fp32"] = {"last_steps": last, "seed_noise": noise, "seeds": sorted(fp32), "variants": match}
    if chosen:
        row = out["variants"][chosen]
        out["goals"] = {"tokens_speedup_2x": row["tokens_speedup"]["median"] >= 2.0,
                        "step_speedup_1_4x": row["step_speedup"]["median"] >= 1.4,
                        "loss_matched": out.get("bf16_vs_fp32", {}).get("variants", {}).get(chosen, {}).get("within_noise")}
    return out


# ---------------------------------------------------------------------- the page: table and figure
def _fmt_range(stats: Mapping[str, float], fmt: str, suffix: str = "") -> str:
    return f"{stats['median']:{fmt}}{suffix} ({stats['min']:{fmt}}–{stats['max']:{fmt}})"


def render(record: Optional[Mapping[str, Any]]) -> str:
    """The Performance page's section: per commit, a table of every variant, the goals, bf16 against fp32."""
    if not record:
        return ("No comparison with upstream's trainer has been recorded yet: run `python -m "
                "benchmarks.bench_upstream_trainer bench --upstream-dir ...` (see its docstring).\n")
    env, st = record["environment"], record["settings"]
    flags = ", ".join(env["cpu_flags"]) or "none of AVX2, AVX-512, AVX512-BF16, AMX"
    up = env.get("upstream_env", {})
    lines = [f"Measured on {record['date']}: **{env['device_name']}** ({env['cpu_count']} cores; flags: {flags}; "
             f"native bf16: {'yes' if env['native_bf16'] else 'no'}), torch {env['torch']} "
             f"(CPU kernels: {env['torch_cpu_capability']}), {env['threads']} threads for every run; upstream's trainer "
             f"with transformers {up.get('transformers')} and datasets {up.get('datasets')}. Batch {st['batch']} x "
             f"{st['seq_len']} tokens, accumulation {st['accumulation_steps']}, {st['steps']} steps a run, the first "
             f"{st['warmup']} not timed, {st['rounds']} rounds interleaved; medians over the rounds (range in parentheses), "
             "ratios the medians of the per-round ratios; the fastest step is a variant's least disturbed timed step "
             "over all rounds."
             + (f" The machine is shared: load average {env['load_average_at_start'][0]:.2f} at the start"
                if env.get("load_average_at_start") else "")
             + (", after each round " + ", ".join(f"{la[0]:.2f}" for e in record["commits"].values()
                                                  for la in e.get("load_average_after_rounds", [])) + "."
                if env.get("load_average_at_start") else "")]
    for commit, entry in record["commits"].items():
        s = summarize_commit(entry, st["warmup"])
        m, rows = entry["model"], entry["rows"]
        params = entry["runs"]["upstream"][0].get("parameters")
        lines += ["", f"### Upstream {commit}: {m['name']} ({m['hidden_size']} x {m['num_hidden_layers']}"
                  + (f", {params:,} parameters" if params else "") + ")", "",
                  f"The synthetic file: {rows['texts']:,} texts of {rows['mean_tokens']:.0f} tokens on average (upstream's "
                  f"tokenizer at {commit}); in upstream's rows of {st['seq_len']}, {rows['padding_share']:.1%} of the "
                  f"positions are padding and {rows['cut_share']:.1%} of the texts' tokens are cut away. The loss is "
                  f"compared after {s['useful_tokens']:,} useful tokens, what upstream's run trained on.", "",
                  "| trainer | s / step | useful tokens / s | step vs upstream | useful tokens/s vs upstream | "
                  "fastest step (s) | fastest vs upstream's | loss at upstream's tokens |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for v, row in s["variants"].items():
            speed = ("1.00x", "1.00x") if v == "upstream" else (_fmt_range(row["step_speedup"], ".2f", "x"),
                                                                  _fmt_range(row["tokens_speedup"], ".2f", "x"))
            mark = " (chosen)" if v == s["chosen"] else ""
            lines.append(f"| {LABELS[v]}{mark} | {_fmt_range(row['step_s'], '.2f')} | {_fmt_range(row['tokens_per_s'], ',.0f')} | "
                         f"{speed[0]} | {speed[1]} | {row['fastest_step_s']:.2f} | {row['fastest_step_speedup']:.2f}x | "
                         f"{_fmt_range(row['loss_at_upstream_tokens'], '.3f')} |")
        if s.get("goals"):
            g, row = s["goals"], s["variants"][s["chosen"]]
            said = lambda ok: "met" if ok else "**not met**"  # noqa: E731
            lines += ["", f"Goals, with the course's chosen variant ({LABELS[s['chosen']]}, the faster bf16 variant; bf16 "
                      f"because this CPU {'has' if env['native_bf16'] else 'lacks'} AVX512-BF16 or AMX): useful tokens/s at "
                      f"least 2x upstream's: {row['tokens_speedup']['median']:.2f}x, {said(g['tokens_speedup_2x'])}; the "
                      f"step at least 1.4x faster than upstream's fp32 step: {row['step_speedup']['median']:.2f}x, "
                      f"{said(g['step_speedup_1_4x'])}."]
        bf = s.get("bf16_vs_fp32")
        if bf:
            noise = bf["seed_noise"]
            parts = [f"{LABELS[v]}: largest |difference| {d['max_abs']:.4f} "
                     f"({'within' if d['within_noise'] else '**not within**'} the seed noise)" for v, d in bf["variants"].items()]
            noise_text = f"{noise:.4f}" if noise is not None else "not measured: one seed"
            lines += ["", f"bf16 against fp32, same seed, same batches (seeds {', '.join(map(str, bf['seeds']))}): mean loss "
                      f"over the last {bf['last_steps']} steps, bf16 minus fp32, against the seed noise (the range of the "
                      f"fp32 runs' means across seeds: {noise_text}): " + "; ".join(parts) + "."]
    return "\n".join(lines) + "\n"


def draw(record: Mapping[str, Any], path: Path) -> Path:
    """Per commit (a row): loss against useful tokens for every run, the same against the optimizer step,
    and useful tokens per second."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    commits = list(record["commits"])
    colors = {"upstream": "black", "course_fp32": "tab:blue", "course_bf16": "tab:orange", "course_bf16_compiled": "tab:red"}
    fig, axes = plt.subplots(len(commits), 3, figsize=(15, 3.8 * len(commits)), squeeze=False,
                             gridspec_kw={"width_ratios": [2, 1.4, 1.2]})
    for row, commit in enumerate(commits):
        entry = record["commits"][commit]
        s = summarize_commit(entry, record["settings"]["warmup"])
        ax = axes[row][0]
        for v, runs in entry["runs"].items():
            for i, run in enumerate(runs if v != "upstream" else runs[:1]):  # upstream repeats its one seed
                x, total = [], 0
                for n in run["useful_tokens"]:
                    total += n
                    x.append(total)
                ax.plot(x, run["loss"], color=colors[v], lw=1.4 if v == "upstream" else 0.9, alpha=1 if v == "upstream" else 0.7,
                        label=LABELS[v] + ("" if v == "upstream" else " (one line a seed)") if i == 0 else None)
        ax.axvline(s["useful_tokens"], color="gray", ls=":", lw=1)
        ax.set_xlabel("useful (non-padding) tokens trained on")
        ax.set_ylabel("training loss")
        ax.set_title(f"upstream {commit} vs the course: {entry['model']['name']}", fontsize=9)
        ax.legend(fontsize=7)
        ax = axes[row][1]
        for v, runs in entry["runs"].items():
            for run in runs if v != "upstream" else runs[:1]:
                ax.plot(range(1, len(run["loss"]) + 1), run["loss"], color=colors[v], lw=1.4 if v == "upstream" else 0.9,
                        alpha=1 if v == "upstream" else 0.7)
        ax.set_xlabel("optimizer step")
        ax.set_ylabel("training loss")
        ax.set_title("the same runs, against the step", fontsize=9)
        ax = axes[row][2]
        names = list(s["variants"])
        med = [s["variants"][v]["tokens_per_s"]["median"] for v in names]
        err = [[m - s["variants"][v]["tokens_per_s"]["min"] for v, m in zip(names, med)],
               [s["variants"][v]["tokens_per_s"]["max"] - m for v, m in zip(names, med)]]
        ax.barh(range(len(names)), med, xerr=err, color=[colors[v] for v in names])
        for i, m in enumerate(med):
            ax.text(m, i, f" {m:,.0f}", va="center", fontsize=8)
        ax.set_yticks(range(len(names)), [LABELS[v] for v in names], fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("useful tokens / s (median, range)")
        ax.set_title(f"{record['environment']['threads']} threads, {record['date']}", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)
    return path


def report(record_path: Path = RECORD, table: Optional[Path] = None, figure: Optional[Path] = None) -> Path:
    """Write the table (and, when there is a record, the figure) from the record: the page's files for the
    committed record, else files beside the record (a trial run leaves the page alone)."""
    page = {k.resolve(): v for k, v in PAGE_FILES.items()}.get(Path(record_path).resolve())
    table = table or (page[0] if page else Path(record_path).with_suffix(".md"))
    figure = figure or (page[1] if page else Path(record_path).with_suffix(".png"))
    record = json.loads(record_path.read_text()) if record_path.exists() else None
    table.parent.mkdir(parents=True, exist_ok=True)
    table.write_text(render(record), encoding="utf-8")
    if record:
        draw(record, figure)
    return table


# ---------------------------------------------------------------------- command line
def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_upstream_trainer", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("bench", help="run the comparison and write the record")
    b.add_argument("--upstream-dir", action="append", required=True, type=Path,
                   help="a checkout of jingyaogong/minimind at c090b69 or d65ef2c (give it once for each)")
    b.add_argument("--upstream-python", default=sys.executable,
                   help="the Python that runs upstream's trainer (needs transformers and datasets)")
    b.add_argument("--steps", type=int, default=30)
    b.add_argument("--rounds", type=int, default=3)
    b.add_argument("--warmup", type=int, default=3)
    b.add_argument("--threads", type=int, default=2)
    b.add_argument("--docs", type=int, default=4000)
    b.add_argument("--variants", default=",".join(VARIANTS))
    b.add_argument("--d65ef2c-hidden", type=int, default=512, help="the width of d65ef2c's model (768: minimind-3's default)")
    b.add_argument("--out", type=Path, default=RECORD)
    r = sub.add_parser("report", help="the table and the figure from the record")
    r.add_argument("--record", type=Path, default=RECORD)
    one = sub.add_parser("_one")
    one.add_argument("spec")
    one.add_argument("out")
    args = parser.parse_args(argv)
    if args.command == "_one":
        run_one(args.spec, args.out)
        return 0
    if args.command == "bench":
        variants = [v for v in args.variants.split(",") if v]
        unknown = sorted(set(variants) - set(VARIANTS))
        if unknown or "upstream" not in variants:
            parser.error(f"--variants: choose from {', '.join(VARIANTS)} (upstream included); got {args.variants}")
        try:
            bench(args.upstream_dir, args.upstream_python, args.steps, args.rounds, args.warmup, args.threads, variants,
                  args.docs, args.out, d65ef2c_hidden=args.d65ef2c_hidden)
        except ValueError as err:
            parser.error(str(err))
        args.record = args.out
    print(f"wrote {report(args.record)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
