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

Run ``python tests/test_bad_input.py`` for the counts (``PYTHONPATH=<other checkout>`` to count
another version of minimind_ref).
"""

from __future__ import annotations

import collections
import functools
import importlib.util
import io
import os
import signal
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any, Callable, List, NamedTuple, Optional, Tuple
from unittest import mock

import numpy as np
import pytest
import torch

import minimind_ref as mm
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


def train_batch_without_targets(tmp: Path) -> None:
    """Every label -100 (an SFT batch whose answers were truncated away): the step is skipped and counted."""
    from minimind_ref.train import RunData, build_model, train

    class NoTargets:
        def __init__(self, base):
            self.base = base

        def __len__(self):
            return len(self.base)

        def batch(self, idx):
            x, _ = self.base.batch(idx)
            return x, torch.full_like(x, -100)

    data = _tiny_data()
    model = build_model(_tiny_cfg(), data.tokenizer.get_vocab_size())
    before = {k: v.clone() for k, v in model.state_dict().items()}
    res = train(_tiny_cfg(max_steps=2, eval_every=0), model=model, data=RunData(data.tokenizer, NoTargets(data.train)),
                log=lambda s: None)
    assert res.history["skipped"] == [1.0, 1.0], res.history["skipped"]
    assert all(torch.equal(before[k], v) for k, v in res.model.state_dict().items()), "weights changed"


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
    Case("train: a batch without supervised tokens is skipped", train_batch_without_targets, None),
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

TABLE: List[Case] = CASES + TRAIN_CASES

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
        print(f"{kind:<18} {case.label}" + ("" if kind in (CLEAR, HANDLED) else f"\n{'':<18} -> {detail[:300]}"))
    print(dict(counts), f"({sum(counts.values())} cases, minimind_ref from {Path(mm.__file__).parent})")
    return counts


if __name__ == "__main__":
    report()
