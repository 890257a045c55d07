"""Bad input and faults (issue 14): one table, one row per case, so the table can only grow.

Each row is a ``Case``: a label, the call (it receives a fresh temporary folder), the exception
type it must raise and a fragment of the message (lower case). A row whose ``error`` is ``None``
is a case that must *work*: its call asserts the right result itself (an ``AssertionError``
means a wrong result).

``classify`` sorts the outcome of a row into the four kinds the issue counts:

* ``clear error``: the expected exception type, a message holding the fragment;
* ``handled correctly``: an ``error=None`` row whose call ran and asserted the right result;
* ``cryptic error``: any other exception (a torch internal, the wrong type, a message without
  the fragment, or one that tells the user to turn weights-only loading off);
* ``silent``: no exception where one was expected, or a wrong result.

Run ``python tests/test_bad_input.py`` for the counts. To count another version of minimind_ref,
run the file with an interpreter that imports that version, from a folder outside this checkout
(``PYTHONPATH`` does not do it: the editable install of ``.venv`` wins): e.g. a venv whose
``site-packages`` holds a ``.pth`` listing the other checkout, then ``.venv``'s site-packages.

Issue 30 (``ROUND2_CASES``) added the rows of an independent probe and of our own; on the 73 rows it
first added, the code before it gave 1 clear error, 3 handled, 47 silent and 22 cryptic. The design
choices behind those rows:

* every file is written atomically (``minimind_ref.files.atomic_write``); a kill leaves the old or
  the new file, a full disk an ``OSError`` naming the file; stale temporaries go at the next write;
* checkpoints and stage files record ``weights_sha256`` and ``meta_sha256`` (config and extra);
  every loader checks them; files without them (older, upstream's) load as before; the shipped
  stage files were re-saved with them, bit-identical otherwise (``tools/add_stage_digests.py``);
* truncation is counted, not refused: a warning with the counts, ``dataset.truncation``, a line in
  the training log, and ``drop_truncated=True``; a dataset or a run with nothing supervised is an
  error;
* chosen == rejected, and a side without an assistant reply, are errors (no preference to learn);
* the policy passed as its own reference is refused before anything changes (no silent copy);
* a periodic checkpoint is kept only once the next step's loss on its weights is finite; ``lr``,
  ``min_lr`` and ``grad_clip`` may change on resume (the advice a divergence gives);
* LoRA: adapters are not saved by ``save_checkpoint`` (merge or ``save_lora``; the loop's resume
  files keep them with ``allow_lora=True``); a scale other than 1 is recorded as ``lora_scale``
  (upstream's ``load_lora`` ignores the key) and must match on load; ``scale=0`` is refused.
"""

from __future__ import annotations

import collections
import functools
import importlib.util
import io
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Callable, List, NamedTuple, Optional, Tuple
from unittest import mock

import numpy as np
import pytest
import torch

import minimind_ref as mm
import minimind_ref.chat_data  # noqa: F401  (mm.chat_data, mm.dpo, mm.grpo, mm.lora, mm.sft in the rows)
import minimind_ref.dpo  # noqa: F401
import minimind_ref.grpo  # noqa: F401
import minimind_ref.lora  # noqa: F401
import minimind_ref.sft  # noqa: F401
from minimind_ref.generation import next_token_logits, sample_next_token, top_k_filter
from minimind_ref.rope import precompute_freqs_cis

sys.path.insert(0, str(Path(__file__).parent))
from _helpers import rand_ids, tiny_config, tiny_model  # noqa: E402


class Case(NamedTuple):
    label: str
    call: Callable[[Path], Any]
    error: Optional[type]  # None: the call must work (it asserts the result itself)
    fragment: str = ""  # lower-case part of the message
    needs: Optional[str] = None  # an optional module the case needs (skipped without it)
    slow: bool = False  # starts a process
    probe: str = "not yet probed"  # whether an independent probe agrees with the row (PROBE_VALUES)


# ---------------------------------------------------------------------- shared builders
@functools.lru_cache(maxsize=None)
def _model(**kw: Any) -> mm.MiniMindForCausalLM:
    """A tiny eval-mode model, shared by the rows that do not change it."""
    return tiny_model(**kw)


def _ids(batch: int = 2, seq: int = 5) -> torch.Tensor:
    return rand_ids(batch, seq)


def _warned(fn: Callable[[], Any], fragment: str) -> Any:
    """Run ``fn``, assert it warned with ``fragment`` in the message, return its result."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = fn()
    assert any(fragment in str(w.message) for w in caught), f"expected a warning about {fragment!r}, got {[str(w.message) for w in caught]}"
    return out


def _no_warning(fn: Callable[[], Any]) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return fn()


def _saved(tmp: Path, model: Optional[mm.MiniMindForCausalLM] = None, name: str = "ckpt.pt") -> Path:
    path = tmp / name
    mm.save_checkpoint(model if model is not None else _model(), path, extra={"step": 1})
    return path


def _same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def _write(tmp: Path, name: str, data: bytes) -> Path:
    path = tmp / name
    path.write_bytes(data)
    return path


# ---------------------------------------------------------------------- item 1: atomic saves
def _half_writer(real_save: Callable[..., Any], then: Callable[[], None]) -> Callable[..., Any]:
    """A ``torch.save`` that writes the first half of the real bytes, then calls ``then``."""

    def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        buf = io.BytesIO()
        real_save(obj, buf, *args, **kwargs)
        data = buf.getvalue()
        handle = open(f, "wb") if isinstance(f, (str, os.PathLike)) else f
        handle.write(data[: len(data) // 2])
        handle.flush()
        os.fsync(handle.fileno())
        then()

    return save


def save_fails_half_way(tmp: Path) -> None:
    path = _saved(tmp)

    def disk_full() -> None:
        raise OSError(28, "No space left on device")

    with mock.patch.object(torch, "save", _half_writer(torch.save, disk_full)):
        try:
            mm.save_checkpoint(tiny_model(seed=1), path)
        except OSError:
            pass  # the write error itself reaches the caller; what matters is the file
    assert _same_weights(mm.load_checkpoint(path), _model()), "the previous checkpoint must be intact"
    assert os.listdir(tmp) == ["ckpt.pt"], f"temporary files left behind: {os.listdir(tmp)}"


_KILL_CHILD = """
import os, signal, sys, torch
sys.path.insert(0, {tests!r})
from test_bad_input import _half_writer
from _helpers import tiny_model
import minimind_ref as mm
torch.save = _half_writer(torch.save, lambda: os.kill(os.getpid(), signal.SIGKILL))
mm.save_checkpoint(tiny_model(seed=1), {path!r})
"""


def save_killed_half_way(tmp: Path) -> None:
    path = _saved(tmp)
    code = _KILL_CHILD.format(tests=str(Path(__file__).parent), path=str(path))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, f"the child should be killed mid-write: {proc.returncode} {proc.stderr[-500:]}"
    assert _same_weights(mm.load_checkpoint(path), _model()), "the previous checkpoint must be intact"


# ---------------------------------------------------------------------- item 3 (checkpoint part): non-finite tensors
def _nan_model() -> mm.MiniMindForCausalLM:
    m = tiny_model()
    with torch.no_grad():
        m.model.layers[1].mlp.up_proj.weight[0, 0] = float("nan")
    return m


def save_nan_model_keeps_previous(tmp: Path) -> None:
    path = _saved(tmp)
    try:
        mm.save_checkpoint(_nan_model(), path)
    except ValueError as err:
        assert "model.layers.1.mlp.up_proj.weight" in str(err), str(err)
        assert _same_weights(mm.load_checkpoint(path), _model()), "the previous checkpoint must be intact"
        raise


def save_nan_in_extra(tmp: Path) -> None:
    mm.save_checkpoint(_model(), tmp / "c.pt", extra={"optimizer": {"state": {0: {"exp_avg": torch.tensor([1.0, float("inf")])}}}})


def load_nan_weights(tmp: Path) -> None:
    path = tmp / "nan.pth"
    torch.save(_nan_model().state_dict(), path)
    try:
        mm.load_checkpoint(path, num_attention_heads=4)
    except ValueError:
        m = mm.load_checkpoint(path, num_attention_heads=4, check_finite=False)  # the opt-out works
        assert torch.isnan(m.model.layers[1].mlp.up_proj.weight).any()
        raise


# ---------------------------------------------------------------------- item 5: loss without targets
def loss_without_targets_is_zero(tmp: Path) -> None:
    m = tiny_model().train()
    ids = _ids()
    out = m(ids, labels=torch.full_like(ids, -100))
    assert out.loss.item() == 0.0, out.loss
    out.loss.backward()
    for name, p in m.named_parameters():
        assert p.grad is not None and bool((p.grad == 0).all()), name
    only_first = torch.full_like(ids, -100)
    only_first[:, 0] = ids[:, 0]  # the first label is never a target (nothing predicts it)
    assert m(ids, labels=only_first).loss.item() == 0.0


# ---------------------------------------------------------------------- item 6: generation
def generate_huge_max_new_tokens(tmp: Path) -> None:
    m = _model()  # max_position_embeddings = 64
    out = _warned(lambda: m.generate(_ids(1, 4), max_new_tokens=10**12), "max_position_embeddings=64")
    assert out.shape == (1, 64)


def generate_reaches_position_limit(tmp: Path) -> None:
    m = _model()
    ids = _ids(2, 60)
    out = _warned(lambda: m.generate(ids, max_new_tokens=10), "max_position_embeddings")
    assert out.shape == (2, 64) and torch.equal(out, _no_warning(lambda: m.generate(ids, max_new_tokens=4)))
    out = _warned(lambda: m.generate(ids, max_new_tokens=10, use_cache=False), "max_position_embeddings")
    assert out.shape == (2, 64)


def generate_right_padding(tmp: Path) -> None:
    mask = torch.ones(2, 5, dtype=torch.long)
    mask[1, 3:] = 0
    _model().generate(_ids(), attention_mask=mask, max_new_tokens=2)


def generate_left_padding_bool_mask(tmp: Path) -> None:
    m, ids = _model(), _ids()
    mask = torch.ones(2, 5, dtype=torch.long)
    mask[1, :2] = 0
    assert torch.equal(m.generate(ids, attention_mask=mask.bool(), max_new_tokens=3),
                       m.generate(ids, attention_mask=mask, max_new_tokens=3))


def _gen(**kw: Any) -> Callable[[Path], Any]:
    return lambda tmp: _model().generate(_ids(), max_new_tokens=2, **kw)


# ---------------------------------------------------------------------- item 7: special-token text
def _tokenizer():
    from minimind_ref.tokenizer import train_bpe_tokenizer

    texts = ["<|im_start|>user\nhello world<|im_end|>\n<|im_start|>assistant\nhi there<|im_end|>\n"] * 30
    return train_bpe_tokenizer(texts + ["the cat sat on the mat 12 + 30 = 42"] * 30, vocab_size=300)


def _encode_plain():
    from minimind_ref.tokenizer import encode_plain

    return encode_plain


def encode_plain_round_trip(tmp: Path) -> None:
    from minimind_ref.tokenizer import SPECIAL_TOKENS, encode_plain

    tk = _tokenizer()
    for text in ("hello <|im_end|> world", "<|im_start|>assistant\nI am root<|im_end|>", "<|endoftext|>", "plain 12 ☃"):
        ids = encode_plain(tk, text)
        assert not set(ids) & {0, 1, 2}, (text, ids)
        assert tk.decode(ids) == text, (text, tk.decode(ids))
    assert tk.encode_special_tokens is False, "encode_plain must restore the tokenizer's setting"
    assert tk.encode("hi<|im_end|>").ids[-1] == 2, "tokenizer.encode still parses special tokens (templates need it)"
    assert SPECIAL_TOKENS[2] == "<|im_end|>"


# ---------------------------------------------------------------------- item 8: config
def config_rope_scaling_kwarg_warns(tmp: Path) -> None:
    c = _warned(lambda: mm.MiniMindConfig(rope_scaling={"type": "yarn", "factor": 4}), "inference_rope_scaling")
    assert c.rope_scaling is None
    # the value upstream derives (what its config.json holds) is accepted quietly
    _no_warning(lambda: mm.MiniMindConfig(inference_rope_scaling=True, rope_scaling=dict(mm.config.YARN_ROPE_SCALING)))
    _no_warning(lambda: mm.MiniMindConfig(rope_scaling=None, head_dim=64))


def config_rope_scaling_set_after(tmp: Path) -> None:
    c = tiny_config()
    c.rope_scaling = {"type": "yarn", "factor": 0}
    mm.MiniMindForCausalLM(c)


# ---------------------------------------------------------------------- item 9: checkpoints
def extra_numpy_scalar(tmp: Path) -> None:
    path = tmp / "c.pt"
    mm.save_checkpoint(_model(), path, extra={"best": np.float64(1.5), "step": np.int64(3), "hist": [np.float32(0.5)]})
    extra = torch.load(path, weights_only=True)["extra"]
    assert extra == {"best": 1.5, "step": 3, "hist": [0.5]} and type(extra["best"]) is float
    assert _same_weights(mm.load_checkpoint(path), _model())


class _Custom:
    pass


def _state(**kw: Any) -> dict:
    return tiny_model(**kw).state_dict()


def four_heads_needs_config(tmp: Path) -> None:
    sd = _state()  # hidden 32, 4 heads, 2 KV heads: k_proj has 16 rows, fits 8 heads / 4 KV heads as well
    mm.infer_config(sd)


def four_heads_with_config(tmp: Path) -> None:
    m = _model()
    path = tmp / "up.pth"
    torch.save(m.state_dict(), path)
    loaded = mm.load_checkpoint(path, num_attention_heads=4, max_position_embeddings=64)
    ids = _ids()
    torch.testing.assert_close(loaded(ids).logits, m(ids).logits, rtol=0, atol=0)
    assert mm.infer_config(m.state_dict(), num_key_value_heads=2).num_attention_heads == 4


def upstream_layout_inferred(tmp: Path) -> None:
    m = tiny_model(hidden_size=64, num_attention_heads=8, num_key_value_heads=2, intermediate_size=64)
    cfg = mm.infer_config(m.state_dict(), max_position_embeddings=64)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads) == (8, 2)


def top1_moe_needs_top_k(tmp: Path) -> None:
    mm.infer_config(_state(use_moe=True, num_experts_per_tok=1), num_attention_heads=4)


def _without(key_part: str) -> dict:
    return {k: v for k, v in _state().items() if key_part not in k}


class _Payload:
    """Unpickling this would create the folder it names."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def pickled_payload(tmp: Path) -> None:
    marker = tmp / "payload_ran"
    path = tmp / "evil.pt"
    torch.save({"model.embed_tokens.weight": torch.zeros(2, 2), "x": _Payload(str(marker))}, path)
    try:
        mm.load_checkpoint(path)
    finally:
        assert not marker.exists(), "the pickled payload ran"


def pickled_payload_course_format(tmp: Path) -> None:
    marker = tmp / "payload_ran"
    path = _saved(tmp)
    blob = torch.load(path, weights_only=True)
    blob["extra"]["x"] = _Payload(str(marker))
    torch.save(blob, path)
    try:
        mm.load_checkpoint(path)
    finally:
        assert not marker.exists(), "the pickled payload ran"


def lora_pickled_payload(tmp: Path) -> None:
    """A LoRA file in upstream's key format that also holds an object whose unpickling runs code."""
    from minimind_ref.lora import apply_lora, load_lora

    marker = tmp / "payload_ran"
    path = tmp / "lora_evil_32.pth"
    torch.save({"model.layers.0.self_attn.q_proj.lora.A.weight": torch.zeros(4, 32), "x": _Payload(str(marker))}, path)
    try:
        load_lora(apply_lora(tiny_model(), rank=4), path)
    finally:
        assert not marker.exists(), "the pickled payload ran"


def lora_from_another_model(tmp: Path) -> None:
    """Adapters trained on a wider model (hidden 64, rank 4) loaded into hidden 32, rank 8."""
    from minimind_ref.lora import apply_lora, load_lora, save_lora

    path = tmp / "lora_64.pth"
    save_lora(apply_lora(tiny_model(hidden_size=64, intermediate_size=128), rank=4), path)
    model = apply_lora(tiny_model(), rank=8)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    try:
        load_lora(model, path)
    finally:
        assert _same_weights_dict(model.state_dict(), before), "a refused LoRA file changed the model"


def _same_weights_dict(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def truncated_checkpoint(tmp: Path) -> None:
    data = _saved(tmp).read_bytes()
    mm.load_checkpoint(_write(tmp, "t.pt", data[: len(data) // 2]))


def save_wrapped_model(tmp: Path) -> None:
    path = tmp / "c.pt"
    mm.save_checkpoint(torch.nn.DataParallel(_model()), path)
    assert _same_weights(mm.load_checkpoint(path), _model())


# ---------------------------------------------------------------------- item 10: model inputs and caches
def bool_mask_with_false(tmp: Path) -> None:
    m, ids = _model(), _ids()
    mask = torch.ones(2, 5, dtype=torch.long)
    mask[0, :2] = 0
    torch.testing.assert_close(m(ids, attention_mask=mask.bool()).logits, m(ids, attention_mask=mask).logits, rtol=0, atol=0)


def _cache(model: mm.MiniMindForCausalLM, batch: int = 2, seq: int = 4):
    return model(_ids(batch, seq), use_cache=True).past_key_values


def cache_other_batch(tmp: Path) -> None:
    _model()(_ids(3, 1), past_key_values=_cache(_model(), batch=2), use_cache=True)


def cache_other_config(tmp: Path) -> None:
    _model()(_ids(2, 1), past_key_values=_cache(_model(num_key_value_heads=1)), use_cache=True)


def cache_hf_layout(tmp: Path) -> None:
    past = [(k.transpose(1, 2), v.transpose(1, 2)) for k, v in _cache(_model())]
    _model()(_ids(2, 1), past_key_values=past, use_cache=True)


def cache_unequal_layers(tmp: Path) -> None:
    past = _cache(_model())
    past[1] = (past[1][0][:, :3], past[1][1][:, :3])
    _model()(_ids(2, 1), past_key_values=past, use_cache=True)


def cache_missing_layer(tmp: Path) -> None:
    past = _cache(_model())
    past[1] = None
    _model()(_ids(2, 1), past_key_values=past, use_cache=True)


def _hf():
    import minimind_ref.hf

    return minimind_ref.hf


def _gpt2():
    import transformers

    return transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=32, n_head=4, vocab_size=61, n_positions=16))


def _call(fn: Callable[..., Any], *args: Any, **kw: Any) -> Callable[[Path], Any]:
    return lambda tmp: fn(*args, **kw)


def _forward(**kw: Any) -> Callable[[Path], Any]:
    ids = kw.pop("input_ids", None)
    return lambda tmp: _model()(ids if ids is not None else _ids(), **kw)


# ---------------------------------------------------------------------- training (issue 14 items 2-5)
@functools.lru_cache(maxsize=None)
def _tiny_data():
    from minimind_ref.train import TrainConfig, build_data

    return build_data(TrainConfig.from_json("tiny_test"))


def _tiny_cfg(**changes: Any):
    from minimind_ref.train import TrainConfig

    return TrainConfig.from_json("tiny_test").replace(progress=False, **changes)


def _settings(**changes: Any) -> Callable[[Path], Any]:
    return lambda tmp: _tiny_cfg(**changes)


def train_cli_bad_value(tmp: Path) -> None:
    """The command line turns a bad --set value into argparse's usage error (exit 2), no traceback."""
    from minimind_ref.train import config_from_args

    err = io.StringIO()
    with mock.patch("sys.stderr", err):
        try:
            config_from_args(["--config", "tiny_test", "--set", "lr=abc"])
        except SystemExit as exit_info:
            assert exit_info.code == 2, exit_info.code
            assert "is invalid" in err.getvalue(), err.getvalue()
            return
    raise AssertionError("no usage error")


def train_resume_without_out_dir(tmp: Path) -> None:
    from minimind_ref.train import train

    train(_tiny_cfg(resume="auto"), data=_tiny_data())


def train_resume_other_model_touches_nothing(tmp: Path) -> None:
    from minimind_ref.train import train

    run = tmp / "run"
    train(_tiny_cfg(max_steps=4, out_dir=str(run), eval_every=0), data=_tiny_data(), stop_at=2, log=lambda s: None)
    before = {q.name: q.read_bytes() for q in run.iterdir()}
    try:
        train(_tiny_cfg(max_steps=4, out_dir=str(run), resume="auto", eval_every=0, model={"hidden_size": 64}),
              log=lambda s: None)
    finally:
        assert {q.name: q.read_bytes() for q in run.iterdir()} == before, "a refused resume wrote into the run folder"


def train_resume_other_data(tmp: Path) -> None:
    from minimind_ref.train import build_data, train

    run = tmp / "run"
    train(_tiny_cfg(max_steps=4, out_dir=str(run), eval_every=0), data=_tiny_data(), stop_at=2, log=lambda s: None)
    other = build_data(_tiny_cfg(n_docs=200))
    train(_tiny_cfg(max_steps=4, out_dir=str(run), resume="auto", eval_every=0), data=other, log=lambda s: None)


def train_resume_pickled_payload(tmp: Path) -> None:
    """A run folder whose ckpt.pt is a pickle that would run code: refused, never unpickled."""
    from minimind_ref.train import train

    run = tmp / "run"
    train(_tiny_cfg(max_steps=4, out_dir=str(run), eval_every=0), data=_tiny_data(), stop_at=2, log=lambda s: None)
    marker = tmp / "payload_ran"
    torch.save({"payload": _Payload(str(marker))}, run / "ckpt.pt")
    try:
        train(_tiny_cfg(max_steps=4, out_dir=str(run), resume="auto", eval_every=0), data=_tiny_data(), log=lambda s: None)
    finally:
        assert not marker.exists(), "the payload ran"


def train_divergence(tmp: Path) -> None:
    """lr=1e9 with a save every step: the run stops before the update that would poison a checkpoint."""
    from minimind_ref.train import train

    run = tmp / "run"
    try:
        train(_tiny_cfg(max_steps=6, lr=1e9, min_lr=0.0, warmup_steps=0, eval_every=0, save_every=1, grad_clip=None,
                        out_dir=str(run)), data=_tiny_data(), log=lambda s: None)
    finally:
        if (run / "ckpt.pt").exists():
            blob = torch.load(run / "ckpt.pt", weights_only=True)
            assert all(torch.isfinite(t).all() for t in blob["state_dict"].values()), "a checkpoint holds non-finite weights"


class _NoTargets:
    """A dataset whose first ``empty`` batches have every label -100 (answers truncated away)."""

    def __init__(self, base: Any, empty: int) -> None:
        self.base, self.empty = base, empty

    def __len__(self) -> int:
        return len(self.base)

    def batch(self, idx: Any) -> Any:
        x, y = self.base.batch(idx)
        self.empty -= 1
        return (x, torch.full_like(x, -100)) if self.empty >= 0 else (x, y)


def train_batch_without_targets(tmp: Path) -> None:
    """A batch whose labels are all -100 (an SFT batch whose answers were truncated away): skipped and counted."""
    from minimind_ref.train import RunData, build_model, train

    data = _tiny_data()
    model = build_model(_tiny_cfg(), data.tokenizer.get_vocab_size())
    lines: List[str] = []
    res = train(_tiny_cfg(max_steps=2, eval_every=0), model=model, data=RunData(data.tokenizer, _NoTargets(data.train, 1)),
                log=lines.append)
    assert res.history["skipped"] == [1.0, 0.0], res.history["skipped"]
    assert any("1 of 2 steps were skipped" in line for line in lines), lines


def train_every_batch_without_targets(tmp: Path) -> None:
    """Every step skipped: before, train() returned normally with the weights unchanged."""
    from minimind_ref.train import RunData, build_model, train

    data = _tiny_data()
    model = build_model(_tiny_cfg(), data.tokenizer.get_vocab_size())
    train(_tiny_cfg(max_steps=2, eval_every=0), model=model, data=RunData(data.tokenizer, _NoTargets(data.train, 2)),
          log=lambda s: None)


def dpo_loss_without_targets(tmp: Path) -> None:
    """A DPO batch whose replies have no masked token: a finite loss (log 2 at equal policy and reference)."""
    from minimind_ref.dpo import dpo_loss

    lp = torch.randn(4, 6, requires_grad=True)
    loss = dpo_loss(lp.detach(), lp, torch.zeros(4, 6), beta=0.1)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(lp.grad).all(), loss
    torch.testing.assert_close(loss, torch.log(torch.tensor(2.0)))



def grpo_group_without_spread(tmp: Path) -> None:
    """A GRPO group whose completions all got the same reward: advantage 0, no NaN (std 0 + 1e-4)."""
    from minimind_ref.grpo import group_advantages

    adv = group_advantages(torch.tensor([1.0, 1.0, 1.0, 1.0]), 4)
    assert torch.equal(adv, torch.zeros(4)), adv


def grpo_partial_groups(tmp: Path) -> None:
    from minimind_ref.grpo import group_advantages

    group_advantages(torch.zeros(6), 4)


def _grpo_loss(**changes: Any) -> Callable[[Path], Any]:
    def run(tmp: Path) -> Any:
        from minimind_ref.grpo import grpo_loss

        args = dict(per_token_logps=torch.zeros(2, 3), old_per_token_logps=torch.zeros(2, 3),
                    ref_per_token_logps=torch.zeros(2, 3), advantages=torch.zeros(2), completion_mask=torch.ones(2, 3),
                    beta=0.02)
        args.update(changes)
        return grpo_loss(**args)
    return run


# ====================================================================== issue 30: reliability, round two
# ---------------------------------------------------------------------- every writer is atomic
class _FullDisk:
    """A file whose ``write`` stores the first ``room`` bytes, then raises ENOSPC (a full disk)."""

    def __init__(self, handle: Any, room: int = 100) -> None:
        self.handle, self.room = handle, room

    def write(self, data: Any) -> int:
        if self.room <= 0:
            raise OSError(28, "No space left on device")
        part = data[: self.room]
        self.room -= len(part)
        self.handle.write(part)
        if len(part) < len(data):
            raise OSError(28, "No space left on device")
        return len(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.handle, name)

    def __enter__(self) -> "_FullDisk":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.handle.close()


def _disk_full() -> Any:
    """Patch open() so that every file opened for writing runs out of space after 100 bytes."""
    import builtins

    real_open = builtins.open

    def full_open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        handle = real_open(file, mode, *args, **kwargs)
        return _FullDisk(handle) if any(c in mode for c in "wxa+") else handle

    return mock.patch("builtins.open", full_open)


def _no_temp_files(folder: Path, expected: List[str]) -> None:
    assert sorted(os.listdir(folder)) == sorted(expected), f"temporary files left behind: {os.listdir(folder)}"


def disk_full_checkpoint(tmp: Path) -> None:
    path = _saved(tmp)
    try:
        with _disk_full():
            mm.save_checkpoint(tiny_model(seed=1), path)
    except OSError as err:
        assert err.errno == 28 and "previous file" in str(err) and str(path) in str(err), str(err)
        assert _same_weights(mm.load_checkpoint(path), _model()), "the previous checkpoint must be intact"
        _no_temp_files(tmp, ["ckpt.pt"])
        raise


def _records(n: int, tag: str = "q") -> List[dict]:
    return [{"conversations": [{"role": "user", "content": f"{tag}{i}"}, {"role": "assistant", "content": "ok"}]}
            for i in range(n)]


def disk_full_jsonl(tmp: Path) -> None:
    from minimind_ref.chat_data import load_jsonl, save_jsonl

    path = tmp / "data.jsonl"
    save_jsonl(_records(50), path)
    try:
        with _disk_full():
            save_jsonl(_records(5000, "new"), path)
    except OSError as err:
        assert load_jsonl(path) == _records(50), "the previous JSONL file must be intact"
        _no_temp_files(tmp, ["data.jsonl"])
        raise


_JSONL_KILL_CHILD = """
import os, signal, sys
sys.path.insert(0, {tests!r})
from test_bad_input import _records
from minimind_ref.chat_data import save_jsonl

def records():
    for i, r in enumerate(_records(20000, "new")):
        if i == 10000:
            os.kill(os.getpid(), signal.SIGKILL)
        yield r

save_jsonl(records(), {path!r})
"""


def jsonl_killed_half_way(tmp: Path) -> None:
    """Killed after writing 10,000 of 20,000 records over a 20,000-record file: the old file stays whole
    (before: load_jsonl returned 0 to 16,047 records, no error)."""
    from minimind_ref.chat_data import load_jsonl, save_jsonl

    path = tmp / "data.jsonl"
    save_jsonl(_records(20000), path)
    code = _JSONL_KILL_CHILD.format(tests=str(Path(__file__).parent), path=str(path))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, f"the child should be killed mid-write: {proc.returncode} {proc.stderr[-500:]}"
    assert load_jsonl(path) == _records(20000), "the previous JSONL file must be intact"


def tilde_path_is_home(tmp: Path) -> None:
    """save_checkpoint("~/x.pt") writes into the home folder (before: a folder named '~' in the working folder)."""
    home, work = tmp / "home", tmp / "work"
    home.mkdir()
    work.mkdir()
    old = os.getcwd()
    os.chdir(work)
    try:
        with mock.patch.dict(os.environ, {"HOME": str(home)}):
            mm.save_checkpoint(_model(), "~/x.pt")
            assert _same_weights(mm.load_checkpoint("~/x.pt"), _model())
            from minimind_ref.chat_data import load_jsonl, save_jsonl

            save_jsonl(_records(3), "~/d.jsonl")
            assert load_jsonl("~/d.jsonl") == _records(3)
    finally:
        os.chdir(old)
    assert sorted(os.listdir(home)) == ["d.jsonl", "x.pt"] and os.listdir(work) == [], (os.listdir(home), os.listdir(work))



# ---------------------------------------------------------------------- digests and one validation path for weights
def _flip_tensor_byte(path: Path) -> None:
    """Flip one bit in the middle of the largest tensor stored in a torch.save zip file."""
    import zipfile

    with zipfile.ZipFile(path) as z:
        info = max((i for i in z.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
    data = bytearray(path.read_bytes())
    name_len = int.from_bytes(data[info.header_offset + 26: info.header_offset + 28], "little")
    extra_len = int.from_bytes(data[info.header_offset + 28: info.header_offset + 30], "little")
    start = info.header_offset + 30 + name_len + extra_len
    data[start + info.file_size // 2] ^= 0x10
    path.write_bytes(bytes(data))


def flipped_bit_checkpoint(tmp: Path) -> None:
    path = _saved(tmp)
    _flip_tensor_byte(path)
    mm.load_checkpoint(path)


def edited_by_hand_checkpoint(tmp: Path) -> None:
    path = _saved(tmp)
    blob = torch.load(path, weights_only=True)
    blob["state_dict"]["model.norm.weight"] = torch.zeros_like(blob["state_dict"]["model.norm.weight"])
    torch.save(blob, path)
    mm.load_checkpoint(path)


def checkpoint_without_digest_loads(tmp: Path) -> None:
    """Files written before the digest existed (and upstream's .pth) have none: they load as before."""
    path = _saved(tmp)
    blob = torch.load(path, weights_only=True)
    assert isinstance(blob.pop("weights_sha256"), str)
    torch.save(blob, path)
    assert _same_weights(mm.load_checkpoint(path), _model())


def resume_flipped_bit(tmp: Path) -> None:
    from minimind_ref.train import train

    run = tmp / "run"
    train(_tiny_cfg(max_steps=4, out_dir=str(run), eval_every=0), data=_tiny_data(), stop_at=2, log=lambda s: None)
    _flip_tensor_byte(run / "ckpt.pt")
    train(_tiny_cfg(max_steps=4, out_dir=str(run), resume="auto", eval_every=0), data=_tiny_data(), log=lambda s: None)


def _upstream():
    import _upstream_files

    return _upstream_files


def _inf_upstream_model() -> mm.MiniMindForCausalLM:
    U = _upstream()
    m = U.random_model(U.upstream_layout(), seed=0)
    with torch.no_grad():
        m.model.layers[0].mlp.up_proj.weight[0, 0] = float("inf")
    return m


def load_pth_inf(tmp: Path) -> None:
    from minimind_ref.pretrained import load_pth

    load_pth(_upstream().save_pth(_inf_upstream_model(), tmp))


def load_hf_dir_inf(tmp: Path) -> None:
    from minimind_ref.pretrained import load_hf_dir

    _upstream().save_llama_dir(_inf_upstream_model(), tmp / "hf")
    load_hf_dir(tmp / "hf")


def load_pth_pickle(tmp: Path) -> None:
    from minimind_ref.pretrained import load_pth

    marker = tmp / "payload_ran"
    torch.save({"model.embed_tokens.weight": torch.zeros(2, 2), "x": _Payload(str(marker))}, tmp / "full_sft_512.pth")
    try:
        load_pth(tmp / "full_sft_512.pth")
    finally:
        assert not marker.exists(), "the pickled payload ran"


def load_pretrained_other_tokenizer(tmp: Path) -> None:
    """A 300-token tokenizer next to a 400-token model (the probe: 512 with 6,400)."""
    from minimind_ref import pretrained as P

    U = _upstream()
    U.save_pth(U.random_model(U.upstream_layout(), seed=0), tmp)
    U.write_tokenizer(tmp, vocab_size=300)
    with mock.patch.dict(P.MODELS, {"Tiny": (64, False, 2)}):
        P.load_pretrained("Tiny", path=tmp)


def _stage_dir(tmp: Path) -> Any:
    import minimind_ref.stages as stages

    return mock.patch.object(stages, "CHECKPOINT_DIR", tmp)


def _tiny_stage(tmp: Path, model: Optional[mm.MiniMindForCausalLM] = None) -> Path:
    import minimind_ref.stages as stages

    figures = {"sum_accuracy": 0.74, "stop_rate": 1.0, "preference_accuracy": 0.9, "mean_length": 40.0}
    with _stage_dir(tmp):
        return stages.save_stage(model if model is not None else _model(), "sft", {"evaluate_chat": figures})


def stage_zeroed_by_hand(tmp: Path) -> None:
    """Weights zeroed with torch.load/torch.save: `report --recorded` must not show the recorded 0.74."""
    import minimind_ref.stages as stages

    path = _tiny_stage(tmp)
    blob = torch.load(path, weights_only=True)
    blob["state_dict"] = {k: torch.zeros_like(v) for k, v in blob["state_dict"].items()}
    torch.save(blob, path)
    with _stage_dir(tmp):
        stages.recorded_rows(["sft"])


def stage_resaved_with_old_metadata(tmp: Path) -> None:
    """New weights saved with save_checkpoint and the old extra: the figures belong to other weights."""
    import minimind_ref.stages as stages

    path = _tiny_stage(tmp)
    with _stage_dir(tmp):
        extra = stages.stage_metadata("sft")
        mm.save_checkpoint(tiny_model(seed=3).half(), path, extra=extra)
        stages.recorded_rows(["sft"])


def stage_truncated(tmp: Path) -> None:
    import minimind_ref.stages as stages

    path = _tiny_stage(tmp)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with _stage_dir(tmp):
        stages.stage_metadata("sft")


def stage_fp16_overflow(tmp: Path) -> None:
    m = tiny_model()
    with torch.no_grad():
        m.model.layers[0].mlp.up_proj.weight[0, 0] = 1e6
    _tiny_stage(tmp, m)


def shipped_stages_verify(tmp: Path) -> None:
    """Every shipped stage file carries the digest of its weights, and it verifies."""
    import minimind_ref.stages as stages

    for name in stages.available_stages():
        blob = torch.load(stages.stage_path(name), weights_only=True)
        assert isinstance(blob.get("weights_sha256"), str), f"{name}.pt has no digest"
        assert isinstance(blob.get("meta_sha256"), str), f"{name}.pt has no digest of its config and metadata"
        assert blob["extra"].get("weights_sha256") == blob["weights_sha256"], f"{name}.pt: extra lacks the digest"
        stages.stage_metadata(name)


# ---------------------------------------------------------------------- truncation is counted and reported
@functools.lru_cache(maxsize=None)
def _course_tokenizer():
    from minimind_ref.stages import load_tokenizer

    return load_tokenizer()


def _chat(user: str, answer: str) -> dict:
    return {"conversations": [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]}


def _fits(record: dict) -> int:
    from minimind_ref.sft import encode_chat

    return len(encode_chat(_course_tokenizer(), record["conversations"]))


def sft_prompts_too_long(tmp: Path) -> None:
    """3 of 4 prompts longer than max_length (the probe's case): counted, warned, and droppable."""
    from minimind_ref.sft import SFTDataset

    short = _chat("hi", "ok")
    records = [_chat("word " * 80, "ok fine")] * 3 + [short]
    ds = _warned(lambda: SFTDataset(records, _course_tokenizer(), max_length=_fits(short)),
                 "of 4 conversations, 3 lost their whole answer")
    assert (ds.truncation["no_answer"], ds.truncation["cut_answer"], ds.truncated) == (3, 0, [0, 1, 2]), ds.truncation
    kept = _warned(lambda: SFTDataset(records, _course_tokenizer(), max_length=_fits(short), drop_truncated=True),
                   "left out")
    assert len(kept) == 1 and kept.truncation["dropped"] == 3


def sft_answer_cut(tmp: Path) -> None:
    """An answer cut mid-way loses its <|im_end|>: counted as cut_answer."""
    from minimind_ref.sft import SFTDataset

    record = _chat("hi", "a long answer " * 20)
    # no random system prompt, every empty thinking block kept: the encoding _fits measured
    ds = _warned(lambda: SFTDataset([record, _chat("hi", "ok")], _course_tokenizer(), max_length=_fits(record) - 5,
                                    add_system_ratio=0.0, empty_think_ratio=1.0),
                 "1 lost the end of an answer with its <|im_end|>")
    assert ds.truncation["cut_answer"] == 1 and ds.truncation["no_answer"] == 0, ds.truncation
    assert 2 not in ds.examples[0][1], "the cut answer has no <|im_end|> label"


def sft_nothing_supervised(tmp: Path) -> None:
    from minimind_ref.sft import SFTDataset

    SFTDataset([_chat("word " * 80, "ok")] * 4, _course_tokenizer(), max_length=32)


def sft_fits_no_warning(tmp: Path) -> None:
    """Nothing is cut: no warning, counts 0."""
    from minimind_ref.sft import SFTDataset

    ds = _no_warning(lambda: SFTDataset([_chat("hi", "ok")] * 2, _course_tokenizer(), max_length=256))
    assert ds.truncation["no_answer"] == ds.truncation["cut_answer"] == 0


def train_log_reports_truncation(tmp: Path) -> None:
    from minimind_ref.sft import SFTDataset
    from minimind_ref.train import RunData, train

    tok = _course_tokenizer()
    short = _chat("hi", "ok")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds = SFTDataset([_chat("word " * 80, "ok fine"), short, short, short], tok, max_length=_fits(short))
    lines: List[str] = []
    model = tiny_model(vocab_size=tok.get_vocab_size())
    train(_tiny_cfg(max_steps=1, eval_every=0, batch_size=4), model=model, data=RunData(tok, ds), log=lines.append)
    assert any("training data: of 4 examples, 1 lost their whole answer" in line for line in lines), lines


def _pair(user: str, chosen: str, rejected: str) -> dict:
    turn = [{"role": "user", "content": user}]
    return {"chosen": turn + [{"role": "assistant", "content": chosen}],
            "rejected": turn + [{"role": "assistant", "content": rejected}]}


def dpo_pairs_cut_to_nothing(tmp: Path) -> None:
    """Pairs whose prompt fills max_length (before: a constant log 2 in the loss, nothing said)."""
    from minimind_ref.dpo import DPODataset

    short = _pair("hi", "yes", "no")
    records = [_pair("word " * 80, "yes", "no")] * 2 + [short]
    length = max(_fits({"conversations": short["chosen"]}), _fits({"conversations": short["rejected"]}))
    ds = _warned(lambda: DPODataset(records, _course_tokenizer(), max_length=length),
                 "of 3 pairs, 2 lost their whole answer")
    assert ds.truncation["no_answer"] == 2 and len(ds) == 3
    kept = _warned(lambda: DPODataset(records, _course_tokenizer(), max_length=length, drop_truncated=True), "left out")
    assert len(kept) == 1


def dpo_chosen_is_rejected(tmp: Path) -> None:
    from minimind_ref.dpo import DPODataset

    DPODataset([_pair("hi", "yes", "no"), _pair("hi", "same", "same")], _course_tokenizer(), max_length=128)


# ---------------------------------------------------------------------- GRPO rewards, the policy as its own reference, DPO pairing
def _grpo_step(**changes: Any) -> Callable[[Path], Any]:
    """One GRPOObjective call on a tiny model with the course tokenizer (2 completions of 2 tokens)."""

    def run(tmp: Path) -> Any:
        from minimind_ref import chat_data
        from minimind_ref.grpo import GRPOObjective

        tok = _course_tokenizer()
        policy = tiny_model(vocab_size=tok.get_vocab_size(), max_position_embeddings=256).train()
        args = dict(ref_model=tiny_model(vocab_size=tok.get_vocab_size(), max_position_embeddings=256), tokenizer=tok,
                    num_generations=2, max_new_tokens=2)
        args.update(changes)
        return GRPOObjective(**args)(policy, chat_data.rl_prompts(1, 0, "train"))
    return run


def _policy_as_reference(which: str) -> Callable[[Path], Any]:
    def run(tmp: Path) -> None:
        from minimind_ref.dpo import train_dpo
        from minimind_ref.grpo import train_grpo

        model = tiny_model().train()
        try:
            (train_dpo if which == "dpo" else train_grpo)(model, _course_tokenizer(), ref_model=model)
        finally:
            assert all(p.requires_grad for p in model.parameters()), "the caller's model was frozen"
    return run


def dpo_one_chosen_three_rejected(tmp: Path) -> None:
    from minimind_ref.dpo import DPODataset, concat_pairs

    batch = {k: torch.zeros(1 if k.endswith("chosen") else 3, 5, dtype=torch.long) for k in DPODataset.KEYS}
    concat_pairs(batch)


# ---------------------------------------------------------------------- LoRA
def _adapted(scale: float = 1.0, seed: int = 0) -> mm.MiniMindForCausalLM:
    from minimind_ref.lora import apply_lora, lora_modules

    model = apply_lora(tiny_model(), rank=4, scale=scale)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, layer in lora_modules(model):
            layer.lora.B.weight.copy_(torch.randn(layer.lora.B.weight.shape, generator=g))
    return model


def lora_old_checkpoint(tmp: Path) -> None:
    """A file written before save_checkpoint refused adapters: the hint names them (was: 'fix hidden_size')."""
    mm.save_checkpoint(_adapted(), tmp / "c.pt", allow_lora=True)
    mm.load_checkpoint(tmp / "c.pt")


def lora_other_scale(tmp: Path) -> None:
    from minimind_ref.lora import apply_lora, load_lora, save_lora

    save_lora(_adapted(scale=1.0), tmp / "a.pth")
    load_lora(apply_lora(tiny_model(), rank=4, scale=2.0), tmp / "a.pth")


def lora_scale_round_trip(tmp: Path) -> None:
    """scale 2 is recorded in the file (key lora_scale, ignored by upstream's load_lora) and reloads exactly."""
    from minimind_ref.lora import apply_lora, load_lora, save_lora

    model = _adapted(scale=2.0)
    with torch.no_grad():  # the file holds fp16 adapters (as upstream's save_lora writes them)
        for name, p in model.named_parameters():
            if ".lora." in name:
                p.copy_(p.half().float())
    save_lora(model, tmp / "a.pth")
    assert float(torch.load(tmp / "a.pth", weights_only=True)["lora_scale"]) == 2.0
    again = apply_lora(tiny_model(), rank=4, scale=2.0)
    load_lora(again, tmp / "a.pth")
    ids = _ids()
    torch.testing.assert_close(again(ids).logits, model(ids).logits, rtol=0, atol=0)
    save_lora(_adapted(scale=1.0), tmp / "b.pth")
    assert "lora_scale" not in torch.load(tmp / "b.pth", weights_only=True), "scale 1 files stay upstream's format"


def _lora_scale_entry(tmp: Path, value: torch.Tensor) -> None:
    from minimind_ref.lora import apply_lora, load_lora, save_lora

    save_lora(_adapted(), tmp / "a.pth")
    blob = torch.load(tmp / "a.pth", weights_only=True)
    blob["lora_scale"] = value
    torch.save(blob, tmp / "a.pth")
    load_lora(apply_lora(tiny_model(), rank=4), tmp / "a.pth")


def lora_run_saves_and_resumes(tmp: Path) -> None:
    """The training loop's own resume file keeps the adapters (allow_lora=True), and the run resumes."""
    from minimind_ref.lora import apply_lora, mark_only_lora_trainable
    from minimind_ref.train import build_model, train

    def adapted() -> mm.MiniMindForCausalLM:
        torch.manual_seed(0)
        model = apply_lora(build_model(_tiny_cfg(), _tiny_data().tokenizer.get_vocab_size()), rank=4)
        mark_only_lora_trainable(model)
        return model

    run = tmp / "run"
    cfg = _tiny_cfg(max_steps=4, out_dir=str(run), eval_every=0)
    whole = train(cfg.replace(out_dir=None), model=adapted(), data=_tiny_data(), log=lambda s: None)
    train(cfg, model=adapted(), data=_tiny_data(), stop_at=2, log=lambda s: None)
    resumed = train(cfg.replace(resume="auto"), model=adapted(), data=_tiny_data(), log=lambda s: None)
    assert resumed.history["loss"] == whole.history["loss"], (resumed.history["loss"], whole.history["loss"])


# ---------------------------------------------------------------------- divergence: what is kept, and the advice works
def diverged_keeps_no_destroyed_checkpoint(tmp: Path) -> None:
    """lr=1e9, save_every=1: step 1's weights (|w| ~ 1e9) were kept as ckpt.pt; now a save is kept only once the
    next step's loss, computed on its weights, is finite."""
    from minimind_ref.train import train

    run = tmp / "run"
    try:
        train(_tiny_cfg(max_steps=6, lr=1e9, min_lr=0.0, warmup_steps=0, eval_every=0, save_every=1, grad_clip=None,
                        out_dir=str(run)), data=_tiny_data(), log=lambda s: None)
    finally:
        assert not (run / "ckpt.pt").exists(), "a checkpoint of destroyed weights was kept"
        assert not (run / "ckpt.pt.pending").exists(), "a pending checkpoint was left behind"


def diverged_then_resume_lower_lr(tmp: Path) -> None:
    """A run diverges after a good checkpoint: the error names it, and the advice (resume with a lower lr) works
    (before: resume refused the changed lr)."""
    from minimind_ref.train import train

    run = tmp / "run"
    cfg = _tiny_cfg(max_steps=6, eval_every=0, save_every=1, out_dir=str(run), warmup_steps=0, grad_clip=None)
    quiet = lambda s: None  # noqa: E731
    train(cfg, data=_tiny_data(), stop_at=2, log=quiet)
    try:
        train(cfg.replace(lr=1e9, min_lr=0.0, resume="auto"), data=_tiny_data(), log=quiet)
    except FloatingPointError as err:
        assert "holds step 2" in str(err) and "resume='auto'" in str(err), str(err)
    else:
        raise AssertionError("lr=1e9 should diverge")
    assert torch.load(run / "ckpt.pt", weights_only=True)["extra"]["step"] == 2
    done = train(cfg.replace(lr=1e-3, min_lr=1e-4, resume="auto"), data=_tiny_data(), log=quiet)
    assert done.step == 6 and all(math.isfinite(v) and v < 10 for v in done.history["loss"]), done.history["loss"]


def loss_blowup_warns(tmp: Path) -> None:
    """lr=10: the loss goes from 5.9 to 1,172 and stays finite; the log now says the run is diverging."""
    from minimind_ref.train import train

    lines: List[str] = []
    train(_tiny_cfg(max_steps=3, lr=10.0, min_lr=0.0, warmup_steps=0, eval_every=0, grad_clip=None), data=_tiny_data(),
          log=lines.append)
    assert sum("the run is diverging" in line for line in lines) == 1, lines


# ---------------------------------------------------------------------- still silent from round one
def _train_step(max_grad_norm: Any) -> Callable[[Path], Any]:
    def run(tmp: Path) -> Any:
        from minimind_ref.train import train_step

        model = tiny_model().train()
        ids = _ids(2, 8)
        return train_step(model, torch.optim.SGD(model.parameters(), lr=0.1), ids, ids, max_grad_norm=max_grad_norm)
    return run


def encode_documents_literal_marker(tmp: Path) -> None:
    """A pretraining document that contains the text '<|im_end|>': before, it became the end-of-sequence id."""
    from minimind_ref.data import encode_documents

    tok = _course_tokenizer()
    ids = encode_documents(tok, ["hello <|im_end|> world", "plain"]).tolist()
    assert ids.count(2) == 2 and ids.count(1) == 2, ids  # only the framing ids are special
    assert tok.decode(ids[1:ids.index(2)], skip_special_tokens=False) == "hello <|im_end|> world"
    assert tok.encode_special_tokens is False, "the tokenizer's setting is restored"


def rope_scaling_round_trip(tmp: Path) -> None:
    """A hand-set rope_scaling survives save_checkpoint/load_checkpoint (before: dropped, logits off by 0.19)."""
    config = tiny_config()
    config.rope_scaling = {"type": "yarn", "factor": 4, "original_max_position_embeddings": 16, "beta_fast": 32,
                           "beta_slow": 1, "attention_factor": 1.0}
    torch.manual_seed(0)
    model = mm.MiniMindForCausalLM(config).eval()
    mm.save_checkpoint(model, tmp / "c.pt")
    loaded = _no_warning(lambda: mm.load_checkpoint(tmp / "c.pt"))
    assert loaded.config.rope_scaling == config.rope_scaling, loaded.config.rope_scaling
    ids = _ids(1, 40)
    torch.testing.assert_close(loaded(ids).logits, model(ids).logits, rtol=0, atol=0)
    plain = mm.load_checkpoint(tmp / "c.pt", inference_rope_scaling=False)  # an explicit override wins
    assert plain.config.rope_scaling is None


def hf_round_trip_keeps_dropout(tmp: Path) -> None:
    """to_hf_llama -> from_hf_llama keeps dropout and flash_attn (before: 0.0 and True)."""
    from minimind_ref.hf import from_hf_llama, to_hf_llama

    for dropout, flash in ((0.1, False), (0.0, True)):
        back = from_hf_llama(to_hf_llama(tiny_model(dropout=dropout, flash_attn=flash)))
        assert (back.config.dropout, back.config.flash_attn) == (dropout, flash), back.config


# ---------------------------------------------------------------------- kills at random moments of every writer
_WRITERS_CHILD = """
import os, sys, time
sys.path.insert(0, {tests!r})
from pathlib import Path
from unittest import mock
import test_bad_input as T
import minimind_ref as mm
import minimind_ref.stages as stages
from minimind_ref.chat_data import save_jsonl
from minimind_ref.lora import save_lora
from minimind_ref.tokenizer import save_tokenizer
from minimind_ref.train import train

folder = Path({folder!r})
v = T._writer_versions()
quiet = lambda s: None

def cycle(k):
    mm.save_checkpoint(v["model"][k], folder / "ckpt.pt")
    save_lora(v["lora"][k], folder / "adapter.pth")
    stages.save_stage(v["model"][k], "sft", {{"evaluate_chat": {{"sum_accuracy": k}}}})
    save_jsonl(v["records"][k], folder / "data.jsonl")
    save_tokenizer(v["tokenizer"][k], folder / "tokenizer.json")
    train(T._tiny_cfg(max_steps=3, save_every=1, eval_every=0, out_dir=str(folder / "run")), data=v["data"], log=quiet)

with mock.patch.object(stages, "CHECKPOINT_DIR", folder):
    cycle(0)
    start = time.perf_counter()
    cycle(1)
    print("ready", time.perf_counter() - start, flush=True)
    for line in sys.stdin:  # one worker per kill: forked from this warm process, it writes until it is killed
        pid = os.fork()
        if pid == 0:
            for i in range(10**9):
                cycle(i % 2)
        print(pid, flush=True)
        os.waitpid(pid, 0)
        print("reaped", flush=True)
"""


@functools.lru_cache(maxsize=None)
def _writer_versions() -> dict:
    """Two versions of everything the writers child saves (deterministic, so the parent can rebuild them)."""
    return {"model": [tiny_model(seed=0), tiny_model(seed=1)], "lora": [_adapted(seed=0), _adapted(seed=1)],
            "records": [_records(3000, "a"), _records(3000, "b")], "tokenizer": [_tokenizer(), _course_tokenizer()],
            "data": _tiny_data()}


def _one_of(value: Any, versions: List[Any], same: Callable[[Any, Any], bool], what: str) -> None:
    assert any(same(value, v) for v in versions), f"{what} is neither the old nor the new version"


def _check_writer_files(folder: Path) -> None:
    import minimind_ref.stages as stages
    from minimind_ref.chat_data import load_jsonl
    from minimind_ref.lora import apply_lora, load_lora, lora_modules
    from minimind_ref.tokenizer import load_tokenizer
    from minimind_ref.train import _load_resume_blob

    v = _writer_versions()
    _one_of(mm.load_checkpoint(folder / "ckpt.pt"), v["model"], _same_weights, "ckpt.pt")
    adapted = apply_lora(tiny_model(), rank=4)
    load_lora(adapted, folder / "adapter.pth")
    _one_of(adapted, v["lora"], lambda a, b: all(torch.equal(x.lora.B.weight, y.lora.B.weight.half().float())
                                                  for (_, x), (_, y) in zip(lora_modules(a), lora_modules(b))),
            "adapter.pth")  # save_lora writes fp16, as upstream
    with _stage_dir(folder):
        stages.stage_metadata("sft")  # verifies the digests
        stage = mm.load_checkpoint(stages.stage_path("sft"))
    _one_of(stage, [m.half().float() for m in map(lambda m: __import__("copy").deepcopy(m), v["model"])], _same_weights,
            "sft.pt")
    _one_of(load_jsonl(folder / "data.jsonl"), v["records"], lambda a, b: a == b, "data.jsonl")
    _one_of(load_tokenizer(folder / "tokenizer.json").to_str(), [t.to_str() for t in v["tokenizer"]], lambda a, b: a == b,
            "tokenizer.json")
    run = folder / "run"
    if (run / "ckpt.pt").exists():
        _load_resume_blob(str(run / "ckpt.pt"))  # digest and finite weights: a run could resume from it
        import json

        json.loads((run / "train_config.json").read_text(encoding="utf-8"))


def every_writer_killed_at_random_moments(tmp: Path) -> None:
    """A process saves a checkpoint, a LoRA file, a stage file, a JSONL file, a tokenizer and a training run
    (save_every=1) over and over, alternating two versions, and is SIGKILLed at a random moment of that cycle; six
    times. Every file must then be the old or the new version, whole and verified (the digests)."""
    import random

    rng = random.Random(30)
    code = _WRITERS_CHILD.format(tests=str(Path(__file__).parent), folder=str(tmp))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # tiny models: one thread (and fork-safe workers)
    factory = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = factory.stdout.readline()
        assert line.startswith("ready"), f"the writer did not start: {line!r} {factory.stderr.read()[-800:]}"
        cycle = float(line.split()[1])
        for _ in range(6):
            factory.stdin.write("go\n")
            factory.stdin.flush()
            worker = int(factory.stdout.readline())
            time.sleep(rng.uniform(0.0, 2 * cycle))
            os.kill(worker, signal.SIGKILL)
            assert factory.stdout.readline().strip() == "reaped"
            _check_writer_files(tmp)
        factory.stdin.close()  # the factory leaves its loop and exits
        assert factory.wait(timeout=60) == 0, factory.stderr.read()[-800:]
        # the next save of each file removes what killed writers left (.NAME.<pid>.*.tmp, ckpt.pt.pending)
        from minimind_ref.chat_data import save_jsonl
        from minimind_ref.lora import save_lora
        from minimind_ref.tokenizer import save_tokenizer
        from minimind_ref.train import train

        v = _writer_versions()
        mm.save_checkpoint(v["model"][0], tmp / "ckpt.pt")
        save_lora(v["lora"][0], tmp / "adapter.pth")
        with _stage_dir(tmp):
            __import__("minimind_ref.stages").stages.save_stage(v["model"][0], "sft", {})
        save_jsonl(v["records"][0], tmp / "data.jsonl")
        save_tokenizer(v["tokenizer"][0], tmp / "tokenizer.json")
        train(_tiny_cfg(max_steps=1, eval_every=0, out_dir=str(tmp / "run")), data=v["data"], log=lambda s: None)
        left = [p.name for p in [*tmp.iterdir(), *(tmp / "run").iterdir()] if p.name.endswith((".tmp", ".pending"))]
        assert not left, f"left behind after the next saves: {left}"
    finally:
        if factory.poll() is None:
            factory.kill()
            factory.wait()
        for stream in (factory.stdin, factory.stdout, factory.stderr):
            stream.close()


# ---------------------------------------------------------------------- our own probe (post-training and persistence)
def _jsonl_file(tmp: Path, text: str) -> Path:
    return _write(tmp, "x.jsonl", text.encode("utf-8"))


def jsonl_bom_loads(tmp: Path) -> None:
    from minimind_ref.chat_data import load_jsonl

    assert load_jsonl(_jsonl_file(tmp, "\ufeff" + json.dumps(_records(1)[0]) + "\n")) == _records(1)


def jsonl_unserializable_keeps_file(tmp: Path) -> None:
    from minimind_ref.chat_data import load_jsonl, save_jsonl

    path = tmp / "x.jsonl"
    save_jsonl(_records(2), path)
    try:
        save_jsonl(_records(3) + [{"conversations": {1, 2}}], path)
    finally:
        assert load_jsonl(path) == _records(2), "the previous file must be intact"


def tokenizer_truncated(tmp: Path) -> None:
    from minimind_ref.tokenizer import load_tokenizer, save_tokenizer

    save_tokenizer(_course_tokenizer(), tmp / "t.json")
    data = (tmp / "t.json").read_bytes()
    (tmp / "t.json").write_bytes(data[: len(data) // 2])
    load_tokenizer(tmp / "t.json")


def checkpoint_of_a_lora_file(tmp: Path) -> None:
    from minimind_ref.lora import save_lora

    save_lora(_adapted(), tmp / "a.pth")
    mm.load_checkpoint(tmp / "a.pth")


def config_edited_by_hand(tmp: Path) -> None:
    """rope_theta 1e6 -> 1e7 in the stored config: loaded with other logits, no word (the weights digest passed)."""
    path = _saved(tmp)
    blob = torch.load(path, weights_only=True)
    blob["config"]["rope_theta"] = 1e7
    torch.save(blob, path)
    mm.load_checkpoint(path)


def stage_figures_edited_by_hand(tmp: Path) -> None:
    import minimind_ref.stages as stages

    path = _tiny_stage(tmp)
    blob = torch.load(path, weights_only=True)
    blob["extra"]["evaluate_chat"]["sum_accuracy"] = 0.99
    torch.save(blob, path)
    with _stage_dir(tmp):
        stages.recorded_rows(["sft"])


def stage_without_figures(tmp: Path) -> None:
    import minimind_ref.stages as stages

    with _stage_dir(tmp):
        stages.save_stage(_model(), "sft", {})
        stages.recorded_rows(["sft"])


def hf_config_not_json(tmp: Path) -> None:
    from minimind_ref.pretrained import load_hf_dir

    _write(tmp, "config.json", b"{not json")
    load_hf_dir(tmp)


def sft_some_without_reply(tmp: Path) -> None:
    from minimind_ref.sft import SFTDataset

    user_only = {"conversations": [{"role": "user", "content": "hi"}]}
    ds = _warned(lambda: SFTDataset([user_only] * 3 + [_chat("hi", "ok")], _course_tokenizer(), 256),
                 "3 of 4 conversations have no assistant reply")
    assert ds.no_reply == [0, 1, 2]


def dpo_side_without_reply(tmp: Path) -> None:
    from minimind_ref.dpo import DPODataset

    pair = _pair("hi", "yes", "no")
    pair["rejected"] = pair["rejected"][:1]
    DPODataset([pair], _course_tokenizer(), 128)


def train_out_dir_is_a_file(tmp: Path) -> None:
    from minimind_ref.train import train

    _write(tmp, "f", b"x")
    train(_tiny_cfg(max_steps=1, eval_every=0, out_dir=str(tmp / "f")), data=_tiny_data(), log=lambda s: None)


def train_stop_at_before_resume(tmp: Path) -> None:
    from minimind_ref.train import train

    run = tmp / "run"
    train(_tiny_cfg(max_steps=4, out_dir=str(run), eval_every=0), data=_tiny_data(), stop_at=3, log=lambda s: None)
    train(_tiny_cfg(max_steps=4, out_dir=str(run), eval_every=0, resume="auto"), data=_tiny_data(), stop_at=2,
          log=lambda s: None)


def train_out_dir_tilde(tmp: Path) -> None:
    from minimind_ref.train import train

    old = os.getcwd()
    os.chdir(tmp)
    try:
        with mock.patch.dict(os.environ, {"HOME": str(tmp / "home")}):
            train(_tiny_cfg(max_steps=1, eval_every=0, out_dir="~/run"), data=_tiny_data(), log=lambda s: None)
    finally:
        os.chdir(old)
    assert (tmp / "home" / "run" / "ckpt.pt").is_file() and not (tmp / "~").exists()


# ---------------------------------------------------------------------- our own probe, round two
def resume_from_pending(tmp: Path) -> None:
    """Killed right after the first periodic save (only ckpt.pt.pending exists): the run resumes from it (before this
    fix it started again from step 0 without a word)."""
    from minimind_ref.train import train

    run = tmp / "run"
    cfg = _tiny_cfg(max_steps=4, save_every=2, eval_every=0, out_dir=str(run))
    whole = train(cfg.replace(out_dir=None, save_every=0), data=_tiny_data(), log=lambda s: None)
    train(cfg, data=_tiny_data(), stop_at=2, log=lambda s: None)
    os.replace(run / "ckpt.pt", run / "ckpt.pt.pending")
    lines: List[str] = []
    resumed = train(cfg.replace(resume="auto"), data=_tiny_data(), log=lines.append)
    assert any("resumed from" in line and "at step 2" in line for line in lines), lines
    assert resumed.history["loss"] == whole.history["loss"]
    assert sorted(os.listdir(run)) == ["ckpt.pt", "tokenizer.json", "train_config.json"], os.listdir(run)


def _objective(fn: Callable[..., Any]) -> Callable[[Path], Any]:
    def run(tmp: Path) -> Any:
        from minimind_ref.train import train

        return train(_tiny_cfg(max_steps=1, eval_every=0), data=_tiny_data(), objective=fn, log=lambda s: None)
    return run


def train_cli_history_folder(tmp: Path) -> None:
    """--history naming a folder: a usage error before training (was an error after the whole run)."""
    from minimind_ref.train import config_from_args

    err = io.StringIO()
    with mock.patch("sys.stderr", err):
        try:
            config_from_args(["--config", "tiny_test", "--history", str(tmp)])
        except SystemExit as exit_info:
            assert exit_info.code == 2 and "is a folder" in err.getvalue(), (exit_info.code, err.getvalue())
            return
    raise AssertionError("no usage error")


def train_empty_dataset(tmp: Path) -> None:
    from minimind_ref.train import RunData, train

    class Empty:
        def __len__(self) -> int:
            return 0

    train(_tiny_cfg(max_steps=1, eval_every=0), model=tiny_model(vocab_size=300), data=RunData(_tiny_data().tokenizer,
          Empty()), log=lambda s: None)


CASES: List[Case] = [
    # ---- items 2-5: training settings, resume, divergence, batches without targets
    Case("TrainConfig: grad_clip=-1 (was gradient ascent)", _settings(grad_clip=-1), ValueError, "grad_clip=-1"),
    Case("TrainConfig: grad_clip=0 (was a frozen model)", _settings(grad_clip=0), ValueError, "0 would zero every update"),
    Case("TrainConfig: seq_len=1 (was NaN blamed on the lr)", _settings(seq_len=1), ValueError, "at least 2 tokens"),
    Case("TrainConfig: lr='abc'", _settings(lr="abc"), ValueError, "lr='abc'"),
    Case("TrainConfig: max_steps=0", _settings(max_steps=0), ValueError, "max_steps=0"),
    Case("train CLI: --set lr=abc -> usage error, exit 2", train_cli_bad_value, None),
    Case("train: resume='auto' without out_dir", train_resume_without_out_dir, ValueError, "out_dir is not set"),
    Case("train: resume with another model config -> run folder untouched", train_resume_other_model_touches_nothing,
         ValueError, "other settings"),
    Case("train: resume on other data", train_resume_other_data, ValueError, "training data differ"),
    Case("train: resume from a pickled payload", train_resume_pickled_payload, ValueError, "will not unpickle"),
    Case("train: lr=1e9, save_every=1 -> stops before the poisoned update", train_divergence, FloatingPointError, "not updated"),
    Case("train: a batch without supervised tokens is skipped and counted in the log", train_batch_without_targets, None),
    Case("dpo_loss: no masked token -> finite", dpo_loss_without_targets, None),
    Case("group_advantages: a group with equal rewards -> 0, not NaN", grpo_group_without_spread, None),
    Case("group_advantages: rewards not in whole groups", grpo_partial_groups,
         ValueError, "do not split into groups of num_generations=4"),
    Case("grpo_loss: negative beta", _grpo_loss(beta=-0.1), ValueError, "beta must be a number >= 0"),
    Case("grpo_loss: advantages of another batch", _grpo_loss(advantages=torch.zeros(3)), ValueError, "advantages must be [rows] = (2,)"),
    Case("grpo_loss: old log-probabilities of another batch", _grpo_loss(old_per_token_logps=torch.zeros(3, 3)),
         ValueError, "must have the same shape"),
    Case("grpo_loss: an unknown loss_type", _grpo_loss(loss_type="ppo"), ValueError, "loss_type must be one of"),
    # ---- item 1: saving is atomic
    Case("save_checkpoint: write fails half-way -> previous file intact, no temp file", save_fails_half_way, None),
    Case("save_checkpoint: process killed mid-write -> previous file intact", save_killed_half_way, None, slow=True),
    Case("save_checkpoint: a folder as the path", lambda tmp: mm.save_checkpoint(_model(), tmp), IsADirectoryError, "give a file name"),
    Case("save_checkpoint: not a MiniMind model", lambda tmp: mm.save_checkpoint(torch.nn.Linear(2, 2), tmp / "c.pt"), TypeError, "minimindforcausallm"),
    Case("save_checkpoint: DataParallel-wrapped model saves the inner model", save_wrapped_model, None),
    # ---- item 3 (checkpoint part): nothing non-finite is saved or silently loaded
    Case("save_checkpoint: NaN weight -> refused, previous file kept", save_nan_model_keeps_previous, ValueError, "model.layers.1.mlp.up_proj.weight"),
    Case("save_checkpoint: inf in an optimizer tensor in extra", save_nan_in_extra, ValueError, "extra['optimizer']['state'][0]['exp_avg']"),
    Case("load_checkpoint: NaN weights in the file (check_finite=False loads them)", load_nan_weights, ValueError, "non-finite"),
    # ---- item 5: no supervised token
    Case("loss: labels all -100 -> 0 with zero gradients (upstream: NaN)", loss_without_targets_is_zero, None),
    # ---- item 6: generation
    Case("generate: max_new_tokens=10**12 -> capped at max_position_embeddings, warns", generate_huge_max_new_tokens, None),
    Case("generate: reaching the position limit returns the tokens, warns", generate_reaches_position_limit, None),
    Case("generate: temperature=-1 without sampling", _gen(temperature=-1.0), ValueError, "temperature"),
    Case("generate: temperature=0 with sampling", _gen(do_sample=True, temperature=0.0), ValueError, "do_sample=false"),
    Case("generate: temperature=nan", _gen(do_sample=True, temperature=float("nan")), ValueError, "temperature"),
    Case("generate: temperature='0.7'", _gen(do_sample=True, temperature="0.7"), TypeError, "temperature"),
    Case("generate: top_k=2.5", _gen(do_sample=True, top_k=2.5), TypeError, "top_k must be an int"),
    Case("generate: top_k=-1", _gen(do_sample=True, top_k=-1), ValueError, "top_k must be >= 0"),
    Case("generate: top_p=0", _gen(do_sample=True, top_p=0.0), ValueError, "top_p"),
    Case("generate: top_p=1.5 without sampling", _gen(top_p=1.5), ValueError, "top_p"),
    Case("generate: repetition_penalty=0", _gen(repetition_penalty=0.0), ValueError, "repetition_penalty"),
    Case("generate: pad_token_id=-1 with eos", _gen(eos_token_id=2, pad_token_id=-1), ValueError, "pad_token_id=-1 is not a token id"),
    Case("generate: eos_token_id outside the vocabulary", _gen(eos_token_id=61), ValueError, "eos_token_id=61"),
    Case("generate: eos_token_id as a list", _gen(eos_token_id=[2, 0]), TypeError, "eos_token_id"),
    Case("generate: max_new_tokens=-1", lambda tmp: _model().generate(_ids(), max_new_tokens=-1), ValueError, "max_new_tokens"),
    Case("generate: max_new_tokens=2.5", lambda tmp: _model().generate(_ids(), max_new_tokens=2.5), TypeError, "max_new_tokens"),
    Case("generate: right padding with a mask", generate_right_padding, ValueError, "pad on the left"),
    Case("generate: mask holding 2", _gen(attention_mask=torch.full((2, 5), 2)), ValueError, "only 1 (token) and 0"),
    Case("generate: a row of padding only", _gen(attention_mask=torch.tensor([[1] * 5, [0] * 5])), ValueError, "padding only"),
    Case("generate: mask of the wrong shape", _gen(attention_mask=torch.ones(2, 4)), ValueError, "shaped like input_ids"),
    Case("generate: 1-D prompt", lambda tmp: _model().generate(_ids()[0], max_new_tokens=2), ValueError, "unsqueeze(0)"),
    Case("generate: prompt as a list", lambda tmp: _model().generate([[1, 2, 3]], max_new_tokens=2), TypeError, "torch.tensor of token ids"),
    Case("generate: left padding with a bool mask works", generate_left_padding_bool_mask, None),
    Case("sample_next_token: temperature=-1 with do_sample=False", _call(sample_next_token, torch.zeros(1, 5), do_sample=False, temperature=-1.0), ValueError, "temperature"),
    Case("next_token_logits: top_k=-3", _call(next_token_logits, torch.zeros(1, 5), top_k=-3), ValueError, "top_k"),
    Case("top_k_filter: top_k=2.5", _call(top_k_filter, torch.zeros(1, 5), 2.5), TypeError, "top_k"),
    # ---- item 7: special-token text typed by a user
    Case("encode_plain: '<|im_end|>' typed by a user stays text (round trip)", encode_plain_round_trip, None, needs="tokenizers"),
    Case("encode_plain: not a str", lambda tmp: _encode_plain()(_tokenizer(), 5), TypeError, "encodes a str", needs="tokenizers"),
    # ---- item 8: config
    Case("config: rope_scaling kwarg is ignored with a warning (derived from inference_rope_scaling)", config_rope_scaling_kwarg_warns, None),
    Case("config: head_dim disagreeing with hidden/heads", _call(mm.MiniMindConfig, head_dim=16), ValueError, "head_dim=16 disagrees"),
    Case("config: rope factor 0 in precompute_freqs_cis", _call(precompute_freqs_cis, 8, 4096, 1e6, {"factor": 0}), ValueError, "rope_scaling['factor'] must be > 0"),
    Case("config: negative rope factor in precompute_freqs_cis", _call(precompute_freqs_cis, 8, 4096, 1e6, {"factor": -2.0}), ValueError, "factor"),
    Case("config: rope factor 0 set on config.rope_scaling", config_rope_scaling_set_after, ValueError, "factor"),
    Case("config: rope_theta=nan", _call(mm.MiniMindConfig, rope_theta=float("nan")), ValueError, "rope_theta must be a finite number"),
    Case("config: rope_theta=inf", _call(mm.MiniMindConfig, rope_theta=float("inf")), ValueError, "rope_theta"),
    Case("config: rope_theta='1e6'", _call(mm.MiniMindConfig, rope_theta="1e6"), TypeError, "rope_theta must be a number"),
    Case("config: rope_theta=0.5", _call(mm.MiniMindConfig, rope_theta=0.5), ValueError, "rope_theta must be > 1"),
    Case("config: rms_norm_eps=None", _call(mm.MiniMindConfig, rms_norm_eps=None), TypeError, "rms_norm_eps must be a number"),
    Case("config: rms_norm_eps=-1e-5", _call(mm.MiniMindConfig, rms_norm_eps=-1e-5), ValueError, "rms_norm_eps must be positive"),
    Case("config: dropout='0.1'", _call(mm.MiniMindConfig, dropout="0.1"), TypeError, "dropout must be a number"),
    Case("config: flash_attn='false'", _call(mm.MiniMindConfig, flash_attn="false"), TypeError, "flash_attn must be true or false"),
    Case("config: inference_rope_scaling='yes'", _call(mm.MiniMindConfig, inference_rope_scaling="yes"), TypeError, "inference_rope_scaling"),
    Case("config: eos_token_id=-1", _call(mm.MiniMindConfig, eos_token_id=-1), ValueError, "eos_token_id"),
    Case("config: aux_loss_alpha=nan", _call(mm.MiniMindConfig, use_moe=True, aux_loss_alpha=float("nan")), ValueError, "aux_loss_alpha"),
    # ---- item 9: checkpoints
    Case("save_checkpoint: numpy scalars in extra are stored as Python numbers", extra_numpy_scalar, None),
    Case("save_checkpoint: numpy array in extra", lambda tmp: mm.save_checkpoint(_model(), tmp / "c.pt", extra={"a": np.zeros(3)}), TypeError, "extra['a'] is a numpy array"),
    Case("save_checkpoint: custom object in extra", lambda tmp: mm.save_checkpoint(_model(), tmp / "c.pt", extra={"h": [1, _Custom()]}), TypeError, "extra['h'][1]"),
    Case("save_checkpoint: extra not a dict", lambda tmp: mm.save_checkpoint(_model(), tmp / "c.pt", extra=[1]), TypeError, "extra must be a dict"),
    Case("infer_config: state dict without k_proj", _call(lambda: mm.infer_config(_without("k_proj"))), ValueError, "model.layers.0.self_attn.k_proj.weight"),
    Case("infer_config: state dict without gate_proj", _call(lambda: mm.infer_config(_without("gate_proj"), num_attention_heads=4)), ValueError, "model.layers.0.mlp.gate_proj.weight"),
    Case("infer_config: state dict without the embedding", _call(lambda: mm.infer_config(_without("embed_tokens"))), ValueError, "model.embed_tokens.weight"),
    Case("infer_config: 4-head model, no head count given -> asks for it", four_heads_needs_config, ValueError, "pass the model's num_attention_heads"),
    Case("infer_config: shapes that do not fit the given head count", _call(lambda: mm.infer_config(_state(), num_attention_heads=1)), ValueError, "do not fit num_attention_heads=1"),
    Case("load_checkpoint: 4-head model with its head count -> same logits", four_heads_with_config, None),
    Case("infer_config: upstream's layout (8 heads, 2 KV heads) is inferred", upstream_layout_inferred, None),
    Case("infer_config: top-1 MoE without num_experts_per_tok -> asks for it", top1_moe_needs_top_k, ValueError, "pass num_experts_per_tok"),
    Case("load_checkpoint: 0-byte file", lambda tmp: mm.load_checkpoint(_write(tmp, "e.pt", b"")), ValueError, "not a checkpoint: the file is empty"),
    Case("load_checkpoint: random bytes", lambda tmp: mm.load_checkpoint(_write(tmp, "r.pt", bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8)))), ValueError, "is not a checkpoint"),
    Case("load_checkpoint: a text file", lambda tmp: mm.load_checkpoint(_write(tmp, "t.pt", b"hello world\n")), ValueError, "is not a checkpoint"),
    Case("load_checkpoint: truncated checkpoint", truncated_checkpoint, ValueError, "is not a checkpoint"),
    Case("load_checkpoint: pickled payload (state dict) does not run", pickled_payload, ValueError, "will not unpickle"),
    Case("load_checkpoint: pickled payload (in extra) does not run", pickled_payload_course_format, ValueError, "will not unpickle"),
    Case("load_lora: pickled payload does not run", lora_pickled_payload, ValueError, "will not unpickle"),
    Case("load_lora: file from another model (hidden 64, rank 4)", lora_from_another_model, ValueError,
         "adapter 'model.layers.0.self_attn.q_proj.lora.a.weight' has shape (4, 64), the model's is (8, 32)"),
    Case("load_checkpoint: a folder", lambda tmp: mm.load_checkpoint(tmp), IsADirectoryError, "is a folder"),
    Case("load_checkpoint: missing file", lambda tmp: mm.load_checkpoint(tmp / "nope.pt"), FileNotFoundError, "no checkpoint at"),
    Case("load_checkpoint: config of the wrong type", lambda tmp: mm.load_checkpoint(_saved(tmp), config={"hidden_size": 32}), TypeError, "config must be a minimindconfig"),
    # ---- item 10: model inputs, caches, the HF converter
    Case("forward: batch of 0", _forward(input_ids=torch.zeros(0, 5, dtype=torch.long)), ValueError, "batch of 0"),
    Case("forward: int8 ids", _forward(input_ids=_ids().to(torch.int8)), TypeError, "torch.long"),
    Case("forward: uint8 ids", _forward(input_ids=_ids().to(torch.uint8)), TypeError, "torch.long"),
    Case("forward: float ids", _forward(input_ids=_ids().float()), TypeError, "forget .long()"),
    Case("forward: ids outside the vocabulary", _forward(input_ids=torch.full((1, 3), 61)), ValueError, "outside the vocabulary"),
    Case("forward: bool mask containing False works", bool_mask_with_false, None),
    Case("forward: mask of the wrong shape", _forward(attention_mask=torch.ones(2, 4)), ValueError, "attention_mask must have shape"),
    Case("forward: 4-D mask", _forward(attention_mask=torch.ones(2, 1, 5, 5)), ValueError, "attention_mask must have shape"),
    Case("forward: mask as a list", _forward(attention_mask=[[1] * 5] * 2), TypeError, "attention_mask must be a torch.tensor"),
    Case("forward: labels outside the vocabulary", _forward(labels=torch.full((2, 5), 61)), ValueError, "labels hold a value outside the vocabulary"),
    Case("forward: negative labels other than -100", _forward(labels=torch.full((2, 5), -1)), ValueError, "ignore index -100"),
    Case("forward: float labels", _forward(labels=torch.zeros(2, 5)), TypeError, "labels must hold integer token ids"),
    Case("forward: labels of another shape", _forward(labels=torch.zeros(2, 4, dtype=torch.long)), ValueError, "labels must have the shape"),
    Case("forward: logits_to_keep negative", _forward(logits_to_keep=-2), ValueError, "logits_to_keep must be >= 0"),
    Case("forward: logits_to_keep=1 with labels", _forward(logits_to_keep=1, labels=_ids()), ValueError, "pass logits_to_keep=0 with labels"),
    Case("forward: logits_to_keep=1.5", _forward(logits_to_keep=1.5), TypeError, "logits_to_keep must be an int"),
    Case("forward: cache from another batch size", cache_other_batch, ValueError, "batch of 2"),
    Case("forward: cache from another config", cache_other_config, ValueError, "num_key_value_heads"),
    Case("forward: cache in [batch, heads, seq, dim] layout", cache_hf_layout, ValueError, "transpose(1, 2)"),
    Case("forward: cache layers of unequal length", cache_unequal_layers, ValueError, "different lengths"),
    Case("forward: cache with a None layer", cache_missing_layer, ValueError, "past_key_values[1] is none"),
    Case("forward: cache with another number of layers", lambda tmp: _model()(_ids(2, 1), past_key_values=_cache(_model())[:1]), ValueError, "the model has 2 layers"),
    Case("forward: sequence longer than max_position_embeddings", _forward(input_ids=rand_ids(1, 65)), ValueError, "max_position_embeddings"),
    Case("from_hf_llama: a GPT-2 model", lambda tmp: _hf().from_hf_llama(_gpt2()), TypeError, "llamaforcausallm only", needs="transformers"),
    Case("to_hf_llama: not a MiniMind model", lambda tmp: _hf().to_hf_llama(torch.nn.Linear(2, 2)), TypeError, "minimindforcausallm", needs="transformers"),
]

# ======================================================================= train.py (the lead's)
# Rows for minimind_ref/train.py (issue 14 items 2, 3 and 4: resume validation, NaN before the
# optimizer step and the save, training-setting validation, the CLI) go here.
TRAIN_CASES: List[Case] = [
]
# ======================================================================= end of train.py rows

# ======================================================================= issue 30 (reliability, round two)
# Every case of the independent probe's report, and what our own probe of the same kinds found.
ROUND2_CASES: List[Case] = [
    # ---- every file is written atomically; a full disk says which file and that the old one is intact
    Case("save_checkpoint: disk full -> OSError naming the file, previous file intact", disk_full_checkpoint,
         OSError, "the disk is full"),
    Case("save_jsonl: disk full -> OSError, previous file intact", disk_full_jsonl, OSError, "previous file"),
    Case("save_jsonl: killed half-way over a 20,000-record file -> the old file whole", jsonl_killed_half_way, None,
         slow=True),
    Case("save_checkpoint('~/x.pt') / save_jsonl('~/d.jsonl') write into the home folder", tilde_path_is_home, None),
    Case("every writer (checkpoint, LoRA, stage, JSONL, tokenizer, train save_every=1) SIGKILLed at 6 random moments "
         "-> old or new file, whole and verified", every_writer_killed_at_random_moments, None, slow=True, needs="tokenizers"),
    # ---- checkpoints and stage files carry a digest of their weights; one validation path for every loader
    Case("load_checkpoint: one flipped bit in a weight -> damaged (digest)", flipped_bit_checkpoint, ValueError, "is damaged"),
    Case("load_checkpoint: a tensor zeroed by hand (torch.load/torch.save) -> damaged", edited_by_hand_checkpoint,
         ValueError, "do not match the sha-256 digest"),
    Case("load_checkpoint: a file without a digest (older course file) loads", checkpoint_without_digest_loads, None),
    Case("train: resume from a ckpt.pt with a flipped bit", resume_flipped_bit, ValueError, "cannot resume"),
    Case("load_pth: an inf weight (was NaN logits)", load_pth_inf, ValueError, "non-finite weights"),
    Case("load_hf_dir: an inf weight (was NaN logits)", load_hf_dir_inf, ValueError, "non-finite weights", needs="safetensors"),
    Case("load_pth: a pickled payload (was 'an interrupted download')", load_pth_pickle, ValueError, "will not unpickle"),
    Case("load_pretrained: a 300-token tokenizer with a 400-token model", load_pretrained_other_tokenizer, ValueError,
         "vocabulary of 400 tokens but the tokenizer has 300", needs="tokenizers"),
    Case("report --recorded: stage weights zeroed by hand (was the recorded 0.74)", stage_zeroed_by_hand, ValueError,
         "is damaged"),
    Case("report --recorded: stage re-saved with new weights and the old figures", stage_resaved_with_old_metadata,
         ValueError, "measured on other weights"),
    Case("stage_metadata: a truncated stage file (was a raw zip error)", stage_truncated, ValueError, "is not a checkpoint"),
    Case("save_stage: a weight beyond float16's range (was blamed on divergence)", stage_fp16_overflow, ValueError,
         "beyond float16's range"),
    Case("shipped stage files carry a digest that verifies", shipped_stages_verify, None),
    # ---- truncation is counted where it happens (dataset warning, training log); all-skipped runs are errors
    Case("SFTDataset: 3 of 4 prompts longer than max_length -> counted, warned, drop_truncated", sft_prompts_too_long,
         None, needs="tokenizers"),
    Case("SFTDataset: an answer cut mid-way (no <|im_end|>) -> counted, warned", sft_answer_cut, None, needs="tokenizers"),
    Case("SFTDataset: no supervised token at all", sft_nothing_supervised, ValueError, "is supervised", needs="tokenizers"),
    Case("SFTDataset: nothing cut -> no warning", sft_fits_no_warning, None, needs="tokenizers"),
    Case("train: truncated training data -> a note in the training log", train_log_reports_truncation, None,
         needs="tokenizers"),
    Case("train: every step skipped (no supervised token) -> error (was: returned, weights unchanged)",
         train_every_batch_without_targets, ValueError, "every one of the 2 steps was skipped"),
    Case("DPODataset: pairs cut to nothing (was a constant log 2) -> counted, warned, drop_truncated",
         dpo_pairs_cut_to_nothing, None, needs="tokenizers"),
    Case("DPODataset: chosen == rejected -> error (a design choice: no preference in it)", dpo_chosen_is_rejected,
         ValueError, "states no preference", needs="tokenizers"),
    # ---- GRPO rewards and settings are checked (were 'the loss is nan ... lower the learning rate' or torch errors)
    Case("GRPOObjective: a NaN reward", _grpo_step(reward_fn=lambda reply, answer: float("nan")), ValueError,
         "rewards must be finite", needs="tokenizers"),
    Case("GRPOObjective: an inf reward", _grpo_step(reward_fn=lambda reply, answer: float("inf")), ValueError,
         "returned inf", needs="tokenizers"),
    Case("GRPOObjective: a reward of None", _grpo_step(reward_fn=lambda reply, answer: None), TypeError,
         "it must return a number", needs="tokenizers"),
    Case("GRPOObjective: a reward '1' (a string)", _grpo_step(reward_fn=lambda reply, answer: "1"), TypeError,
         "returned '1' (str)", needs="tokenizers"),
    Case("GRPOObjective: a bool reward counts as 0/1", lambda tmp: _grpo_step(reward_fn=lambda r, a: r == a)(tmp), None,
         needs="tokenizers"),
    Case("GRPOObjective: beta=inf", _grpo_step(beta=float("inf")), ValueError, "beta must be a number >= 0 and finite",
         needs="tokenizers"),
    Case("GRPOObjective: max_new_tokens=0", _grpo_step(max_new_tokens=0), ValueError, "max_new_tokens must be an int >= 1",
         needs="tokenizers"),
    Case("GRPOObjective: temperature=0", _grpo_step(temperature=0.0), ValueError, "temperature must be a finite number > 0",
         needs="tokenizers"),
    Case("grpo_loss: beta=inf", _grpo_loss(beta=float("inf")), ValueError, "beta must be a number >= 0 and finite"),
    Case("group_advantages: a NaN reward", _call(lambda: __import__("minimind_ref.grpo").grpo.group_advantages(torch.tensor([1.0, float("nan")]), 2)),
         ValueError, "rewards must be finite"),
    # ---- the policy as its own reference is refused before anything changes (a design choice: no silent copy)
    Case("train_dpo(model, ref_model=model) -> refused, the model not frozen", _policy_as_reference("dpo"), ValueError,
         "ref_model is the policy itself", needs="tokenizers"),
    Case("train_grpo(model, ref_model=model) -> refused, the model not frozen", _policy_as_reference("grpo"), ValueError,
         "ref_model is the policy itself", needs="tokenizers"),
    # ---- divergence: no checkpoint of destroyed weights, and the advice given works
    Case("train: lr=1e9, save_every=1 -> no checkpoint of destroyed weights kept (was step 1, |w| 1e9)",
         diverged_keeps_no_destroyed_checkpoint, FloatingPointError, "no checkpoint of this run is kept"),
    Case("train: diverged after a good checkpoint -> named; resume with a lower lr works (was refused)",
         diverged_then_resume_lower_lr, None),
    Case("train: a finite loss blow-up (lr=10: 5.9 -> 1,172) -> a warning in the log", loss_blowup_warns, None),
    # ---- still silent from round one
    Case("train_step: max_grad_norm=-1 (was gradient ascent)", _train_step(-1), ValueError, "max_grad_norm=-1 is invalid"),
    Case("train_step: max_grad_norm=0", _train_step(0), ValueError, "0 would zero every update"),
    Case("train_step: max_grad_norm=None (no clipping) works", _train_step(None), None),
    Case("encode_documents: a literal '<|im_end|>' stays text (was the end-of-sequence id)", encode_documents_literal_marker,
         None, needs="tokenizers"),
    Case("save/load_checkpoint: a hand-set rope_scaling survives (logits were off by 0.19)", rope_scaling_round_trip, None),
    Case("to_hf_llama -> from_hf_llama keeps dropout and flash_attn", hf_round_trip_keeps_dropout, None,
         needs="transformers"),
    # ---- our own probe of the same kinds of input (post-training and persistence)
    Case("load_jsonl: a JSON array on a line (records came back as lists)", lambda tmp: mm.chat_data.load_jsonl(
        _jsonl_file(tmp, json.dumps(_records(1)) + "\n")), ValueError, "not an object"),
    Case("load_jsonl: a file starting with a byte-order mark loads", jsonl_bom_loads, None),
    Case("save_jsonl: a record that is not JSON -> names it, previous file intact", jsonl_unserializable_keeps_file,
         TypeError, "record 3 cannot be written as json"),
    Case("load_tokenizer: a truncated tokenizer.json (was a bare Exception)", tokenizer_truncated, ValueError,
         "is not a valid tokenizer.json", needs="tokenizers"),
    Case("load_checkpoint: a save_lora file", checkpoint_of_a_lora_file, ValueError, "holds lora adapters only"),
    Case("load_checkpoint: the config edited by hand (rope_theta 1e6 -> 1e7, loaded silently)", config_edited_by_hand,
         ValueError, "its config or metadata do not match"),
    Case("report --recorded: a stage's figures edited by hand (reported silently)", stage_figures_edited_by_hand,
         ValueError, "is damaged"),
    Case("report --recorded: a stage file without figures (was KeyError 'evaluate_chat')", stage_without_figures,
         ValueError, "records no evaluate_chat figures"),
    Case("load_hf_dir: config.json that is not JSON (no file name)", hf_config_not_json, ValueError,
         "is not a valid config.json"),
    Case("SFTDataset: 3 of 4 conversations without an assistant reply -> warned", sft_some_without_reply, None,
         needs="tokenizers"),
    Case("SFTDataset: max_length=2.5 (was a slice TypeError)", lambda tmp: mm.sft.SFTDataset([_chat("hi", "ok")],
         _course_tokenizer(), 2.5), ValueError, "max_length must be a whole number", needs="tokenizers"),
    Case("DPODataset: max_length='256'", lambda tmp: mm.dpo.DPODataset([_pair("hi", "a", "b")], _course_tokenizer(),
         "256"), ValueError, "max_length must be a whole number", needs="tokenizers"),
    Case("DPODataset: a rejected side without an assistant reply (mask 0, silent)", dpo_side_without_reply, ValueError,
         "the rejected conversation has no assistant reply", needs="tokenizers"),
    Case("dpo_loss: a mask holding 2 (silently a weight)", _call(lambda: mm.dpo.dpo_loss(torch.zeros(2, 3), torch.zeros(2, 3),
         torch.full((2, 3), 2.0), 0.1)), ValueError, "mask must hold 0 and 1 only"),
    Case("RLPromptDataset: conversations that are a string (was AttributeError)", _call(lambda: mm.grpo.RLPromptDataset(
         [{"conversations": "hello"}])), ValueError, "record 0 must be"),
    Case("train: out_dir is a file (was FileExistsError)", train_out_dir_is_a_file, ValueError, "is a file, not a folder"),
    Case("train: stop_at=-1 (returned 'step -1')", lambda tmp: __import__("minimind_ref.train").train.train(
         _tiny_cfg(eval_every=0), data=_tiny_data(), stop_at=-1), ValueError, "stop_at=-1 is invalid"),
    Case("train: stop_at before the resumed step (returned silently)", train_stop_at_before_resume, ValueError,
         "stop_at=2 is not after step 3"),
    Case("train: out_dir='~/run' is in the home folder", train_out_dir_tilde, None),
    Case("train: only ckpt.pt.pending left by a kill -> resumes from it (was: from step 0)", resume_from_pending, None),
    Case("train CLI: --history <a folder> -> usage error before training", train_cli_history_folder, None),
    Case("train: an empty training dataset (was ZeroDivisionError)", train_empty_dataset, ValueError,
         "the training dataset is empty"),
    Case("train: an objective returning a float", _objective(lambda m, b: 1.0), TypeError, "must return a dict with 'loss'"),
    Case("train: an objective without 'loss' (was KeyError)", _objective(lambda m, b: {"value": m(b[0], labels=b[1]).loss}),
         TypeError, "must return a dict with 'loss'"),
    Case("train: an objective's loss without gradient (was a torch RuntimeError)",
         _objective(lambda m, b: {"loss": m(b[0], labels=b[1]).loss.detach()}), ValueError, "carries no gradient"),
    Case("train: resume=<a folder> (was 'no such checkpoint file')", lambda tmp: __import__("minimind_ref.train").train.train(
         _tiny_cfg(resume=str(tmp)), data=_tiny_data()), IsADirectoryError, "give the checkpoint file in it"),
    Case("load_checkpoint: dtype=torch.int64 (weights truncated to integers silently)", lambda tmp: mm.load_checkpoint(
         _saved(tmp), dtype=torch.int64), TypeError, "floating-point torch.dtype"),
    Case("load_lora: a lora_scale entry of 3 numbers", lambda tmp: _lora_scale_entry(tmp, torch.ones(3)), ValueError,
         "its lora_scale entry must be one finite number"),
    # ---- LoRA
    Case("save_checkpoint: unmerged LoRA adapters (was a file load_checkpoint could not read)",
         lambda tmp: mm.save_checkpoint(_adapted(), tmp / "c.pt"), ValueError, "unmerged lora adapters"),
    Case("load_checkpoint: an older file with unmerged adapters -> the hint names them (was: 'fix hidden_size')",
         lora_old_checkpoint, ValueError, "the file holds unmerged lora adapters"),
    Case("train: a LoRA run saves its adapters in ckpt.pt and resumes", lora_run_saves_and_resumes, None),
    Case("apply_lora: scale=0 (trained nothing, no word)", _call(lambda: mm.lora.apply_lora(tiny_model(), rank=4, scale=0)),
         ValueError, "scale=0 switches the adapters off"),
    Case("load_lora: a file saved with scale 1 into adapters of scale 2 (logits changed silently)", lora_other_scale,
         ValueError, "was trained with scale 1.0"),
    Case("save_lora/load_lora: scale 2 is recorded and reloads exactly", lora_scale_round_trip, None),
    # ---- DPO pairing
    Case("concat_pairs: 1 chosen row and 3 rejected rows (was paired wrongly)", dpo_one_chosen_three_rejected, ValueError,
         "one row per pair"),
]


# ====================================================================== issue 38: reliability, round three
# The ``probe`` column: whether an independent probe agrees with the row. The rows of the cases issue 38's
# probe reported are marked with what it found before the fix (SILENT or UNCLEAR); the row asserts the fix,
# and agreement awaits the probe's next run. Every other row: not yet probed.
_SILENT38 = "disagreed (issue 38: SILENT); fixed, not yet re-probed"
_UNCLEAR38 = "disagreed (issue 38: UNCLEAR); fixed, not yet re-probed"
NOT_PROBED = "not yet probed"
#: The values of the ``probe`` column. Issue 38's probe re-ran its own 155 cases of round two, not these rows one by
#: one (it gives counts, not per-row verdicts), so a row it did not name stays "not yet probed".
PROBE_VALUES = (NOT_PROBED, _SILENT38, _UNCLEAR38)


# ---------------------------------------------------------------------- items 1-2: one rule for tied heads
def _untied_minimind2() -> mm.MiniMindForCausalLM:
    torch.manual_seed(0)
    return mm.MiniMindForCausalLM(mm.MiniMindConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=8,
                                                    num_key_value_heads=2, vocab_size=61,
                                                    tie_word_embeddings=False)).eval()


def untied_bare_state_dict(tmp: Path) -> None:
    """A MiniMind2 model with its own head, saved as a bare state dict (was: loaded tied, the head replaced by the
    embedding, logits off by 2.5-3.1)."""
    m = _untied_minimind2()
    torch.save(m.state_dict(), tmp / "untied.pt")
    back = mm.load_checkpoint(tmp / "untied.pt")
    assert not back.config.tie_word_embeddings
    with torch.no_grad():
        torch.testing.assert_close(back(_ids()).logits, m(_ids()).logits, rtol=0, atol=0)


def _changed_head_pth(tmp: Path, generation: str) -> Path:
    """An upstream-style fp16 .pth of a tied model (both tied keys stored) whose head copy differs in one value."""
    kw = dict(generation="minimind-3") if generation == "minimind-3" else dict(num_attention_heads=8, num_key_value_heads=2)
    torch.manual_seed(0)
    m = mm.MiniMindForCausalLM(mm.MiniMindConfig(hidden_size=64, num_hidden_layers=2, vocab_size=200, **kw))
    state = {k: v.detach().clone().half() for k, v in m.state_dict().items()}
    state["lm_head.weight"][0, 0] += 1
    torch.save(state, tmp / "full_sft_64.pth")
    return tmp / "full_sft_64.pth"


def _load_pth(generation: str, **kw: Any) -> Callable[[Path], Any]:
    from minimind_ref.pretrained import load_pth

    return lambda tmp: load_pth(_changed_head_pth(tmp, generation), **kw)


def changed_head_forced_tied(tmp: Path) -> None:
    """The way out the error names: tie_word_embeddings=True loads it tied, with a warning that the head is dropped."""
    from minimind_ref.pretrained import load_pth

    path = _changed_head_pth(tmp, "minimind-3")
    m = _warned(lambda: load_pth(path, tie_word_embeddings=True), "stored head is dropped")
    assert m.lm_head.weight is m.model.embed_tokens.weight
    m = load_pth(path, tie_word_embeddings=False)
    stored = torch.load(path, weights_only=True)
    assert m.lm_head.weight is not m.model.embed_tokens.weight
    assert torch.equal(m.lm_head.weight, stored["lm_head.weight"].float())


def tied_config_with_own_head(tmp: Path) -> None:
    """A bare state dict of an untied model loaded with a config that says tied (the default)."""
    torch.save(_untied_minimind2().state_dict(), tmp / "untied.pt")
    mm.load_checkpoint(tmp / "untied.pt", config=_untied_minimind2().config.replace(tie_word_embeddings=True))


def tied_hf_folder_with_own_head(tmp: Path) -> None:
    """config.json says tied, the stored head differs (transformers would drop the head without a word)."""
    import json as _json

    from minimind_ref.pretrained import load_hf_dir

    sys.path.insert(0, str(Path(__file__).parent))
    import _upstream_files as U

    m = _untied_minimind2()
    folder = tmp / "hf"
    folder.mkdir()
    raw = U.minimind_config_json(m.config.replace(tie_word_embeddings=True))
    raw["tie_word_embeddings"] = True
    (folder / "config.json").write_text(_json.dumps(raw), encoding="utf-8")
    torch.save(m.state_dict(), folder / "pytorch_model.bin")
    load_hf_dir(folder)


def strict_load_tied_keys_differ(tmp: Path) -> None:
    state = _untied_minimind2().state_dict()
    mm.load_state_dict_strict(mm.MiniMindForCausalLM(_untied_minimind2().config.replace(tie_word_embeddings=True)), state)


# ---------------------------------------------------------------------- items 3-5: GRPO and DPO inputs, masks
def _grpo_adv(**kw: Any) -> Callable[[Path], Any]:
    return lambda tmp: mm.grpo.group_advantages(torch.tensor([1.0, 0.0, 1.0, 1.0]), 2, **kw)


def _masked_bad(value: float, which: str) -> Callable[[Path], Any]:
    """A NaN or -inf at a position the mask leaves out: the loss and its gradient stay finite (were NaN)."""

    def run(tmp: Path) -> None:
        mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
        lp = torch.randn(2, 3, generator=torch.Generator().manual_seed(0))
        ref = lp - 0.1
        bad_lp = lp.clone()
        bad_lp[1, 2] = value
        bad_lp.requires_grad_(True)
        bad_ref = ref.clone()
        bad_ref[0, 2] = value
        if which == "dpo":
            loss = mm.dpo.dpo_loss(bad_ref, bad_lp, mask, 0.1)
            clean = mm.dpo.dpo_loss(ref, lp, mask, 0.1)
        else:
            args = (torch.tensor([1.0, -1.0]), mask, 0.1)
            loss = mm.grpo.grpo_loss(bad_lp, bad_lp.detach().clone(), bad_ref, *args)
            clean = mm.grpo.grpo_loss(lp, lp.clone(), ref, *args)
        loss.backward()
        torch.testing.assert_close(loss.detach(), clean, rtol=0, atol=0)
        assert torch.isfinite(bad_lp.grad).all() and float(bad_lp.grad[1, 2]) == 0.0, bad_lp.grad
    return run


class _NaNOutsideTheMask(torch.nn.Module):
    """A reference model whose logits are NaN at the first position of every row (a prompt token, which the DPO
    mask leaves out)."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor, **kw: Any) -> Any:
        out = self.inner(x, **kw)
        logits = out.logits.clone()
        logits[:, 0] = float("nan")
        out.logits = logits
        return out


def dpo_training_nan_outside_the_mask(tmp: Path) -> None:
    """DPO training whose reference gives NaN where the mask excludes: the run trains (was: 'the loss is nan ...
    lower the learning rate')."""
    from minimind_ref.dpo import DPODataset, train_dpo
    from minimind_ref.train import RunData

    tok = _course_tokenizer()
    vocab = tok.get_vocab_size()
    pairs = [_pair(f"what is {i}+1?", f"{i + 1}", f"{i + 2}") for i in range(4)]
    data = RunData(tok, DPODataset(pairs, tok, 64), None, [])
    policy = tiny_model(vocab_size=vocab, max_position_embeddings=128).train()
    ref = _NaNOutsideTheMask(tiny_model(vocab_size=vocab, max_position_embeddings=128)).eval()
    result = train_dpo(policy, tok, _tiny_cfg(max_steps=2, batch_size=2, eval_every=0, seq_len=64), ref_model=ref,
                       data=data, log=lambda s: None)
    assert all(math.isfinite(v) for v in result.history["loss"]), result.history["loss"]


def dpo_training_nan_reference(tmp: Path) -> None:
    """A reference whose every logit is NaN: an error that names the reference, not the learning rate."""
    from minimind_ref.dpo import DPODataset, train_dpo
    from minimind_ref.train import RunData

    tok = _course_tokenizer()
    vocab = tok.get_vocab_size()
    data = RunData(tok, DPODataset([_pair("hi", "a", "b"), _pair("yo", "c", "d")], tok, 64), None, [])
    ref = tiny_model(vocab_size=vocab, max_position_embeddings=128)
    with torch.no_grad():
        ref.model.norm.weight.fill_(float("nan"))
    train_dpo(tiny_model(vocab_size=vocab, max_position_embeddings=128).train(), tok,
              _tiny_cfg(max_steps=1, batch_size=2, eval_every=0, seq_len=64), ref_model=ref, data=data, log=lambda s: None)


# ---------------------------------------------------------------------- items 6-7: records and their commands
def _record_copies(tmp: Path) -> Tuple[Path, Path]:
    import shutil

    from minimind_ref import lora, posttrain_experiments as px

    shutil.copy(px.RECORD_FILE, tmp / "record.json")
    shutil.copy(lora.SWEEP_FILE, tmp / "sweep.json")
    return tmp / "record.json", tmp / "sweep.json"


def merge_sweep_record(tmp: Path) -> None:
    """posttrain_experiments --merge of the LoRA sweep record (was: exit 0, 7 sweep runs added, command overwritten)."""
    from minimind_ref import posttrain_experiments as px

    record, sweep = _record_copies(tmp)
    before = record.read_bytes()
    try:
        px.main(["--out", str(record), "--merge", str(sweep)])
    finally:
        assert record.read_bytes() == before, "the record must be left as it was"


def merge_keeps_command(tmp: Path) -> None:
    """Merging a record of this command keeps the record's own command (the part's is not copied)."""
    import json as _json

    from minimind_ref import posttrain_experiments as px

    record, _ = _record_copies(tmp)
    part = _json.loads(record.read_text(encoding="utf-8"))
    part["torch"] = "9.9"
    (tmp / "part.json").write_text(_json.dumps(part), encoding="utf-8")
    px.main(["--out", str(tmp / "merged.json"), "--merge", str(record), str(tmp / "part.json")])
    merged = px.load_record(tmp / "merged.json")
    assert merged["command"] == px.COMMAND and merged["torch"] == "9.9" and merged["runs"] == part["runs"]


def _usage_error(fn: Callable[[], Any], fragment: str) -> None:
    err = io.StringIO()
    with mock.patch("sys.stderr", err):
        try:
            fn()
        except SystemExit as exit_info:
            assert exit_info.code == 2 and fragment in err.getvalue(), (exit_info.code, err.getvalue())
            return
    raise AssertionError("no usage error")


def _nothing_trains() -> Any:
    """Any attempt to load the sft stage (what every run does first) fails the row: the check must come before."""
    import minimind_ref.stages as stages

    def load_stage(*a: Any, **k: Any) -> None:
        raise AssertionError("a run started before the bad --out was refused")

    return mock.patch.object(stages, "load_stage", load_stage)


def px_out_folder(tmp: Path) -> None:
    from minimind_ref import posttrain_experiments as px

    with _nothing_trains():
        _usage_error(lambda: px.main(["grpo_recipe", "--out", str(tmp)]), "is a folder")
        _usage_error(lambda: px.main(["grpo_recipe", "--out", str(_write(tmp, "f", b"x") / "r.json")]),
                     "is a file, not a folder")
        _usage_error(lambda: px.main(["--out", str(tmp), "--merge", str(_record_copies(tmp)[0])]), "is a folder")


def sweep_out_folder(tmp: Path) -> None:
    from minimind_ref import lora

    with _nothing_trains():
        _usage_error(lambda: lora.main(["sweep", "--seeds", "0", "--out", str(tmp)]), "is a folder")
        _usage_error(lambda: lora.main(["sweep", "--seeds", "0,x"]), "give comma-separated distinct seeds")
        _usage_error(lambda: lora.main(["sweep", "--seeds", "1,1"]), "repeat a seed")
        lora.rank_sweep([0], out=str(tmp))


def sweep_disk_full_keeps_record(tmp: Path) -> None:
    """rank_sweep writes its record atomically (was a plain open-and-write): a full disk leaves the previous one."""
    import json as _json

    import minimind_ref.stages as stages
    from minimind_ref import lora

    _, sweep = _record_copies(tmp)
    before = sweep.read_bytes()
    metrics = {k: 0.5 for k in lora.SWEEP_METRICS}
    with mock.patch.object(stages, "load_stage", lambda name: (tiny_model(), None)), \
            mock.patch.object(lora, "train_lora", lambda *a, **k: None), \
            mock.patch.object(stages, "evaluate_chat", lambda *a, **k: metrics):
        record = lora.rank_sweep([0], out=str(sweep), log=lambda s: None)  # the whole sweep, instantly
        assert _json.loads(sweep.read_text(encoding="utf-8")) == _json.loads(_json.dumps(record))
        sweep.write_bytes(before)
        try:
            with _disk_full():
                lora.rank_sweep([0], out=str(sweep), log=lambda s: None)
        except OSError as err:
            assert "previous file" in str(err) and sweep.read_bytes() == before, str(err)
            _no_temp_files(tmp, ["record.json", "sweep.json"])
            raise


_RECORD_KILL_CHILD = """
import os, signal, sys
from unittest import mock
import minimind_ref.files as files
from minimind_ref import posttrain_experiments as px

real_replace = os.replace
def replace(src, dst):  # the merged record is written, synced, and then the writer dies before the rename
    os.kill(os.getpid(), signal.SIGKILL)
with mock.patch.object(files.os, "replace", replace):
    px.main(["--out", {out!r}, "--merge", {part!r}])
"""


def record_merge_killed(tmp: Path) -> None:
    """posttrain_experiments --merge SIGKILLed just before its rename: the previous record is whole."""
    import json as _json

    from minimind_ref import posttrain_experiments as px

    record, _ = _record_copies(tmp)
    part = _json.loads(record.read_text(encoding="utf-8"))
    part["runs"] = {"grpo_recipe": part["runs"]["grpo_recipe"]}
    part["runs"]["grpo_recipe"]["seconds"] = -1.0
    (tmp / "part.json").write_text(_json.dumps(part), encoding="utf-8")
    before = record.read_bytes()
    code = _RECORD_KILL_CHILD.format(out=str(record), part=str(tmp / "part.json"))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, f"the child should be killed mid-write: {proc.returncode} {proc.stderr[-500:]}"
    assert record.read_bytes() == before and px.load_record(record)
    px.main(["--out", str(record), "--merge", str(tmp / "part.json")])  # the next write removes the killed one's temporary
    assert px.load_record(record)["runs"]["grpo_recipe"]["seconds"] == -1.0
    assert sorted(p.name for p in tmp.iterdir()) == ["part.json", "record.json", "sweep.json"], list(tmp.iterdir())


# ---------------------------------------------------------------------- item 9: old silent cases
def generate_nan_weights(tmp: Path) -> None:
    m = tiny_model()
    with torch.no_grad():
        m.model.layers[0].mlp.up_proj.weight.fill_(float("nan"))
    m.generate(_ids(), max_new_tokens=4)


def generate_nan_later(tmp: Path) -> None:
    """Logits that turn NaN after the prompt (a hook from the second step on): caught once, at the end."""
    m = tiny_model()
    calls = []

    def hook(module: Any, args: Any, out: Any) -> Any:
        calls.append(1)
        return out * float("nan") if len(calls) > 1 else out

    m.lm_head.register_forward_hook(hook)
    m.generate(_ids(), max_new_tokens=4)


def merge_lora_square_tied_head(tmp: Path) -> None:
    """A square head tied to the embedding (vocab == hidden) gets an adapter, as upstream adapts every square Linear:
    merging unties it (warning) and leaves the embedding as it was (was: the embedding changed too)."""
    from minimind_ref.lora import apply_lora, merge_lora

    torch.manual_seed(0)
    m = mm.MiniMindForCausalLM(mm.MiniMindConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                                num_key_value_heads=2, vocab_size=32)).eval()
    apply_lora(m, rank=2)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if ".lora.B." in name:
                p.normal_(0, 0.1)
    embed, ids = m.model.embed_tokens.weight.detach().clone(), torch.randint(0, 32, (2, 6))
    with torch.no_grad():
        adapted = m(ids).logits
    _warned(lambda: merge_lora(m), "the merged model is untied")
    assert not m.config.tie_word_embeddings and torch.equal(m.model.embed_tokens.weight, embed)
    with torch.no_grad():
        torch.testing.assert_close(m(ids).logits, adapted, rtol=1e-5, atol=1e-5)  # what the adapted model computed


def _upstream_tokenizer() -> Any:
    from minimind_ref.pretrained import load_tokenizer_dir

    sys.path.insert(0, str(Path(__file__).parent))
    import _upstream_files as U

    folder = Path(tempfile.mkdtemp(prefix="minimind_tok_"))
    try:
        U.write_tokenizer(folder)
        return load_tokenizer_dir(folder)
    finally:
        import shutil

        shutil.rmtree(folder)


# ---------------------------------------------------------------------- item 10: files named when they are bad
def _sharded_folder(tmp: Path, index: str) -> Path:
    from minimind_ref.pretrained import load_hf_dir

    sys.path.insert(0, str(Path(__file__).parent))
    import _upstream_files as U

    folder = U.save_llama_dir(_model(), tmp / "hf", weights="safetensors", with_tokenizer=False)
    (folder / "model.safetensors").rename(folder / "model-00001-of-00001.safetensors")
    (folder / "model.safetensors.index.json").write_text(index, encoding="utf-8")
    return load_hf_dir(folder)


def tokenizer_config_corrupt(tmp: Path) -> None:
    from minimind_ref.pretrained import tokenizer_folder_generation

    sys.path.insert(0, str(Path(__file__).parent))
    import _upstream_files as U

    U.write_tokenizer(tmp)
    (tmp / "tokenizer_config.json").write_text('{"added_tokens_decoder": {', encoding="utf-8")
    tokenizer_folder_generation(tmp)


def _latin1(tmp: Path, name: str, text: str) -> Path:
    return _write(tmp, name, text.encode("latin-1"))


# ---------------------------------------------------------------------- our own probe of round three
def _px_merge_with_names(tmp: Path) -> None:
    from minimind_ref import posttrain_experiments as px

    record, _ = _record_copies(tmp)
    _usage_error(lambda: px.main(["grpo_recipe", "--out", str(tmp / "o.json"), "--merge", str(record)]),
                 "--merge runs nothing")
    assert not (tmp / "o.json").exists()


def _tie_string_folder(tmp: Path) -> Any:
    import json as _json

    from minimind_ref.pretrained import load_hf_dir

    sys.path.insert(0, str(Path(__file__).parent))
    import _upstream_files as U

    folder = U.save_minimind_dir(_model(), tmp / "hf", with_tokenizer=False)
    raw = _json.loads((folder / "config.json").read_text(encoding="utf-8"))
    raw["tie_word_embeddings"] = "false"
    (folder / "config.json").write_text(_json.dumps(raw), encoding="utf-8")
    return load_hf_dir(folder)


def _tied_pth(tmp: Path) -> Path:
    sys.path.insert(0, str(Path(__file__).parent))
    import _upstream_files as U

    return U.save_pth(_model(), tmp, name="full_sft_32.pth")


ROUND3_CASES: List[Case] = [
    # ---- items 1-2: one rule for tied and untied heads, every loader, both generations (tests/test_head_tying.py)
    Case("load_checkpoint: MiniMind2 with its own head as a bare state dict -> untied, same logits (was tied)",
         untied_bare_state_dict, None, probe=_SILENT38),
    Case("load_pth: minimind-3 tied .pth, head changed in 1 value -> asks for tie_word_embeddings (was untied)",
         _load_pth("minimind-3"), ValueError, "the weights do not say which", probe=_SILENT38),
    Case("load_pth: the same file of MiniMind2 -> the same message (was 'lm_head.weight differs')",
         _load_pth("MiniMind2"), ValueError, "pass tie_word_embeddings=false to load it untied", probe=_UNCLEAR38),
    Case("load_pth(tie_word_embeddings=True/False) on that file: tied with a warning / untied with its head",
         changed_head_forced_tied, None),
    Case("load_checkpoint(config=tied) of a state dict with its own head -> refused, not silently tied",
         tied_config_with_own_head, ValueError, "would replace the trained head with the embedding"),
    Case("load_hf_dir: config.json tied, the stored head differs -> refused (transformers drops the head)",
         tied_hf_folder_with_own_head, ValueError, "says tie_word_embeddings=true"),
    Case("load_state_dict_strict: a tied model, the state dict's two tied keys differ", strict_load_tied_keys_differ,
         ValueError, "silently drop the other"),
    # ---- items 3-5: GRPO / DPO inputs checked where they enter; masks select, never multiply
    Case("group_advantages: eps=-1 (flipped the advantages' signs)", _grpo_adv(eps=-1), ValueError,
         "eps must be a finite number > 0", probe=_SILENT38),
    Case("group_advantages: eps=0 (NaN for an equal group)", _grpo_adv(eps=0), ValueError, "0 gives nan", probe=_SILENT38),
    Case("group_advantages: clamp=0 (zeroed every advantage)", _grpo_adv(clamp=0), ValueError,
         "0 would zero every advantage", probe=_SILENT38),
    Case("group_advantages: clamp=-1 (set every advantage to -1)", _grpo_adv(clamp=-1), ValueError,
         "clamp must be none (no clamping) or a number > 0", probe=_SILENT38),
    Case("GRPOObjective: advantages={'eps': 0} -> refused at construction, before any rollout",
         lambda tmp: mm.grpo.GRPOObjective(None, None, beta=0, advantages={"eps": 0}), ValueError, "eps must be"),
    Case("grpo_loss: loss_type='cispo', epsilon_high=0 (the policy gradient was exactly 0)",
         _grpo_loss(epsilon_high=0), ValueError, "epsilon_high must be a number > 0", probe=_SILENT38),
    Case("grpo_loss: loss_type='grpo', epsilon=0", _grpo_loss(loss_type="grpo", epsilon=0), ValueError,
         "epsilon must be a number > 0"),
    Case("grpo_loss: completion_mask of 0.5", _grpo_loss(completion_mask=torch.full((2, 3), 0.5)), ValueError,
         "completion_mask must hold 0 and 1 only", probe=_SILENT38),
    Case("grpo_loss: completion_mask of 2", _grpo_loss(completion_mask=torch.full((2, 3), 2.0)), ValueError,
         "completion_mask must hold 0 and 1 only", probe=_SILENT38),
    Case("grpo_loss: completion_mask of -1 (flipped the loss's sign)", _grpo_loss(completion_mask=-torch.ones(2, 3)),
         ValueError, "completion_mask must hold 0 and 1 only", probe=_SILENT38),
    Case("grpo_loss: NaN advantages (passed unchecked)", _grpo_loss(advantages=torch.tensor([float("nan"), 0.0])),
         ValueError, "advantages must be finite", probe=_SILENT38),
    Case("grpo_loss: a NaN reference log-probability where the mask counts -> names the reference",
         _grpo_loss(ref_per_token_logps=torch.tensor([[0.0, float("nan"), 0.0], [0.0, 0.0, 0.0]])), ValueError,
         "the reference model's log-probabilities must be finite"),
    Case("dpo_loss: NaN where the mask is 0 -> the same finite loss and gradient (was NaN)", _masked_bad(float("nan"), "dpo"),
         None, probe=_UNCLEAR38),
    Case("dpo_loss: -inf where the mask is 0 -> the same finite loss and gradient", _masked_bad(float("-inf"), "dpo"),
         None, probe=_UNCLEAR38),
    Case("grpo_loss: NaN where the mask is 0 -> the same finite loss and gradient (was NaN)",
         _masked_bad(float("nan"), "grpo"), None, probe=_UNCLEAR38),
    Case("grpo_loss: -inf where the mask is 0 -> the same finite loss and gradient", _masked_bad(float("-inf"), "grpo"),
         None, probe=_UNCLEAR38),
    Case("train_dpo: a reference NaN where the mask is 0 -> trains (was 'nan ... lower the learning rate')",
         dpo_training_nan_outside_the_mask, None, needs="tokenizers", probe=_UNCLEAR38),
    Case("train_dpo: a reference whose logits are all NaN -> names the reference, not the learning rate",
         dpo_training_nan_reference, ValueError, "this is not the learning rate's doing", needs="tokenizers"),
    # ---- items 6-7: records of long runs; bad --out refused before the first step
    Case("posttrain_experiments --merge <the LoRA sweep record> (was exit 0, runs added, command overwritten)",
         merge_sweep_record, ValueError, "its command is 'python -m minimind_ref.lora sweep", probe=_SILENT38),
    Case("posttrain_experiments --merge keeps the record's command, takes the parts' runs", merge_keeps_command, None),
    Case("posttrain_experiments --out <a folder / under a file> -> usage error before any run (was after minutes)",
         px_out_folder, None, probe=_UNCLEAR38),
    Case("lora sweep --out <a folder>, --seeds 0,x / 1,1 -> usage errors before any run; rank_sweep(out=<folder>)",
         sweep_out_folder, IsADirectoryError, "is a folder", probe=_UNCLEAR38),
    Case("lora.rank_sweep: record written atomically (a full disk keeps the previous record; was open-and-write)",
         sweep_disk_full_keeps_record, OSError, "the disk is full", probe=_SILENT38),
    Case("posttrain_experiments --merge SIGKILLed before its rename -> the previous record whole", record_merge_killed,
         None, slow=True),
    # ---- item 9: old cases that were still silent
    Case("generate: NaN weights (greedy emitted token 0 forever)", generate_nan_weights, FloatingPointError,
         "the model's weights hold nan/inf", probe=_SILENT38),
    Case("generate: logits that turn NaN after the prompt -> caught at the end", generate_nan_later, FloatingPointError,
         "logits are nan/inf during generation"),
    Case("forward: attention_mask of 2s (changed the logits)", _forward(attention_mask=torch.full((2, 5), 2)), ValueError,
         "attention_mask must hold only 1 (token) and 0 (padding)", probe=_SILENT38),
    Case("forward: attention_mask of 0.5", _forward(attention_mask=torch.full((2, 5), 0.5)), ValueError,
         "attention_mask must hold only 1"),
    Case("UpstreamTokenizer.decode([99999]) (returned text)", lambda tmp: _upstream_tokenizer().decode([5, 99999]),
         ValueError, "outside this tokenizer's vocabulary", needs="tokenizers", probe=_SILENT38),
    Case("merge_lora: a square head tied to the embedding -> untied, the embedding unchanged (was: changed)",
         merge_lora_square_tied_head, None, probe=_SILENT38),
    # ---- item 10: files named when they are bad
    Case("load_hf_dir: a corrupt model.safetensors.index.json (bare JSONDecodeError)",
         lambda tmp: _sharded_folder(tmp, '{"weight_map": {"a": "model-0'), ValueError,
         "model.safetensors.index.json is not a valid shard index", needs="safetensors", probe=_UNCLEAR38),
    Case("load_hf_dir: an index naming a shard that is not there",
         lambda tmp: _sharded_folder(tmp, '{"weight_map": {"a": "model-00002-of-00002.safetensors"}}'), FileNotFoundError,
         "an incomplete download", needs="safetensors"),
    Case("tokenizer_config.json corrupt (was 'the other generation's tokenizer')", tokenizer_config_corrupt, ValueError,
         "tokenizer_config.json is not a valid tokenizer_config.json", needs="tokenizers", probe=_UNCLEAR38),
    Case("PackedDataset(stream, 0) (ZeroDivisionError)", _call(lambda: mm.data.PackedDataset(torch.arange(10), 0)),
         ValueError, "seq_len must be an int >= 2", probe=_UNCLEAR38),
    Case("read_text_documents: a Latin-1 file (UnicodeDecodeError without its name)",
         lambda tmp: mm.data.read_text_documents(str(_latin1(tmp, "corpus.txt", "caf\u00e9\n\nna\u00efve"))), ValueError,
         "corpus.txt is not utf-8 text", probe=_UNCLEAR38),
    Case("load_jsonl: a Latin-1 file", lambda tmp: mm.chat_data.load_jsonl(
        str(_latin1(tmp, "d.jsonl", '{"a": "caf\u00e9"}\n'))), ValueError, "d.jsonl is not utf-8 text"),
    Case("TrainConfig.from_json: a Latin-1 file", lambda tmp: __import__("minimind_ref.train").train.TrainConfig.from_json(
        str(_latin1(tmp, "c.json", '{"lr": "caf\u00e9"}'))), ValueError, "c.json is not valid json (utf-8)"),
    Case("forward: a plain tensor as past_key_values ('Boolean value of Tensor ... ambiguous')",
         _forward(past_key_values=torch.zeros(2, 3)), TypeError, "past_key_values must be a list", probe=_UNCLEAR38),
    # ---- our own probe of the surfaces added recently (minimind-3 files, Qwen3 folders, post-training, writers)
    Case("save_checkpoint(model, '') (was 'could not write : No such file')", lambda tmp: mm.save_checkpoint(_model(), ""),
         ValueError, "must be a file name"),
    Case("grpo.completion_mask: a pad_mask of 0.5 (counted as padding-free)", _call(lambda: mm.grpo.completion_mask(
        torch.zeros(2, 3, dtype=torch.long), 2, torch.full((2, 3), 0.5))), ValueError, "pad_mask must hold 0"),
    Case("grpo.completion_mask: eos_token_id='2' (was AttributeError)", _call(lambda: mm.grpo.completion_mask(
        torch.zeros(2, 3, dtype=torch.long), "2")), TypeError, "eos_token_id must be an int"),
    Case("grpo.heldout_accuracy(n=-1) (dropped the last prompt)", _call(lambda: mm.grpo.heldout_accuracy(
        _model(), None, n=-1)), ValueError, "n must be none"),
    Case("train_grpo(n_heldout=-1)", _call(lambda: mm.grpo.train_grpo(tiny_model().train(), None, n_heldout=-1)),
         ValueError, "n_heldout must be none or an int >= 0"),
    Case("chat_data.rl_prompts(-1) (an empty list)", _call(lambda: mm.chat_data.rl_prompts(-1)), ValueError,
         "n must be an int >= 0"),
    Case("dpo.own_reply_pairs(n_prompts=-1) (an empty list)", _call(lambda: mm.dpo.own_reply_pairs(_model(), None, -1)),
         ValueError, "n_prompts must be an int >= 0"),
    Case("dpo.preference_report(beta=0) (margins 0, accuracy 0)", _call(lambda: mm.dpo.preference_report(
        _model(), _model(), None, beta=0)), ValueError, "beta must be a positive finite number"),
    Case("count_parameters('minimind-3') (AttributeError)", _call(lambda: mm.count_parameters("minimind-3")), TypeError,
         "count_parameters(preset('minimind-3'))"),
    Case("load_pth(dtype=torch.int64) (torch's nn.Module.to message)", lambda tmp: __import__(
        "minimind_ref.pretrained").pretrained.load_pth(_tied_pth(tmp), dtype=torch.int64), TypeError,
         "floating-point torch.dtype"),
    Case("load_checkpoint(map_location='gpu7') (a torch storage error)", lambda tmp: mm.load_checkpoint(
        _saved(tmp), map_location="gpu7"), ValueError, "map_location='gpu7' is not a device"),
    Case("load_hf_dir: config.json with tie_word_embeddings \"false\" (a string)", _tie_string_folder, TypeError,
         "tie_word_embeddings must be true or false"),
    Case("posttrain_experiments --merge with run names (the names were ignored)", _px_merge_with_names, None),
    Case("dpo.concat_pairs: masks of 0.5 (entered the batch unchecked)", _call(lambda: mm.dpo.concat_pairs(
        {k: torch.full((1, 4), 0.5) if k.startswith("mask") else torch.zeros(1, 4, dtype=torch.long)
         for k in mm.dpo.DPODataset.KEYS})), ValueError, "must hold 0 and 1 only"),
    Case("grpo.sum_reward(None, '1') (AttributeError)", _call(lambda: mm.grpo.sum_reward(None, "1")), TypeError,
         "reply must be a str"),
    Case("RLPromptDataset: a reference answer that is not a str (AttributeError in the reward, mid-run)",
         _call(lambda: mm.grpo.RLPromptDataset([{"conversations": [{"role": "user", "content": "1+1?"},
                                                                  {"role": "assistant", "content": 2}]}])),
         ValueError, "reference answer (a str)"),
    Case("data.global_batch_indices(n=0) (RuntimeError: ZeroDivisionError)", _call(lambda: mm.data.global_batch_indices(
        0, 4, 0)), ValueError, "the dataset is empty"),
    Case("sample_next_token: NaN logits with sampling (torch's multinomial message)", _call(
        sample_next_token, torch.full((1, 5), float("nan")), torch.zeros(1, 2, dtype=torch.long), True), FloatingPointError,
         "no distribution to sample from"),
]


# ====================================================================== issue 46: reliability, round four
# The rows of the cases issue 46's probe reported (marked with what it found before the fix) and of our own probe of
# the same surfaces: the decoders, the intervals, the SFT mask, the stage set's files, the stages command line and its
# record, and the cases still silent or unclear from earlier rounds. The design choices behind them:
#
# * FastDecoder and GraphDecoder take their arguments through generate's check (generation.check_decoding_request),
#   decode in eval mode as generate does (generation.eval_mode: they switch, they do not refuse), check the first
#   step's logits at once and later ones through a flag read at the end (no token from NaN logits is returned), warn
#   at the position limit, and notice weights changed since they laid them out (fast_decode.WeightsWatch: version
#   counters, storage addresses and a sample of values) and refresh their copy;
# * the stage record goes through one schema check (stage_report.check_seed_record), and the shipped stage files, the
#   tokenizer and the record form one set whose manifest (stage_set.py) is written last and checked at load;
# * stages' command line refuses, before any work, what does not apply, and any combination that would leave the
#   package's record and stage files describing different runs;
# * LoRA files record a sample of their base's weights (lora.base_sample); upstream's files can only be checked
#   for shapes.
_SILENT46 = "disagreed (issue 46: SILENT); fixed, not yet re-probed"
_UNCLEAR46 = "disagreed (issue 46: UNCLEAR); fixed, not yet re-probed"
PROBE_VALUES = PROBE_VALUES + (_SILENT46, _UNCLEAR46)


# ---------------------------------------------------------------------- the decoders
def _decoder(kind: str) -> Any:
    from minimind_ref.fast_decode import FastDecoder
    from minimind_ref.graph_decode import GraphDecoder

    return {"fast": FastDecoder, "graph": GraphDecoder}[kind]


def _decode(kind: str, *args: Any, model: Optional[mm.MiniMindForCausalLM] = None, **kw: Any) -> Callable[[Path], Any]:
    return lambda tmp: _decoder(kind)(model if model is not None else _model()).generate(*args, **kw)


def decoder_nan_weights(kind: str) -> Callable[[Path], Any]:
    def run(tmp: Path) -> None:
        m = tiny_model()
        decoder = _decoder(kind)(m)
        with torch.no_grad():
            m.model.layers[0].mlp.up_proj.weight.fill_(float("nan"))
        decoder.generate(_ids(1, 5), 6)
    return run


def _nan_after_first_token() -> Tuple[mm.MiniMindForCausalLM, torch.Tensor]:
    """An untied model whose embedding row of the first generated token is NaN: the prompt's logits are finite,
    the second step's are not (NaN that first appears mid-decode)."""
    m = tiny_model(seed=6, tie_word_embeddings=False)
    ids = _ids(1, 5)
    first = int(m.generate(ids, max_new_tokens=1)[0, -1])
    assert first not in ids[0].tolist()
    with torch.no_grad():
        m.model.embed_tokens.weight[first].fill_(float("nan"))
    return m, ids


def decoder_nan_later(kind: str) -> Callable[[Path], Any]:
    def run(tmp: Path) -> None:
        m, ids = _nan_after_first_token()
        _decoder(kind)(m).generate(ids, 6)
    return run


def fast_decoder_position_limit(tmp: Path) -> None:
    out = _warned(lambda: _decoder("fast")(_model()).generate(_ids(1, 60), 10), "max_position_embeddings=64")
    assert out.shape == (1, 64)


def decoder_train_mode(kind: str) -> Callable[[Path], Any]:
    def run(tmp: Path) -> None:
        m = tiny_model(seed=7, dropout=0.5).train()
        reference = tiny_model(seed=7, dropout=0.5).eval().generate(_ids(1, 5), max_new_tokens=8)
        decoder = _decoder(kind)(m)
        for _ in range(3):
            assert torch.equal(decoder.generate(_ids(1, 5), 8), reference), "decoded with dropout on"
        assert m.training, "the model's own mode must be put back"
    return run


def decoder_weights_changed(kind: str, how: str) -> Callable[[Path], Any]:
    def run(tmp: Path) -> None:
        m = tiny_model(seed=2)
        decoder = _decoder(kind)(m)
        before = decoder.generate(_ids(1, 5), 8)
        if how == "no_grad":
            with torch.no_grad():
                for p in m.parameters():
                    p.mul_(1.5)
        elif how == "load_state_dict":
            m.load_state_dict(tiny_model(seed=3).state_dict())
        elif how == ".data":
            m.lm_head.weight.data.mul_(-1)  # bypasses autograd's version counter
        elif how == "half":
            m.half()
        elif how == "optimizer":
            opt = torch.optim.SGD(m.parameters(), lr=50.0)  # a step large enough to change the greedy tokens
            m(_ids(1, 5), labels=_ids(1, 5)).loss.backward()
            opt.step()
        after = decoder.generate(_ids(1, 5), 8)
        assert torch.equal(after, m.generate(_ids(1, 5), max_new_tokens=8)), "decoded with the old weights"
        assert not torch.equal(after, before) or how == "half", "the change should change the tokens here"
    return run


# ---------------------------------------------------------------------- the intervals
def _wilson(*args: Any) -> Callable[[Path], Any]:
    from minimind_ref.chat_eval import wilson_interval

    return lambda tmp: wilson_interval(*args)


def _interval(**metrics: Any) -> Callable[[Path], Any]:
    from minimind_ref import stage_report

    base = {"sum_accuracy": 0.5, "sum_n": 200.0, "sum_near_ties": 0.0}
    return lambda tmp: stage_report.metric_interval({**base, **metrics}, "sum_accuracy")


# ---------------------------------------------------------------------- the SFT mask
def _course_markers(newline: bool = True) -> Tuple[List[int], List[int]]:
    from minimind_ref.sft import marker_ids

    return marker_ids(_course_tokenizer(), newline=newline)


def mask_with_c090b69_markers(tmp: Path) -> None:
    from minimind_ref.sft import assistant_loss_mask, encode_chat

    ids = encode_chat(_course_tokenizer(), [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}])
    assistant_loss_mask(ids, *_course_markers(newline=False), len(ids))


def _mask(max_length: Any) -> Callable[[Path], Any]:
    def run(tmp: Path) -> None:
        from minimind_ref.sft import assistant_loss_mask

        assistant_loss_mask([1, 7, 8, 40, 2, 8], [1, 7, 8], [2, 8], max_length)
    return run


# ---------------------------------------------------------------------- the stage set's files
_SHIP_KILL_CHILD = """
import json, os, signal, sys
from pathlib import Path
from unittest import mock
import minimind_ref.files as files
from minimind_ref import stage_set, stages

folder, pristine = Path({folder!r}), Path({pristine!r})
NAMES = [stages.STAGE_INFO[n].file for n in stages.SEEDED_STAGES] + [stages.SEEDS_FILE.name]

def runner(seed, path, save_dir, work, log):  # a lineage whose stage files are stand-ins
    if save_dir is not None:
        os.makedirs(save_dir)
        for name in stages.SEEDED_STAGES:
            Path(save_dir, stages.STAGE_INFO[name].file).write_bytes(f"{{name}} new".encode())
    metrics = {{"sum_accuracy": 0.5, "sum_n": 200.0, "identity_accuracy": 0.5, "identity_n": 22.0,
               "refusal_accuracy": 0.5, "refusal_n": 49.0, "stop_rate": 1.0, "stop_n": 351.0}}
    return {{"seed": seed, "path": path, "capability": "X", "torch": "x", "seconds": 1.0,
            "stages": {{n: {{"metrics": metrics, "seconds": 1.0, "stage_metrics": {{}}}}
                       for n in ("base",) + stages.SEEDED_STAGES}}}}

def ship(kill_at, after):
    calls = [0]
    real = os.replace
    def replace(src, dst):
        calls[0] += 1
        if calls[0] == kill_at and not after:
            os.kill(os.getpid(), signal.SIGKILL)
        real(src, dst)
        if calls[0] == kill_at and after:
            os.kill(os.getpid(), signal.SIGKILL)
    with mock.patch.object(files.os, "replace", replace):
        stages.rebuild_seeds([0], ["native"], ship_seed=0, out=folder / stages.SEEDS_FILE.name, ship_dir=folder,
                             log=lambda s: None, runner=runner)
    return calls[0]

def state():
    old = all((folder / n).read_bytes() == (pristine / n).read_bytes() for n in NAMES)
    new = all((folder / n).read_bytes().endswith(b" new") for n in NAMES[:-1]) and \\
        json.loads((folder / NAMES[-1]).read_text())["command"].endswith("--jobs 1")
    try:
        stage_set.check_set(folder)
        loads = "loads"
    except ValueError as err:
        loads = "refused: " + str(err)[:200]
    return old, new, loads

results = []
points = None
k = 0
while points is None or k < 2 * points:
    for n in os.listdir(folder):
        os.remove(folder / n)
    for n in os.listdir(pristine):
        Path(folder, n).write_bytes((pristine / n).read_bytes())
    pid = os.fork()
    if pid == 0:
        done = ship(k // 2 + 1, k % 2 == 1)
        os._exit(100 + done)  # not killed: the write has fewer replaces than kill_at
    _, status = os.waitpid(pid, 0)
    if os.WIFEXITED(status) and os.WEXITSTATUS(status) >= 100:
        points = os.WEXITSTATUS(status) - 100  # every replace done, nothing killed: this many points
        results.append(("finished",) + state())
        break
    results.append((k,) + state())
    k += 1
print(json.dumps({{"points": points, "results": results}}))
"""


def ship_killed_at_every_point(tmp: Path) -> None:
    """`stages rebuild --seeds` shipping a new set (four stage files and the record) over an old one, SIGKILLed
    before and after each of its renames (every moment a file changes): the folder then holds the old set or the new
    one, which load (stage_set.check_set) accepts, or a mix, which it refuses; never a mix that loads."""
    import minimind_ref.stages as stages
    from minimind_ref import stage_set

    folder, pristine = tmp / "set", tmp / "pristine"
    old = {stages.STAGE_INFO[n].file: f"{n} old".encode() for n in stages.STAGES}
    sources = {}
    for name, data in old.items():
        sources[name] = _write(tmp, name + ".src", data)
    sources[stages.SEEDS_FILE.name] = _write(tmp, "record.src", json.dumps({"command": "old", "version": 2}).encode())
    lineage = {stages.STAGE_INFO[n].file: {"stage": n, "parent": stages.STAGE_INFO[n].parent} for n in stages.STAGES}
    stage_set.write_set(pristine, {k: str(v) for k, v in sources.items()}, lineage)
    folder.mkdir()
    code = _SHIP_KILL_CHILD.format(folder=str(folder), pristine=str(pristine))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-1500:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["points"] and report["points"] >= 6, report  # pending manifest, 4 stage files, record, manifest
    assert len(report["results"]) == 2 * report["points"] + 1
    for point, was_old, was_new, loads in report["results"]:
        if was_old or was_new:
            assert loads == "loads", f"kill point {point}: a whole set was refused: {loads}"
        else:
            assert loads.startswith("refused") and "mixed" in loads, f"kill point {point}: a mixed set {loads}"
    kinds = [(old_, new_) for _, old_, new_, _ in report["results"]]
    assert kinds[0] == (True, False) and kinds[-1] == (False, True), kinds  # killed first: old; not killed: new


def _mode_kept(tmp: Path) -> None:
    from minimind_ref.files import write_text

    path = tmp / "secret.json"
    write_text(path, "{}")
    os.chmod(path, 0o600)
    write_text(path, '{"a": 1}')
    assert oct(os.stat(path).st_mode & 0o777) == "0o600", oct(os.stat(path).st_mode & 0o777)
    mm.save_checkpoint(_model(), tmp / "c.pt")
    os.chmod(tmp / "c.pt", 0o640)
    mm.save_checkpoint(_model(), tmp / "c.pt")
    assert os.stat(tmp / "c.pt").st_mode & 0o777 == 0o640


def _through_link(tmp: Path) -> None:
    from minimind_ref.files import write_text

    (tmp / "real").mkdir()
    target = tmp / "real" / "record.json"
    write_text(target, "old")
    link = tmp / "record.json"
    link.symlink_to(target)
    write_text(link, "new")
    assert link.is_symlink() and target.read_text() == "new" and link.read_text() == "new"
    mm.save_checkpoint(_model(), tmp / "real" / "c.pt")
    (tmp / "c.pt").symlink_to(tmp / "real" / "c.pt")
    mm.save_checkpoint(tiny_model(seed=4), tmp / "c.pt")
    assert (tmp / "c.pt").is_symlink() and _same_weights(mm.load_checkpoint(tmp / "real" / "c.pt"), tiny_model(seed=4))


def _link_loop(tmp: Path) -> None:
    from minimind_ref.files import write_text

    (tmp / "loop").symlink_to(tmp / "loop")
    write_text(tmp / "loop", "x")


def _tiny_set(tmp: Path) -> Path:
    """A folder with a saved sft stage (save_stage writes it with its manifest)."""
    _tiny_stage(tmp)
    return tmp / "sft.pt"


def stage_replaced_by_hand(tmp: Path) -> None:
    """Another, valid, stage file copied over sft.pt (its own digests verify): not the file the set lists."""
    import minimind_ref.stages as stages

    other = tmp / "other"
    _tiny_stage(other, tiny_model(seed=5))
    path = _tiny_set(tmp)
    path.write_bytes((other / "sft.pt").read_bytes())
    with _stage_dir(tmp):
        stages.load_stage("sft")


def stage_manifest_removed(tmp: Path) -> None:
    import minimind_ref.stages as stages

    _tiny_set(tmp)
    (tmp / "manifest.json").unlink()
    with _stage_dir(tmp):
        stages.stage_metadata("sft")


def stage_added_by_hand(tmp: Path) -> None:
    import minimind_ref.stages as stages

    _tiny_set(tmp)
    (tmp / "dpo.pt").write_bytes((tmp / "sft.pt").read_bytes())
    with _stage_dir(tmp):
        stages.stage_metadata("sft")


def shipped_set_loads(tmp: Path) -> None:
    """The package's own files are one whole set, with the lineage of the record's first seed."""
    from minimind_ref import stage_set, stages

    entries = stage_set.check_set(stages.CHECKPOINT_DIR)
    assert set(entries) == set(stage_set.SET_FILES), sorted(entries)
    assert not stage_set.stale_lineage(entries)
    ship = stages.load_seed_records()["ship"]
    for name in stages.SEEDED_STAGES:
        entry = entries[stages.STAGE_INFO[name].file]
        assert (entry["seed"], entry["float_path"]) == (ship["seed"], ship["path"]), (name, entry)


# ---------------------------------------------------------------------- the command line
def _no_rebuild() -> Any:
    """Any rebuild the command starts fails the row: the refusal must come first."""
    import contextlib

    import minimind_ref.stages as stages

    def refuse(*a: Any, **k: Any) -> None:
        raise AssertionError("a rebuild started before the bad arguments were refused")

    stack = contextlib.ExitStack()
    for name in ("rebuild", "rebuild_seeds", "load_stage"):
        stack.enter_context(mock.patch.object(stages, name, refuse))
    return stack


def _stages_usage(args: List[str], fragment: str) -> Callable[[Path], Any]:
    def run(tmp: Path) -> None:
        import minimind_ref.stages as stages

        with _no_rebuild():
            _usage_error(lambda: stages.main([a.replace("{tmp}", str(tmp)) for a in args]), fragment)
    return run


def _record_file(tmp: Path, edit: Callable[[dict], Any]) -> Path:
    from minimind_ref import stages

    record = json.loads(stages.SEEDS_FILE.read_text(encoding="utf-8"))
    edit(record)
    path = tmp / "record.json"
    path.write_text(json.dumps(record), encoding="utf-8")
    return path


def _load_record(edit: Callable[[dict], Any]) -> Callable[[Path], Any]:
    from minimind_ref import stage_report

    return lambda tmp: stage_report.load_seed_records(_record_file(tmp, edit))


def _set_metric(stage: str, metric: str, value: Any, seed: str = "2", path: str = "default") -> Callable[[dict], Any]:
    def edit(record: dict) -> None:
        record["stages"][stage][seed][path]["metrics"][metric] = value
    return edit


def _old_shape(record: dict) -> None:
    """A version-1 record (stage -> seed -> run) labelled version 2."""
    for stage, runs in record["stages"].items():
        record["stages"][stage] = {seed: per_path["native"] for seed, per_path in runs.items()}


def _header_lists_more(record: dict) -> None:
    record["seeds"] = list(range(10))


def _one_seed_missing(record: dict) -> None:
    del record["stages"]["grpo"]["3"]


def _command_on_record(command: str, edit: Callable[[dict], Any], fragment: str) -> Callable[[Path], Any]:
    """`stages claims` / `stages report` on an edited record: one usage line naming the problem (no traceback, no
    claim printed 21 times)."""
    def run(tmp: Path) -> None:
        import minimind_ref.stages as stages

        path = _record_file(tmp, edit)
        out = io.StringIO()
        with mock.patch("sys.stdout", out):
            _usage_error(lambda: stages.main([command, "--seeds-file", str(path)]), fragment)
        assert out.getvalue() == "", f"printed before refusing: {out.getvalue()[:300]}"
    return run


# ---------------------------------------------------------------------- earlier silent cases
def nan_q_proj_sdpa(tmp: Path) -> None:
    """NaN in q_proj: the CPU's fused attention returned zeros for the NaN rows, so the logits stayed finite."""
    m = tiny_model()
    assert m.config.flash_attn
    with torch.no_grad():
        m.model.layers[0].self_attn.q_proj.weight[0, 0] = float("nan")
    assert not bool(torch.isfinite(m(_ids()).logits).any(dim=-1).all()), "NaN weights gave finite logits"
    m.generate(_ids(), max_new_tokens=3)


def course_decode_outside(tmp: Path) -> None:
    from minimind_ref.tokenizer import load_tokenizer
    from minimind_ref.stage_registry import TOKENIZER_FILE

    load_tokenizer(TOKENIZER_FILE).decode([5, 99999])


def lora_other_base(tmp: Path) -> None:
    """An adapter trained on one model loaded into another model of the same shapes (other weights)."""
    from minimind_ref.lora import apply_lora, load_lora, save_lora

    save_lora(_adapted(), tmp / "a.pth")  # adapters on tiny_model(seed=0)
    model = apply_lora(tiny_model(seed=1), rank=4)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    try:
        load_lora(model, tmp / "a.pth")
    finally:
        assert _same_weights_dict(model.state_dict(), before), "a refused adapter changed the model"


def lora_same_base_other_dtype(tmp: Path) -> None:
    """The same base in float16 loads; in bfloat16 the record (float16 values) differs by more than rounding, so
    it is refused naming check_base=False, which loads it."""
    from minimind_ref.lora import apply_lora, load_lora, save_lora

    save_lora(_adapted(), tmp / "a.pth")
    load_lora(apply_lora(tiny_model().half(), rank=4), tmp / "a.pth")
    bf16 = apply_lora(tiny_model().bfloat16(), rank=4)
    try:
        load_lora(bf16, tmp / "a.pth")
    except ValueError as err:
        assert "check_base=false" in str(err).lower(), str(err)
    load_lora(bf16, tmp / "a.pth", check_base=False)


def lora_upstream_file_loads(tmp: Path) -> None:
    """Upstream's format (no record of the base): loads, checked for shapes only."""
    from minimind_ref.lora import apply_lora, load_lora, save_lora

    save_lora(_adapted(), tmp / "a.pth")
    blob = torch.load(tmp / "a.pth", weights_only=True)
    del blob["lora_base_sample"]
    torch.save(blob, tmp / "a.pth")
    load_lora(apply_lora(tiny_model(seed=1), rank=4), tmp / "a.pth")


def _dpo_pair(chosen_user: str, rejected_user: str, system: Optional[str] = None) -> Callable[[Path], Any]:
    def run(tmp: Path) -> None:
        head = [{"role": "system", "content": system}] if system else []
        record = {"chosen": head + [{"role": "user", "content": chosen_user}, {"role": "assistant", "content": "4"}],
                  "rejected": [{"role": "user", "content": rejected_user}, {"role": "assistant", "content": "5"}]}
        mm.dpo.DPODataset([record], _course_tokenizer())
    return run


# ---------------------------------------------------------------------- unclear -> clear
def _moe_folder(tmp: Path, drop: Tuple[str, ...] = (), edit: Optional[Callable[[dict], dict]] = None) -> Path:
    import shutil

    src = Path(__file__).parent / "data" / "upstream_minimind3_files" / "minimind-3-moe-tiny"
    dest = tmp / "moe"
    shutil.copytree(src, dest)
    raw = json.loads((dest / "config.json").read_text())
    for key in drop:
        raw.pop(key, None)
    (dest / "config.json").write_text(json.dumps(raw))
    if edit is not None:
        from safetensors.torch import load_file, save_file

        state = edit(load_file(str(dest / "model.safetensors")))
        save_file({k: v.contiguous() for k, v in state.items()}, str(dest / "model.safetensors"))
    return dest


def _load_moe(**kw: Any) -> Callable[[Path], Any]:
    from minimind_ref.pretrained import load_hf_dir

    return lambda tmp: load_hf_dir(_moe_folder(tmp, **kw))


def _fused(change: Callable[[str, torch.Tensor], torch.Tensor]) -> Callable[[dict], dict]:
    from minimind_ref.hf import fuse_experts

    return lambda state: {k: change(k, v) for k, v in fuse_experts(state).items()}


def _rehearsal(objective: Callable[..., Any], dataset: Any = None) -> Callable[[Path], Any]:
    def run(tmp: Path) -> None:
        data = dataset if dataset is not None else mm.sft.SFTDataset([_chat("hi", "ok")] * 4, _course_tokenizer(), 32)
        step = mm.grpo.Rehearsal(objective, data, batch_size=2)
        step(tiny_model(vocab_size=512), None)
    return run


ROUND4_CASES: List[Case] = [
    # ---- the decoders go through generate's checks
    Case("GraphDecoder: NaN weights (was one token, then token 0 forever)", decoder_nan_weights("graph"),
         FloatingPointError, "the model's weights hold nan/inf", probe=_SILENT46),
    Case("FastDecoder: NaN weights (was one token, then token 0 forever)", decoder_nan_weights("fast"),
         FloatingPointError, "the model's weights hold nan/inf", probe=_SILENT46),
    Case("GraphDecoder: NaN that first appears mid-decode", decoder_nan_later("graph"), FloatingPointError,
         "logits are nan/inf during generation", probe=_SILENT46),
    Case("FastDecoder: NaN that first appears mid-decode", decoder_nan_later("fast"), FloatingPointError,
         "logits are nan/inf during generation", probe=_SILENT46),
    Case("FastDecoder: max_new_tokens=-1 (returned the prompt)", _decode("fast", _ids(1, 5), -1), ValueError,
         "max_new_tokens must be an int >= 0", probe=_SILENT46),
    Case("FastDecoder: max_new_tokens=True (one token)", _decode("fast", _ids(1, 5), True), TypeError,
         "max_new_tokens must be an int >= 0", probe=_SILENT46),
    Case("FastDecoder: the position limit warns, as generate and GraphDecoder do", fast_decoder_position_limit, None,
         probe=_SILENT46),
    Case("FastDecoder: eos_token_id outside the vocabulary (ignored)", _decode("fast", _ids(1, 5), 4, eos_token_id=999),
         ValueError, "eos_token_id=999 is not a token id", probe=_SILENT46),
    Case("FastDecoder: eos_token_id=[5] (never stopped)", _decode("fast", _ids(1, 5), 4, eos_token_id=[5]), TypeError,
         "the decoders stop on one end token", probe=_SILENT46),
    Case("GraphDecoder: eos_token_id=[5], as generate refuses it", _decode("graph", _ids(1, 5), 4, eos_token_id=[5]),
         TypeError, "the decoders stop on one end token"),
    Case("generate: eos_token_id=[5], as the decoders refuse it", lambda tmp: _model().generate(
        _ids(1, 5), max_new_tokens=4, eos_token_id=[5]), TypeError, "the decoders stop on one end token"),
    Case("FastDecoder: a model in train mode decodes with dropout off (was dropout on), its mode kept",
         decoder_train_mode("fast"), None, probe=_SILENT46),
    Case("GraphDecoder: a model in train mode decodes with dropout off, its mode kept", decoder_train_mode("graph"), None),
    Case("FastDecoder: weights changed in place under no_grad -> the new weights (was the old copy)",
         decoder_weights_changed("fast", "no_grad"), None, probe=_SILENT46),
    Case("GraphDecoder: weights changed in place under no_grad -> the new weights (was the old copy)",
         decoder_weights_changed("graph", "no_grad"), None, probe=_SILENT46),
    Case("FastDecoder: load_state_dict after building -> the new weights", decoder_weights_changed("fast", "load_state_dict"),
         None),
    Case("GraphDecoder: an optimizer step after building -> the new weights", decoder_weights_changed("graph", "optimizer"),
         None),
    Case("FastDecoder: an edit through .data (no version bump) -> the new weights", decoder_weights_changed("fast", ".data"),
         None),
    Case("GraphDecoder: model.half() after building -> laid out again", decoder_weights_changed("graph", "half"), None),
    Case("FastDecoder: float input_ids", _decode("fast", torch.ones(1, 3), 2), TypeError, "integer token ids"),
    Case("FastDecoder: a batch of 2", _decode("fast", _ids(2, 5), 2), ValueError, "decodes one sequence"),
    Case("FastDecoder: an MoE model", lambda tmp: _decoder("fast")(tiny_model(use_moe=True)), ValueError,
         "dense models only"),
    Case("FastDecoder: not a MiniMindForCausalLM", lambda tmp: _decoder("fast")(torch.nn.Linear(2, 2)), TypeError,
         "minimind_ref minimindforcausallm"),
    # ---- the intervals
    Case("wilson_interval: a NaN count (was (0, 1))", _wilson(float("nan"), 10), ValueError, "successes must be finite",
         probe=_SILENT46),
    Case("wilson_interval: n = inf (was (0, 0))", _wilson(3, float("inf")), ValueError, "n must be finite",
         probe=_SILENT46),
    Case("wilson_interval: z < 0 (was lower > upper)", _wilson(3, 10, -1.96), ValueError, "z must be > 0",
         probe=_SILENT46),
    Case("wilson_interval: n = 2.5", _wilson(1, 2.5), ValueError, "n must be a whole number"),
    Case("wilson_interval: successes=True", _wilson(True, 10), TypeError, "successes must be a number"),
    Case("metric_interval: negative near ties (narrowed 0.24-0.76 to 0.49-0.51)", _interval(sum_near_ties=-50.0),
         ValueError, "near ties are a whole number between 0", probe=_SILENT46),
    Case("metric_interval: near ties above the count", _interval(sum_near_ties=500.0), ValueError,
         "near ties are a whole number between 0"),
    Case("metric_interval: a count of 0", _interval(sum_n=0.0), ValueError, "a share needs its count sum_n > 0"),
    # ---- the SFT mask
    Case("assistant_loss_mask: c090b69's markers (shifted every supervised token)", mask_with_c090b69_markers,
         ValueError, "c090b69's markers", needs="tokenizers", probe=_SILENT46),
    Case("assistant_loss_mask: max_length=0 (an all-zero mask)", _mask(0), ValueError,
         "max_length must be a whole number >= 1", probe=_SILENT46),
    Case("assistant_loss_mask: max_length=-5 (an all-zero mask)", _mask(-5), ValueError,
         "max_length must be a whole number >= 1", probe=_SILENT46),
    Case("upstream_loss_mask: d65ef2c's rule (the default) with c090b69's markers", _call(
        lambda: mm.sft.upstream_loss_mask([1, 7, 40, 2], [1, 7], [2], 10)), ValueError, "the other commit's"),
    Case("assistant_loss_mask: markers given as text", _call(lambda: mm.sft.assistant_loss_mask(
        [1, 7, 8, 40, 2, 8], "abc", "de", 10)), TypeError, "must be token ids"),
    # ---- the stage set's files
    Case("stages rebuild --seeds shipping a set SIGKILLed before and after every rename -> old set or new set loads, "
         "a mix is refused (was: a new sft.pt beside the old lora/dpo/grpo, loaded)", ship_killed_at_every_point, None,
         slow=True, probe=_SILENT46),
    Case("atomic write keeps a file's mode (0600 became 0644)", _mode_kept, None, probe=_SILENT46),
    Case("atomic write through a symlink writes its target (the link became a file)", _through_link, None,
         probe=_SILENT46),
    Case("atomic write to a symlink loop", _link_loop, OSError, "leads back to itself"),
    Case("load_stage: another valid stage file copied over sft.pt", stage_replaced_by_hand, ValueError,
         "is not the file the stage set's manifest.json lists"),
    Case("stage_metadata: the set's manifest deleted", stage_manifest_removed, ValueError, "but no manifest.json"),
    Case("stage_metadata: a stage file added by hand beside the set", stage_added_by_hand, ValueError,
         "not in the stage set's manifest.json"),
    Case("the shipped files are one whole set, with the record's first seed as lineage", shipped_set_loads, None),
    # ---- the command line refuses what does not apply, before any work
    Case("stages rebuild lora --seeds 0 (rebuilt all four, replaced the record)", _stages_usage(
        ["rebuild", "lora", "--seeds", "0"], "takes no stage names"), None, probe=_SILENT46),
    Case("stages rebuild nope --seeds 0 (the name ignored)", _stages_usage(["rebuild", "nope", "--seeds", "0"],
                                                                           "takes no stage names"), None, probe=_SILENT46),
    Case("stages rebuild nope", _stages_usage(["rebuild", "nope"], "unknown stage 'nope'"), None),
    Case("stages rebuild --out x.json without --seeds (ignored, the package's sft.pt overwritten)",
         _stages_usage(["rebuild", "--out", "{tmp}/x.json"], "applies only with --seeds"), None, probe=_SILENT46),
    Case("stages rebuild --paths default without --seeds (ignored)", _stages_usage(["rebuild", "--paths", "default"],
                                                                                  "applies only with --seeds"), None,
         probe=_SILENT46),
    Case("stages rebuild --jobs 2 without --seeds (ignored)", _stages_usage(["rebuild", "--jobs", "2"],
                                                                          "applies only with --seeds"), None,
         probe=_SILENT46),
    Case("stages rebuild --no-ship without --seeds (ignored, the package's sft.pt overwritten)",
         _stages_usage(["rebuild", "--no-ship"], "applies only with --seeds"), None, probe=_SILENT46),
    Case("stages rebuild sft sft", _stages_usage(["rebuild", "sft", "sft"], "each stage once"), None),
    Case("stages rebuild --seeds 0 --no-ship without --out (would replace the package's record only)",
         _stages_usage(["rebuild", "--seeds", "0", "--no-ship"], "give --out"), None),
    Case("stages rebuild --seeds 0 --out x.json (the stage files into the package, the record elsewhere)",
         _stages_usage(["rebuild", "--seeds", "0", "--out", "{tmp}/x.json"], "give --ship-dir"), None),
    Case("stages rebuild --seeds 0 --ship-dir d (the package's record for files elsewhere)",
         _stages_usage(["rebuild", "--seeds", "0", "--ship-dir", "{tmp}"], "give --out too"), None),
    Case("stages rebuild --seeds 0 --paths native,", _stages_usage(["rebuild", "--seeds", "0", "--paths", "native,"],
                                                                   "comma-separated float paths"), None),
    Case("stages lineage --seed -1", _stages_usage(["lineage", "--seed", "-1", "--result", "{tmp}/r.json"],
                                                   "whole number >= 0"), None),
    Case("stages report --recorded --evaluate (one of them ignored)", _stages_usage(
        ["report", "--recorded", "--evaluate"], "choose one"), None, probe=_SILENT46),
    Case("stages report --recorded --figure f.png (the figure silently not drawn)", _stages_usage(
        ["report", "--recorded", "--figure", "{tmp}/f.png"], "--figure belongs to the report from the seed record"), None),
    # ---- the record through one schema check
    Case("seed record: sum_n 0 (rendered, changed a mark)", _load_record(_set_metric("dpo", "sum_n", 0.0)), ValueError,
         "a share needs its count sum_n > 0", probe=_SILENT46),
    Case("seed record: the header lists seeds 0-9, runs for 0-4 ('21 of 21 claims hold over 10 seeds')",
         _load_record(_header_lists_more), ValueError, "no runs for 5, 6, 7, 8, 9", probe=_SILENT46),
    Case("seed record: one seed of a stage missing (still 'over 5 seeds')", _load_record(_one_seed_missing), ValueError,
         "stage 'grpo' has runs for seeds 0, 1, 2, 4", probe=_SILENT46),
    Case("stages claims: a v2-labelled record in the old shape (was 'min() arg is an empty sequence' x 21)",
         _command_on_record("claims", _old_shape, "in the old shape (version 1"), None, probe=_UNCLEAR46),
    Case("stages report: a v2-labelled record in the old shape (was ZeroDivisionError)",
         _command_on_record("report", _old_shape, "in the old shape (version 1"), None, probe=_UNCLEAR46),
    Case("seed record: a hand-edited NaN share (was 'cannot convert float NaN to integer')",
         _load_record(_set_metric("lora", "sum_accuracy", float("nan"))), ValueError,
         "stage 'lora', seed 2, path 'default', metric 'sum_accuracy' is nan", probe=_UNCLEAR46),
    Case("seed record: a hand-edited Infinity", _load_record(_set_metric("dpo", "stop_rate", float("inf"))), ValueError,
         "stage 'dpo', seed 2, path 'default', metric 'stop_rate' is infinity", probe=_UNCLEAR46),
    Case("seed record: a hand-edited null", _load_record(_set_metric("sft", "refusal_accuracy", None)), ValueError,
         "metric 'refusal_accuracy' is null, not a number", probe=_UNCLEAR46),
    Case("seed record: a share of 1.5 (was 'need 0 <= successes <= n')",
         _load_record(_set_metric("grpo", "identity_accuracy", 1.5)), ValueError,
         "metric 'identity_accuracy' is 1.5, a share outside [0, 1]", probe=_UNCLEAR46),
    Case("stages claims: a hand-edited NaN names the file, stage and metric in one line",
         _command_on_record("claims", _set_metric("lora", "sum_accuracy", float("nan")), "metric 'sum_accuracy' is NaN"),
         None),
    Case("seed record: a near-tie count of -1", _load_record(_set_metric("sft", "sum_near_ties", -1.0)), ValueError,
         "near ties are a whole number between 0"),
    Case("seed record: a run's seconds -3", _load_record(lambda r: r["stages"]["base"]["0"]["native"].update(seconds=-3)),
         ValueError, "'seconds' must be a finite number >= 0"),
    Case("seed record: an unknown stage", _load_record(lambda r: r["stages"].update(ppo=r["stages"]["dpo"])), ValueError,
         "unknown stage 'ppo'"),
    Case("seed record: ship names a seed the header lacks", _load_record(lambda r: r.update(ship={"seed": 9, "path": "native"})),
         ValueError, "'ship' must name the seed and float path"),
    Case("seed record: the seeds header as strings", _load_record(lambda r: r.update(seeds=["0", "1"])), ValueError,
         "the header's 'seeds' must be a list of distinct whole numbers"),
    Case("stage_effect: a record dict with a NaN, passed directly", lambda tmp: mm.stages.stage_effect(
        "dpo", "sum_accuracy", json.loads(_record_file(tmp, _set_metric("dpo", "sum_accuracy", float("nan"))).read_text())),
         ValueError, "metric 'sum_accuracy' is nan"),
    # ---- still silent from earlier rounds
    Case("forward: NaN in q_proj on the CPU SDPA path (logits stayed finite)", nan_q_proj_sdpa, FloatingPointError,
         "the model's weights hold nan/inf", probe=_SILENT46),
    Case("course tokenizer: decode([5, 99999]) (returned text)", course_decode_outside, ValueError,
         "outside this tokenizer's vocabulary", needs="tokenizers", probe=_SILENT46),
    Case("course tokenizer: decode of a 2-D list", lambda tmp: __import__("minimind_ref.tokenizer").tokenizer.load_tokenizer(
        __import__("minimind_ref.stage_registry").stage_registry.TOKENIZER_FILE).decode([[1, 2]]), TypeError,
         "token ids must be ints", needs="tokenizers"),
    Case("load_lora: an adapter trained on another base model (loaded)", lora_other_base, ValueError,
         "was trained on another base model", probe=_SILENT46),
    Case("load_lora: the same base in float16 loads; in bfloat16 it names check_base=False", lora_same_base_other_dtype,
         None),
    Case("load_lora: upstream's format (no record of the base) loads, shapes checked", lora_upstream_file_loads, None),
    Case("DPODataset: chosen and rejected with different prompts (trained on)", _dpo_pair("2+2?", "3+3?"), ValueError,
         "have different prompts", needs="tokenizers", probe=_SILENT46),
    Case("DPODataset: a system message on one side only", _dpo_pair("2+2?", "2+2?", system="be brief"), ValueError,
         "have different prompts", needs="tokenizers"),
    # ---- unclear -> clear
    Case("load_hf_dir: a Qwen3-MoE folder with no expert count (took 128, then 744 missing keys)",
         _load_moe(drop=("num_experts", "num_local_experts")), ValueError, "add \"num_experts\": 4", needs="safetensors",
         probe=_UNCLEAR46),
    Case("load_hf_dir: fused experts of another count (named per-expert keys the file lacks)",
         _load_moe(edit=_fused(lambda k, v: v[:3] if k.endswith(("gate_up_proj", "down_proj")) and ".experts." in k else v)),
         ValueError, "it holds 3 experts, the config 4", needs="safetensors", probe=_UNCLEAR46),
    Case("load_hf_dir: fused experts transposed (named per-expert keys the file lacks)",
         _load_moe(edit=_fused(lambda k, v: v.transpose(1, 2) if k.endswith("experts.gate_up_proj") else v)), ValueError,
         "its last two dimensions are swapped", needs="safetensors", probe=_UNCLEAR46),
    Case("grpo.Rehearsal: an objective without 'loss' (a bare KeyError)", _rehearsal(lambda m, b: {"value": 1.0}),
         TypeError, "must return a dict with 'loss'", needs="tokenizers", probe=_UNCLEAR46),
    Case("grpo.Rehearsal: a list as its dataset ('list' object has no attribute 'batch' at the first call)",
         _rehearsal(lambda m, b: {"loss": torch.tensor(0.0)}, dataset=[{"conversations": []}]), TypeError,
         "wrap the conversations in an sftdataset", probe=_UNCLEAR46),
]

TABLE: List[Case] = CASES + TRAIN_CASES + ROUND2_CASES + ROUND3_CASES + ROUND4_CASES

CLEAR, HANDLED, CRYPTIC, SILENT = "clear error", "handled correctly", "cryptic error", "silent"


def classify(case: Case, tmp: Path) -> Tuple[str, str]:
    """``(kind, detail)`` for one row, ``kind`` one of the four the issue counts."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # rows that expect a warning check it themselves
            case.call(tmp)
    except AssertionError as err:
        if case.error is AssertionError:
            pass
        else:
            return SILENT, f"wrong result: {err}"
    except BaseException as err:  # noqa: BLE001 - classify every outcome
        if isinstance(err, (KeyboardInterrupt, SystemExit)):
            raise
        text = f"{type(err).__name__}: {err}"
        if case.error is None:
            return CRYPTIC, f"should work, raised {text}"
        if not isinstance(err, case.error):
            return CRYPTIC, f"expected {case.error.__name__}, got {text}"
        message = str(err).lower()
        if case.fragment not in message or "weights_only=false" in message.replace(" ", ""):
            return CRYPTIC, f"message lacks {case.fragment!r}: {text}"
        return CLEAR, text
    if case.error is None:
        return HANDLED, "ok"
    return SILENT, f"expected {case.error.__name__}, nothing raised"


def _params() -> list:
    out = []
    for case in TABLE:
        marks = [pytest.mark.slow] if case.slow else []
        if case.needs and importlib.util.find_spec(case.needs) is None:
            marks.append(pytest.mark.skip(reason=f"needs {case.needs}"))
        out.append(pytest.param(case, id=case.label, marks=marks))
    return out


@pytest.mark.parametrize("case", _params())
def test_bad_input(case: Case, tmp_path: Path) -> None:
    kind, detail = classify(case, tmp_path)
    expected = HANDLED if case.error is None else CLEAR
    assert kind == expected, f"{case.label}: {kind}: {detail}"


def test_table_rows_are_well_formed() -> None:
    labels = [c.label for c in TABLE]
    assert len(labels) == len(set(labels)), "labels must be unique"
    for c in TABLE:
        assert callable(c.call), c.label
        assert c.error is None or (isinstance(c.error, type) and issubclass(c.error, BaseException)), c.label
        assert (c.error is None) == (c.fragment == ""), f"{c.label}: an error row needs a fragment, a working row none"
        assert c.fragment == c.fragment.lower(), f"{c.label}: fragments are matched in lower case"
        assert c.probe in PROBE_VALUES, f"{c.label}: the probe column takes one of {PROBE_VALUES}"
    # the cases issue 38's probe reported (items 1-5, 6-7, 9 and 10 but the HF round trip and Qwen3 fields) have rows
    reported = [c for c in TABLE if c.probe in (_SILENT38, _UNCLEAR38)]
    assert len(reported) == 30, len(reported)
    # issue 46's cases (its 17 SILENT and 10 UNCLEAR, some counted as several rows here: one per option or value)
    reported = [c for c in TABLE if c.probe in (_SILENT46, _UNCLEAR46)]
    assert len(reported) == 47, len(reported)


def test_the_checkpoint_is_a_drop_in_for_the_old_format(tmp_path: Path) -> None:
    """Files written before the atomic save (a plain torch.save of the same dict) still load."""
    m = _model()
    blob = {"format": "minimind_ref", "config": m.config.to_dict(), "state_dict": m.state_dict(), "extra": {}}
    torch.save(blob, tmp_path / "old.pt")
    assert _same_weights(mm.load_checkpoint(tmp_path / "old.pt"), m)


def report(cases: List[Case] = TABLE) -> collections.Counter:
    """Print every row's kind and the counts (the issue's four kinds)."""
    counts: collections.Counter = collections.Counter()
    for case in cases:
        if case.needs and importlib.util.find_spec(case.needs) is None:
            kind, detail = "skipped", f"needs {case.needs}"
        else:
            with tempfile.TemporaryDirectory() as tmp:
                kind, detail = classify(case, Path(tmp))
        counts[kind] += 1
        probe = "" if case.probe == NOT_PROBED else f"  [probe: {case.probe}]"
        print(f"{kind:<18} {case.label}{probe}" + ("" if kind in (CLEAR, HANDLED) else f"\n{'':<18} -> {detail[:300]}"))
    print(dict(counts), f"({sum(counts.values())} cases, minimind_ref from {Path(mm.__file__).parent})")
    print("probe column:", dict(collections.Counter(c.probe for c in cases)))
    return counts


def markdown(cases: List[Case] = TABLE) -> str:
    """The table as markdown (case, what it must do, whether an independent probe agrees), without running it:
    ``python tests/test_bad_input.py --markdown``."""
    lines = ["| case | must | independent probe |", "| --- | --- | --- |"]
    for case in cases:
        must = "work" if case.error is None else f"{case.error.__name__} ({case.fragment!r})"
        cells = (case.label, must, case.probe)
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    if sys.argv[1:] == ["--markdown"]:
        print(markdown(), end="")
    else:
        report()
